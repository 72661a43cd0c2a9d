// fusion-jit fuzz: a differential fuzzing campaign (src/fuzz/fuzzer.h).
#include <c10/util/Exception.h>
#include <sys/stat.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/cli.h"
#include "fusion_jit/cache.h"
#include "fuzz/fuzzer.h"
#include "support/parse.h"

namespace fusion_jit::cli {

namespace {

int run(const FuzzArgs& a) {
  fuzz::Options opt;
  opt.cli = a.program;
  opt.max_graphs = -1;
  if (!a.graphs.empty()) opt.max_graphs = parse_int("--graphs", a.graphs, 1);
  if (!a.minutes.empty()) opt.max_seconds = 60.0 * static_cast<double>(parse_int("--minutes", a.minutes, 1));
  if (!a.seed.empty()) opt.seed = static_cast<uint64_t>(parse_int("--seed", a.seed, 0));
  if (!a.batch.empty()) opt.batch = static_cast<int>(parse_int("--batch", a.batch, 1, std::numeric_limits<int>::max()));
  opt.repro_dir = a.out;
  opt.check.nvrtc_arch = a.nvrtc;
  opt.second_size = a.second_size;
  if (!a.graph_seeds.empty()) {
    const std::string& list = a.graph_seeds;
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = std::min(list.find(',', start), list.size());
      std::string item = list.substr(start, end - start);
      uint64_t v = 0;
      ParseStatus st = parse_uint64(item, &v);
      if (st == ParseStatus::kMalformed) usage_error("--graph-seeds: '" + item + "' is not a graph seed");
      if (st == ParseStatus::kOutOfRange) usage_error("--graph-seeds: '" + item + "' is too large for a graph seed");
      opt.graph_seeds.push_back(v);
      start = end + 1;
    }
  }
  if (!a.device.empty()) {
    if (a.device != "cpu" && a.device != "cuda") usage_error("--device " + a.device + ": fuzz runs on cpu or cuda");
    opt.check.cuda = a.device == "cuda";
  }
  if (opt.max_graphs < 0)
    opt.max_graphs = opt.max_seconds > 0 || !opt.graph_seeds.empty() ? std::numeric_limits<int64_t>::max() : 2000;
  if (opt.repro_dir.empty()) opt.repro_dir = "fuzz-repros";
  if (!opt.check.nvrtc_arch.empty()) {
    const CudaStatus cuda = cuda_status();
    if (!cuda.nvrtc) usage_error("--nvrtc: " + cuda.nvrtc_problem);
    check_cuda_arch(opt.check.nvrtc_arch);
  }
  if (opt.check.cuda) {
    const CudaStatus cuda = cuda_status();
    if (!cuda.driver) usage_error("--device cuda: " + cuda.driver_problem);
    if (cuda.devices == 0) usage_error("--device cuda: torch sees no CUDA device");
  }
  make_output_dir("--out", opt.repro_dir);
  torch::jit::setGraphExecutorOptimize(false);
  std::fprintf(stderr, "fuzzing: seed %llu, %s, repros in %s\n", static_cast<unsigned long long>(opt.seed),
               opt.max_seconds > 0 ? (std::to_string(static_cast<int>(opt.max_seconds / 60)) + " minutes").c_str()
                                   : (std::to_string(opt.max_graphs) + " graphs").c_str(),
               opt.repro_dir.c_str());
  auto rep = fuzz::run(opt, [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); });
  std::printf("%lld graphs (%lld ops) in %.1f s, %.1f ms per graph; %zu failures%s\n",
              static_cast<long long>(rep.graphs), static_cast<long long>(rep.ops), rep.seconds,
              rep.graphs ? 1e3 * rep.seconds / static_cast<double>(rep.graphs) : 0.0, rep.failures.size(),
              rep.failures.empty() ? "" : (", repros in " + opt.repro_dir).c_str());
  if (opt.second_size) {
    std::printf("second sizes: %lld batches, %lld of them checked there without a compiler run\n",
                static_cast<long long>(rep.second_batches), static_cast<long long>(rep.second_shared));
    std::printf("shape classes: %lld graphs through a plan of their class at both sizes (%lld batches whole); %lld "
                "batches whose second size fails a guard of the class%s%s; %lld not generalized\n",
                static_cast<long long>(rep.class_graphs), static_cast<long long>(rep.class_batches),
                static_cast<long long>(rep.class_outside), rep.class_outside_example.empty() ? "" : ", as ",
                rep.class_outside_example.c_str(), static_cast<long long>(rep.class_not_generalized));
  }
  for (const auto& f : rep.failures) std::printf("%s\n", f.c_str());
  if (rep.nvrtc_kernels > 0)
    std::printf("NVRTC (%s): %lld kernels compiled in %.1f s\n", opt.check.nvrtc_arch.c_str(),
                static_cast<long long>(rep.nvrtc_kernels), rep.nvrtc_seconds);
  // A graph eager rejects is neither passed nor failed: nothing was compared.
  std::printf("%lld passed, %zu failed, %lld rejected by eager (not compared)\n",
              static_cast<long long>(rep.graphs - rep.rejected) - static_cast<long long>(rep.failures.size()),
              rep.failures.size(), static_cast<long long>(rep.rejected));
  return rep.failures.empty() ? 0 : 1;
}

}  // namespace

int run_fuzz(const FuzzArgs& a) {
  try {
    return run(a);
  } catch (const c10::Error& e) {
    usage_error(first_line(e.what_without_backtrace()));
  }
}

}  // namespace fusion_jit::cli
