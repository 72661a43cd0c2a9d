// fusion-jit package | load: ahead-of-time packages (fusion_jit/package.h).
//
//   package  MODEL.pt, one signature per --input group (--input SPEC ... or --inputs FILE) and one per
//            --signature "SPEC SPEC ...", into --out FILE: the plans, their compiled code and the weights;
//            signed with the key in the file FUSION_JIT_PACKAGE_KEY names, where it is set
//   load     loads a package (no capture, no compiler) and runs it on --input SPEC ...: prints the load time,
//            the first and (with --bench N) the median call time, and with --explain what the package holds;
//            with FUSION_JIT_PACKAGE_KEY set, a package not signed with that key is refused before any of it
//            is loaded (Note [Package signatures], torch/package.cpp)
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/cli.h"
#include "fusion_jit/package.h"

namespace fusion_jit::cli {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<c10::IValue> inputs_of(const std::vector<std::string>& specs) {
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < specs.size(); ++i) inputs.push_back(make_input(specs[i], i));
  return inputs;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

int package_model(const PackageArgs& a, uint64_t seed) {
  if (a.out.empty()) usage_error("package: --out FILE is required");
  if (!a.specs.empty() && !a.inputs_file.empty()) usage_error("package: give --input SPEC ... or --inputs FILE, not both");
  torch::jit::Module module;
  try {
    module = torch::jit::load(a.path);
  } catch (const std::exception& e) {
    usage_error(a.path + ": not a TorchScript model (" + first_line(e.what()) + ")");
  }
  at::manual_seed(seed);
  std::vector<std::vector<c10::IValue>> signatures;
  if (!a.inputs_file.empty()) signatures.push_back(load_inputs(a.inputs_file));
  if (!a.specs.empty()) signatures.push_back(inputs_of(a.specs));
  for (const std::string& s : a.signatures) {
    std::vector<std::string> specs = words(s);
    if (specs.empty()) usage_error("--signature '" + s + "': no SPEC in it");
    signatures.push_back(inputs_of(specs));
  }
  if (signatures.empty()) usage_error("package: give the inputs with --input SPEC ..., --inputs FILE or --signature \"SPEC ...\"");
  const size_t expected = module.get_method("forward").function().getSchema().arguments().size() - 1;
  for (size_t i = 0; i < signatures.size(); ++i)
    if (signatures[i].size() != expected)
      usage_error(a.path + " takes " + std::to_string(expected) + " input" + (expected == 1 ? "" : "s") + ", signature " +
                  std::to_string(i) + " has " + std::to_string(signatures[i].size()));
  PackageOptions options;
  std::string variants = a.cpu_variants;
  std::replace(variants.begin(), variants.end(), ',', ' ');
  options.cpu_variants = words(variants);
  if (a.device != "cpu" && a.device != "cuda") usage_error("package: --device " + a.device + ": expected cpu or cuda");
  if (!a.arch.empty() && a.device != "cuda") usage_error("package: --arch is for --device cuda");
  if (!a.cpu_variants.empty() && a.device != "cpu") usage_error("package: --cpu-variants is for --device cpu");
  options.device = a.device;
  std::string archs = a.arch;
  std::replace(archs.begin(), archs.end(), ',', ' ');
  options.cuda_archs = words(archs);
  std::printf("packaging %s for %s: %zu signature%s\n", a.path.c_str(), a.device.c_str(), signatures.size(),
              signatures.size() == 1 ? "" : "s");
  std::fflush(stdout);
  const PackageInfo info = package(module, signatures, a.out, options);
  std::printf("%s: %d signature%s, %d kernels from %d source%s, %.1f MB of constants, %.1f MB in all, built in %.0f ms\n",
              info.path.c_str(), info.signatures, info.signatures == 1 ? "" : "s", info.kernels, info.sources,
              info.sources == 1 ? "" : "s", static_cast<double>(info.constant_bytes) / 1e6,
              static_cast<double>(info.bytes) / 1e6, info.build_ms);
  if (!info.key_file.empty()) std::printf("signed with the key in %s\n", info.key_file.c_str());
  return 0;
}

int load_and_run(const PackageArgs& a, uint64_t seed) {
  const int bench = a.bench.empty() ? 0 : static_cast<int>(parse_int("--bench", a.bench, 1, 1 << 30));
  const LoadedPackage p = load_package(a.path);
  std::printf("loaded %s in %.2f ms (constants %.2f ms, of which prepacking %.2f ms)\n", a.path.c_str(), p.load_ms(),
              p.constants_ms(), p.prepack_ms());
  if (!p.verified_with().empty()) std::printf("signature verified with the key in %s\n", p.verified_with().c_str());
  if (a.explain) std::printf("%s", p.explain().c_str());
  if (a.specs.empty() && a.inputs_file.empty()) return 0;
  if (!a.specs.empty() && !a.inputs_file.empty()) usage_error("load: give --input SPEC ... or --inputs FILE, not both");
  at::manual_seed(seed);
  std::vector<c10::IValue> inputs = a.inputs_file.empty() ? inputs_of(a.specs) : load_inputs(a.inputs_file);
  if (p.device() == "cuda")  // a CUDA package's plans take their inputs on cuda:0
    for (c10::IValue& v : inputs)
      if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(c10::Device(c10::kCUDA, 0));
  c10::NoGradGuard no_grad;
  auto t0 = std::chrono::steady_clock::now();
  c10::IValue out = p(inputs);
  std::printf("first call %.3f ms\n", ms_since(t0));
  if (bench > 0) {
    std::vector<double> t;
    for (int i = 0; i < bench; ++i) {
      auto t1 = std::chrono::steady_clock::now();
      p(inputs);
      t.push_back(ms_since(t1));
    }
    std::sort(t.begin(), t.end());
    std::printf("median call %.3f ms over %d calls\n", t[t.size() / 2], bench);
  }
  if (!a.save_outputs.empty()) save_tensors("--save-outputs", a.save_outputs, flatten_tensors(out));
  return 0;
}

}  // namespace

int run_package(const PackageArgs& a) {
  if (a.path.empty()) usage_error(a.command == "package" ? "missing MODEL.pt" : "missing PACKAGE");
  const uint64_t seed = static_cast<uint64_t>(parse_int("--seed", a.seed, 0));
  try {
    return a.command == "package" ? package_model(a, seed) : load_and_run(a, seed);
  } catch (const c10::Error& e) {  // torch's checks of what the user gave: its first line names the problem
    usage_error(first_line(e.what_without_backtrace()));
  }
}

}  // namespace fusion_jit::cli
