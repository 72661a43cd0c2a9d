// Writes the generated CPU and CUDA sources of the whole op corpus, the reduction corpus, the reduction
// patterns and any TorchScript models named on the command line, one file per plan, without compiling
// them. tests/codegen/diff_sources.sh runs it at two commits and diffs the folders: a refactor of code
// generation must leave every byte the same, or explain each difference in its commit.
//
//   dump_sources OUT_DIR [NAME=MODEL.pt:f32[8,128],f32[128] ...]
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/serialization/import.h>

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "../torch/op_corpus.h"
#include "../torch/reduction_corpus.h"
#include "runtime/plan.h"
#include "torch/capture.h"
#include "torch/executor.h"

namespace fj = fusion_jit;
namespace tj = torch::jit;

namespace {

// The plan's sources for `device`, as compile() would build them, with no compiler run.
std::unique_ptr<fj::ExecutablePlan> plan_sources(const tj::Module& m, const std::vector<c10::IValue>& inputs,
                                                 fj::Device device) {
  tj::Module source = m;
  fj::inline_all_calls(*source.get_method("forward").graph());
  tj::Module frozen = tj::freeze_module(source);
  auto graph = frozen.get_method("forward").graph()->copy();
  fj::prepare_torchscript_graph(graph);
  fj::CaptureResult cap = fj::capture_graph(graph, inputs, /*skip_self=*/true);
  // As compile_cuda: the graph moved to the GPU for the passes.
  if (device == fj::Device::kCUDA)
    fj::optimize_captured_on_cuda(cap.captured, {});
  else
    fj::optimize_captured(cap.captured);
  fj::PlanTarget target;
  target.arch["cuda"] = "sm_90";
  target.compile = false;
  return fj::build_plan(std::move(cap.captured.graph), target);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path);
}

int files = 0;
void dump(const std::string& dir, const std::string& name, const tj::Module& m, const std::vector<c10::IValue>& in) {
  auto cpu = plan_sources(m, in, fj::Device::kCPU);
  auto cuda = plan_sources(m, in, fj::Device::kCUDA);
  const fj::TargetCode* cpu_code = cpu->code_for(fj::Device::kCPU);
  const fj::TargetCode* cuda_code = cuda->code_for(fj::Device::kCUDA);
  write(dir + "/" + name + ".cpp", cpu_code ? cpu_code->source : "// no CPU kernel\n");
  write(dir + "/" + name + ".cu", cuda_code ? cuda_code->source : "// no CUDA kernel\n");
  files += 2;
}

at::ScalarType dtype_of(const std::string& s) {
  static const std::map<std::string, at::ScalarType> t = {{"f32", at::kFloat}, {"f64", at::kDouble},
                                                          {"f16", at::kHalf},  {"bf16", at::kBFloat16},
                                                          {"i32", at::kInt},   {"i64", at::kLong}};
  return t.at(s);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fusion_jit::testing;
  if (argc < 2) {
    std::fprintf(stderr, "usage: dump_sources OUT_DIR [NAME=MODEL.pt:f32[8,128],f32[128] ...]\n");
    return 2;
  }
  const std::string out = argv[1];
  for (const OpCase& c : kCases) {
    auto m = corpus_module(c);
    for (at::ScalarType t : dtypes_of(c.dtypes))
      dump(out, fmt::format("op_{}_{}", c.name, c10::toString(t)), m, corpus_inputs(c, t));
  }
  for (const ReductionCase& c : kReductionCases) {
    auto ins = inputs_for(c);
    auto m = reduction_module(c, ins.size());
    for (at::ScalarType t : reduction_dtypes(c.dtypes))
      dump(out, fmt::format("red_{}_{}", c.name, c10::toString(t)), m, reduction_case_inputs(ins, t));
  }
  for (int i = 2; i < argc; ++i) {  // NAME=PATH:SPEC,SPEC
    std::smatch mt;
    std::string a = argv[i];
    if (!std::regex_match(a, mt, std::regex("([^=]+)=([^:]+):(.*)"))) {
      std::fprintf(stderr, "dump_sources: %s: expected NAME=MODEL.pt:SPEC,...\n", a.c_str());
      return 2;
    }
    tj::Module m = tj::load(mt[2].str());
    m.eval();
    std::vector<c10::IValue> inputs;
    std::string specs = mt[3].str();
    std::regex spec_re("([a-z0-9]+)\\[([0-9,]*)\\]");
    at::manual_seed(0);
    for (auto it = std::sregex_iterator(specs.begin(), specs.end(), spec_re); it != std::sregex_iterator(); ++it) {
      std::vector<int64_t> sizes;
      std::string dims = (*it)[2].str();
      for (size_t p = 0; p < dims.size();) {
        size_t e = dims.find(',', p);
        if (e == std::string::npos) e = dims.size();
        sizes.push_back(std::stoll(dims.substr(p, e - p)));
        p = e + 1;
      }
      inputs.emplace_back(at::randn(sizes).to(dtype_of((*it)[1].str())));
    }
    dump(out, "model_" + mt[1].str(), m, inputs);
  }
  std::printf("%d files in %s\n", files, out.c_str());
  return 0;
}
