// fusion-jit run | explain | compile: a TorchScript model on given inputs, through the public API.
//
//   run      runs the model fused (and eagerly, for --check and --bench) and reports its plan
//   explain  prints the plan: groups, ops, the reason for every fusion decision (--dump-source: the code)
//   compile  ahead-of-time CUDA compilation with NVRTC, no GPU needed: writes DIR/plan.cu, the binary
//            (DIR/plan.cubin, or DIR/plan.ptx for compute_XY), DIR/kernels.json (each kernel's
//            registers, shared memory, stack and spills) and DIR/explain.txt
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/Context.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "fusion_jit/cache.h"
#include "fusion_jit/fusion_jit.h"
#include "ir/dtype.h"
#include "runtime/plan.h"  // the plan's kernels, sources and binary, for explain and compile
#include "support/parse.h"
#include "targets/cuda/cuda_schedule.h"  // the vector width, for compile's kernels.json
#include "torch/executor.h"
#include "torch/tolerance.h"

namespace fusion_jit::cli {

namespace fj = fusion_jit;

at::Tensor make_input(const std::string& spec, size_t index) {
  static const std::regex re(R"(^([a-z0-9]+)\[([0-9,\s]*)\](\{([0-9,\s]*)\})?$)");
  std::smatch m;
  if (!std::regex_match(spec, m, re))
    usage_error("input " + std::to_string(index) + ": malformed SPEC '" + spec + "' (expected DTYPE[SIZES]{STRIDES}, e.g. f32[64,1024])");
  auto dt = fj::dtype_from_name(m[1]);
  if (!dt || *dt == fj::DType::kOther)
    usage_error("input " + std::to_string(index) + ": unknown dtype '" + std::string(m[1]) + "' in SPEC '" + spec + "'");
  const std::string where = "input " + std::to_string(index) + ": ";
  auto ints = [&](const std::string& s, const char* what) {
    std::vector<int64_t> v;
    std::string cur;
    for (char c : s + ",") {
      if (c == ',') {
        if (!cur.empty()) {
          int64_t x = 0;
          if (fj::parse_int64(cur, &x) != fj::ParseStatus::kOk)
            usage_error(where + what + " " + cur + " in SPEC '" + spec + "' is too large (at most " +
                        std::to_string(std::numeric_limits<int64_t>::max()) + ")");
          v.push_back(x);
        }
        cur.clear();
      } else if (!std::isspace(static_cast<unsigned char>(c))) {
        cur += c;
      }
    }
    return v;
  };
  std::vector<int64_t> sizes = ints(m[2], "size");
  // The element count and the extent in memory must fit int64_t (torch computes both).
  int64_t numel = 1;
  for (int64_t d : sizes)
    if (!fj::checked_mul(numel, d, &numel))
      usage_error(where + "SPEC '" + spec + "' has more elements than int64_t can count");
  std::vector<int64_t> strides = m[3].matched ? ints(m[4], "stride") : std::vector<int64_t>(fj::contiguous_strides(sizes));
  if (strides.size() != sizes.size())
    usage_error(where + "SPEC '" + spec + "' has " + std::to_string(sizes.size()) + " sizes but " +
                std::to_string(strides.size()) + " strides");
  int64_t extent = 1;
  for (size_t d = 0; d < sizes.size() && numel > 0; ++d) {
    int64_t span = 0;
    if (!fj::checked_mul(sizes[d] - 1, strides[d], &span) || extent > std::numeric_limits<int64_t>::max() - span)
      usage_error(where + "SPEC '" + spec + "' spans more memory than int64_t can address");
    extent += span;
  }
  if (numel == 0) extent = 1;
  auto st = static_cast<at::ScalarType>(fj::dtype_to_torch_code(*dt));
  at::Tensor base;
  if (fj::is_floating(*dt)) base = at::randn({extent}, at::TensorOptions().dtype(at::kFloat)).to(st);
  else if (*dt == fj::DType::kBool) base = at::randint(0, 2, {extent}).to(st);
  else base = at::randint(-8, 9, {extent}, at::TensorOptions().dtype(at::kLong)).to(st);
  return base.as_strided(sizes, strides);
}

static std::vector<char> read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

std::vector<c10::IValue> load_inputs(const std::string& path) {
  auto data = read_file(path, "--inputs");
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(data);
  } catch (const c10::Error& e) {
    usage_error("--inputs " + path + ": not a file written by torch.save: " + e.what_without_backtrace());
  }
  std::vector<c10::IValue> out;
  if (v.isTensor()) {
    out.push_back(v);
  } else if (v.isList() || v.isTuple()) {
    auto items = v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].isTensor()) usage_error("--inputs " + path + ": item " + std::to_string(i) + " is not a tensor");
      out.push_back(items[i]);
    }
  } else {
    usage_error("--inputs " + path + ": expected a list of tensors");
  }
  return out;
}


namespace {

using Args = ModelArgs;

std::vector<at::Tensor> flatten(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTuple()) for (const auto& e : v.toTupleRef().elements()) { auto f = flatten(e); out.insert(out.end(), f.begin(), f.end()); }
  else if (v.isList()) for (const auto& e : v.toListRef()) { auto f = flatten(e); out.insert(out.end(), f.begin(), f.end()); }
  return out;
}

// Writes a whole file or nothing: a temporary file in the same directory, renamed into place.
void write_atomically(const std::string& what, const std::string& path, const char* data, size_t size) {
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) usage_error(what + " " + path + ": cannot write (" + std::strerror(errno) + ")");
    f.write(data, static_cast<std::streamsize>(size));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      usage_error(what + " " + path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    usage_error(what + " " + path + ": cannot rename into place (" + std::strerror(errno) + ")");
  }
}

// The medians of `n` calls of `a` and of `b`, called in turn (ABBA...) after a few calls of each, so that
// the machine's drift and the allocator's state (which memory is still mapped) fall on both alike.
std::pair<double, double> interleaved_median_ms(int n, const std::function<void()>& a, const std::function<void()>& b) {
  for (int i = 0; i < std::min(n, 3); ++i) {
    a();
    b();
  }
  auto ms = [](const std::function<void()>& fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ta, tb;
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      ta.push_back(ms(a));
      tb.push_back(ms(b));
    } else {
      tb.push_back(ms(b));
      ta.push_back(ms(a));
    }
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

// "these inputs (input 0 f32[4,4], input 1 f32[5,3])": what eager was given, for its error messages.
std::string describe_inputs(const std::vector<c10::IValue>& inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    s += (i ? ", input " : "these inputs (input ") + std::to_string(i) + " ";
    if (!inputs[i].isTensor()) {
      s += inputs[i].tagKind();
      continue;
    }
    const at::Tensor& t = inputs[i].toTensor();
    fj::DType dt = fj::dtype_from_torch_code(static_cast<int>(t.scalar_type()));
    s += std::string(dt != fj::DType::kOther ? fj::dtype_name(dt) : c10::toString(t.scalar_type())) + "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
    s += "]";
  }
  return s + (inputs.empty() ? "these inputs" : ")");
}

// The op's message in an error from TorchScript's interpreter ("The following operation failed in the
// TorchScript interpreter. Traceback ... RuntimeError: MESSAGE"): MESSAGE, else the first line.
std::string eager_error_message(const std::string& what) {
  static const std::regex error_line(R"(^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception): (.*)$)");
  std::istringstream in(what);
  std::string line, found;
  std::smatch m;
  while (std::getline(in, line))
    if (found.empty() && std::regex_match(line, m, error_line) && !m[2].str().empty()) found = m[2].str();
  return found.empty() ? first_line(what) : found;
}

// `fusion-jit compile`: the plan's CUDA kernels through NVRTC, written to a directory.
int compile_cuda(const Args& a, torch::jit::Module& module, const std::vector<c10::IValue>& inputs) {
  const CudaStatus cuda = cuda_status();
  if (!cuda.nvrtc) usage_error("compile: " + cuda.nvrtc_problem);
  check_cuda_arch(a.arch);
  make_output_dir("--out", a.out_dir);
  torch::jit::setGraphExecutorOptimize(false);
  module.eval();
  auto t0 = std::chrono::steady_clock::now();
  auto fused = fj::compile(module);
  auto plan = fused.compile_cuda(inputs, a.arch);
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string dir = a.out_dir + "/";
  nlohmann::json j;
  j["model"] = a.model;
  j["arch"] = a.arch;
  j["nvrtc_version"] = cuda.nvrtc_version;
  j["codegen_ms"] = plan->codegen_ms;
  const fj::TargetCode* code = plan->code_for(fj::Device::kCUDA);
  const fj::Artifact* binary = code ? code->artifact.get() : nullptr;
  j["nvrtc_ms"] = binary ? binary->compile_ms() : 0.0;
  j["nvrtc_calls"] = binary ? 1 : 0;
  j["total_ms"] = total_ms;
  j["aten_ops"] = plan->aten_ops;
  j["kernels"] = nlohmann::json::array();
  for (const auto& k : plan->kernels) {
    nlohmann::json kj;
    kj["name"] = k.spec.name;
    kj["ops"] = plan->group_ops.at(&k - plan->kernels.data());
    kj["elements"] = static_cast<int64_t>(k.spec.numel);
    kj["vector_width"] = fj::cuda_vector_width(k.spec);
    kj["index_bits"] = k.spec.index32 ? 32 : 64;
    if (binary)
      for (const auto& [field, value] : binary->kernel_report(k.spec.name)) kj[field] = value;
    j["kernels"].push_back(kj);
  }
  std::string json = j.dump(2) + "\n", explain = plan->explain();
  const std::string source = code ? code->source : "";
  write_atomically("--out", dir + "plan.cu", source.data(), source.size());
  if (binary && !binary->image_file_name().empty())
    write_atomically("--out", dir + binary->image_file_name(), binary->image().data(), binary->image().size());
  write_atomically("--out", dir + "kernels.json", json.data(), json.size());
  write_atomically("--out", dir + "explain.txt", explain.data(), explain.size());
  std::printf("%s: %zu CUDA kernels for %s, %zu ATen ops; codegen %.1f ms, NVRTC %.1f ms (1 call), total %.1f ms; "
              "written to %s\n", a.model.c_str(), plan->kernels.size(), a.arch.c_str(), plan->aten_ops.size(),
              plan->codegen_ms, j["nvrtc_ms"].get<double>(), total_ms, a.out_dir.c_str());
  return 0;
}

// Checks what the options allow only together, and the device.
// cache pull: the model's plan and kernels for these inputs through the cache's tiers, under
// FUSION_JIT_ASSERT_NO_COMPILE (main sets it): what the remote tier has lands in the local directory.
int pull(const Args& a, torch::jit::Module& module, const std::vector<c10::IValue>& inputs) {
  const cache::Remote r = cache::remote();
  if (r.address.empty())
    usage_error("cache pull: no remote tier (set FUSION_JIT_REMOTE_CACHE and FUSION_JIT_REMOTE_CACHE_KEY_FILE)");
  if (!r.reachable) usage_error("cache pull: " + r.address + " is unreachable: " + r.error);
  const Counters before = counters();
  module.eval();
  auto fused = fj::compile(module);
  const fj::ExecutablePlan* plan = nullptr;
  try {
    plan = fused.plan_for(inputs);
  } catch (const fj::Error& e) {
    std::fprintf(stderr, "fusion-jit: cache pull: %s lacks what %s needs for %s (nothing was compiled): %s\n",
                 r.address.c_str(), a.model.c_str(), describe_inputs(inputs).c_str(), first_line(e.what()).c_str());
    return 1;
  }
  const Counters after = counters();
  std::printf("pulled %lld entries (%lld bytes) from %s into %s; %s\n",
              static_cast<long long>(after.remote_hits - before.remote_hits),
              static_cast<long long>(after.remote_bytes_in - before.remote_bytes_in), r.address.c_str(),
              cache::dir().c_str(),
              plan ? "the model's plan for these inputs runs with no compiler"
                   : ("these inputs run eagerly: " + first_line(fused.explain(inputs))).c_str());
  return 0;
}

void check_args(const Args& a) {
  if (a.model.empty()) usage_error("missing MODEL.pt");
  if (a.specs.empty() == a.inputs_file.empty())
    usage_error("give the inputs with --input SPEC ... or with --inputs FILE (one of the two)");
  static const std::regex device_re("cpu|cuda(:[0-9]+)?");
  if (!std::regex_match(a.device, device_re)) usage_error("--device " + a.device + ": unknown device (cpu, cuda or cuda:N)");
  if (a.command == "compile") {
    if (a.device != "cuda") usage_error("compile: --device cuda is required (CPU plans are compiled when they first run)");
    if (a.out_dir.empty()) usage_error("compile: --out DIR is required");
  } else if (a.device != "cpu") {
    const CudaStatus cuda = cuda_status();
    if (!cuda.driver) usage_error("--device " + a.device + ": " + cuda.driver_problem);
    if (cuda.devices == 0) usage_error("--device " + a.device + ": torch sees no CUDA device");
  }
}

int run(const Args& a) {
  const int64_t seed = parse_int("--seed", a.seed, 0);
  const int bench = a.bench.empty() ? 0 : static_cast<int>(parse_int("--bench", a.bench, 1, std::numeric_limits<int>::max()));
  const int profile = a.profile.empty() ? 0 : static_cast<int>(parse_int("--profile", a.profile, 1, 1000000));
  const int calls = a.calls.empty() ? 20 : static_cast<int>(parse_int("--calls", a.calls, 1, 1000000));
  check_args(a);
  if (profile > 0 && a.device != "cpu")
    usage_error("--profile: CPU plans only (a CUDA step's host time is its launch, not its run)");
  if (a.measure_decisions && a.device != "cpu")
    usage_error("--measure-decisions: CPU plans only (a CUDA step's host time is its launch, not its run)");
  if (!a.calls.empty() && !a.measure_decisions) usage_error("--calls is for --measure-decisions");
  struct stat st;
  if (::stat(a.model.c_str(), &st) != 0) usage_error(a.model + ": no such file");
  torch::jit::Module module;
  try {
    module = torch::jit::load(a.model);
  } catch (const std::exception& e) {
    usage_error(a.model + ": not a TorchScript model (" + first_line(e.what()) + ")");
  }
  at::manual_seed(static_cast<uint64_t>(seed));
  std::vector<c10::IValue> inputs;
  if (!a.inputs_file.empty()) inputs = load_inputs(a.inputs_file);
  else for (size_t i = 0; i < a.specs.size(); ++i) inputs.push_back(make_input(a.specs[i], i));
  size_t expected = module.get_method("forward").function().getSchema().arguments().size() - 1;
  if (inputs.size() != expected)
    usage_error(a.model + " takes " + std::to_string(expected) + " input" + (expected == 1 ? "" : "s") + ", " +
                std::to_string(inputs.size()) + " given");
  if (a.command == "compile") return compile_cuda(a, module, inputs);
  if (a.command == "pull") return pull(a, module, inputs);
  if (a.device != "cpu") {
    const at::Device dev(a.device);
    module.to(dev);
    for (auto& v : inputs) v = v.toTensor().to(dev);
  }
  // The reference: TorchScript's interpreter without its optimizing executor (so without torch's fusers).
  torch::jit::setGraphExecutorOptimize(false);
  module.eval();
  // Eager runs on copies of the inputs: a model that changes its inputs changes each set once, and the
  // fused call's inputs must end as eager's do.
  std::vector<c10::IValue> eager_inputs;
  for (auto& v : inputs) eager_inputs.emplace_back(fj::clone_same_layout(v.toTensor()));
  c10::IValue eager_out;
  double eager_first_ms = 0;
  try {
    auto t_eager = std::chrono::steady_clock::now();
    eager_out = module.forward(eager_inputs);
    eager_first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_eager).count();
  } catch (const c10::Error& e) {
    usage_error(a.model + " rejects " + describe_inputs(inputs) + ": " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // TorchScript's interpreter rethrows an op's c10::Error as a std::runtime_error whose text is the
    // interpreter's stack, then the op's error: the model's own message on these inputs.
    usage_error(a.model + " rejects " + describe_inputs(inputs) + ": " + eager_error_message(e.what()));
  }
  auto fused = fj::compile(module);
  const fj::ExecutablePlan* plan = nullptr;
  auto t_first = std::chrono::steady_clock::now();
  plan = fused.plan_for(inputs);
  if (a.command == "explain") {
    if (a.measure_decisions) return measure_decisions(a.model, module, fused, inputs, calls, a.json);
    if (a.json) {
      std::cout << explain_json(a.model, plan, plan ? std::string() : first_line(fused.explain(inputs)));
      return 0;
    }
    std::cout << fused.explain(inputs);
    if (plan) {
      std::cout << "compile: " << fused.last_compile_report() << "\n";
      if (a.dump_source) {
        if (plan->code.empty()) std::cout << "\n// no generated source\n";
        for (const auto& c : plan->code) std::cout << "\n" << c.source;
      }
    }
    return 0;
  }
  c10::IValue out = fused(inputs);
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_first).count();
  auto outs = flatten(out), eager_outs = flatten(eager_out);
  std::string check = "skipped", why;
  double max_err = 0;
  if (a.check) {
    check = "pass";
    if (outs.size() != eager_outs.size()) {
      check = "fail";
      why = "fused returns " + std::to_string(outs.size()) + " tensors, eager " + std::to_string(eager_outs.size());
    }
    std::optional<c10::IValue> ref64;
    for (size_t i = 0; i < outs.size() && check == "pass"; ++i) {
      auto r = fj::check_close(outs[i], eager_outs[i]);
      if (!r.ok && at::isFloatingType(outs[i].scalar_type())) {
        if (!ref64) {
          auto m64 = module.clone();
          m64.to(at::kDouble);
          std::vector<c10::IValue> in64;
          for (auto& v : inputs) {
            auto t = v.toTensor();
            in64.push_back(at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t);
          }
          ref64 = m64.forward(in64);
        }
        auto refs = flatten(*ref64);
        r = fj::check_close(outs[i], eager_outs[i], refs.at(i).to(at::kDouble));
      }
      max_err = std::max(max_err, r.max_abs_err);
      if (!r.ok) {
        check = "fail";
        why = "output " + std::to_string(i) + ": " + r.message;
      }
    }
    for (size_t i = 0; i < inputs.size() && check == "pass"; ++i)
      if (!fj::same_values(inputs[i].toTensor(), eager_inputs[i].toTensor())) {
        check = "fail";
        why = "input " + std::to_string(i) + " after the call differs from eager's";
      }
  }
  double eager_ms = -1, fused_ms = -1;
  if (bench > 0) {
    std::tie(eager_ms, fused_ms) = interleaved_median_ms(bench, [&] { module.forward(inputs); }, [&] { fused(inputs); });
  }
  std::string profiled;
  if (profile > 0) {
    if (plan) profiled = profile_report(*plan, profile, [&] { fused(inputs); }, a.json);
    else profiled = a.json ? "null" : "profile: no plan (the inputs run eagerly)\n";
  }
  if (!a.save_outputs.empty()) save_tensors("--save-outputs", a.save_outputs, outs);
  auto stats = fused.stats();
  int ops = 0, groups = 0, kernels = 0;
  std::map<std::string, int> fallback;
  if (plan) {
    ops = plan->fused_ops;
    for (auto& [k, v] : plan->aten_ops) ops += v;
    groups = plan->num_groups;
    kernels = static_cast<int>(plan->kernels.size());
    fallback = plan->aten_ops;
  }
  if (a.json) {
    nlohmann::json j;
    j["check"] = check;
    if (!why.empty()) j["check_message"] = why;
    j["ops"] = ops;
    j["fused_groups"] = groups;
    j["kernels"] = kernels;
    j["fallback_ops"] = fallback;
    j["max_abs_err"] = max_err;
    j["eager_ms"] = eager_ms >= 0 ? nlohmann::json(eager_ms) : nlohmann::json(nullptr);
    j["fused_ms"] = fused_ms >= 0 ? nlohmann::json(fused_ms) : nlohmann::json(nullptr);
    j["compile_ms"] = stats.compile_ms;
    j["eager_first_ms"] = eager_first_ms;  // eager's first call in this process
    j["first_call_ms"] = first_ms;         // the fused first call: capture, plan (or cache), run
    const Counters cs = counters();
    j["compiler_invocations"] = cs.compiles();
    j["cache"] = {{"hits", cs.cache_hits}, {"misses", cs.cache_misses}, {"corrupt", cs.cache_corrupt},
                  {"evictions", cs.cache_evictions}, {"bytes_read", cs.cache_bytes_read},
                  {"bytes_written", cs.cache_bytes_written},
                  {"remote", {{"hits", cs.remote_hits}, {"misses", cs.remote_misses}, {"refused", cs.remote_refused},
                              {"errors", cs.remote_errors}, {"skipped", cs.remote_skipped}, {"writes", cs.remote_writes},
                              {"bytes_in", cs.remote_bytes_in}, {"bytes_out", cs.remote_bytes_out},
                              {"ms", cs.remote_ms}}}};
    j["eager_fallback"] = plan ? nlohmann::json(nullptr) : nlohmann::json(first_line(fused.explain(inputs)));
    if (profile > 0) j["profile"] = nlohmann::json::parse(profiled);
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %d ops, %d fused groups, %d kernels per call, %zu ATen ops, compile %.1f ms\n", a.model.c_str(), ops,
                groups, kernels, fallback.size(), stats.compile_ms);
    if (!plan) std::printf("%s", fused.explain(inputs).c_str());
    if (a.check) std::printf("check: %s (max abs error %.3g)%s%s\n", check.c_str(), max_err, why.empty() ? "" : ": ", why.c_str());
    if (bench > 0) std::printf("eager %.3f ms, fused %.3f ms, speedup %.2fx\n", eager_ms, fused_ms, eager_ms / fused_ms);
    std::printf("%s", profiled.c_str());
  }
  return check == "fail" ? 1 : 0;
}

}  // namespace

// A tuple: LibTorch's pickler tags lists with their type, which torch.load(weights_only=True), the default,
// refuses; a tuple of tensors loads everywhere.
void save_tensors(const std::string& what, const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::vector<c10::IValue> items;  // on the CPU: readable on any machine
  for (const at::Tensor& t : tensors) items.emplace_back(t.defined() ? t.cpu() : t);
  auto bytes = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  write_atomically(what, path, bytes.data(), bytes.size());
}

std::vector<at::Tensor> flatten_tensors(const c10::IValue& v) { return flatten(v); }

int run_model(const ModelArgs& a) {
  try {
    return run(a);
  } catch (const c10::Error& e) {  // torch's checks of what the user gave: its first line names the problem
    usage_error(first_line(e.what_without_backtrace()));
  }
}

}  // namespace fusion_jit::cli
