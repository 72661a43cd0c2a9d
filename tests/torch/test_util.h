// Helpers of the torch tests: TorchScript modules from source, inputs in many layouts, comparison with
// eager through the project's tolerance rule.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <string>
#include <vector>

#include "runtime/plan.h"
#include "fusion_jit/fusion_jit.h"
#include "torch/tolerance.h"

namespace fusion_jit::testing {

// A scripted module whose forward is `def forward(self, ARGS): BODY`.
inline torch::jit::Module script(const std::string& args, const std::string& body) {
  torch::jit::setGraphExecutorOptimize(false);  // the reference runs without torch's own fusers
  torch::jit::Module m("TestModule");
  m.define("def forward(self, " + args + "):\n" + body + "\n");
  m.eval();
  return m;
}

inline std::vector<at::Tensor> flatten(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTuple()) for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  else if (v.isList()) for (const auto& e : v.toListRef()) out.push_back(e.toTensor());
  return out;
}

// The module run in float64: floating inputs and parameters converted.
inline std::vector<at::Tensor> reference64(const torch::jit::Module& m, const std::vector<c10::IValue>& inputs) {
  torch::jit::Module m64 = m.clone();
  m64.to(at::kDouble);
  std::vector<c10::IValue> in64;
  for (const auto& v : inputs) {
    if (v.isTensor() && at::isFloatingType(v.toTensor().scalar_type())) in64.emplace_back(v.toTensor().to(at::kDouble));
    else in64.push_back(v);
  }
  return flatten(m64.forward(in64));
}

struct RunResult {
  std::shared_ptr<CompiledModule> compiled;  // owns the plan (run_and_compare)
  const ExecutablePlan* plan = nullptr;
  std::vector<at::Tensor> fused, eager;
};

// Runs `m` on `inputs` through `fused`'s plan (not the capture run: the plan is made first), and eagerly;
// checks every output by the tolerance rule, and that the inputs are unchanged. r.compiled stays unset.
inline RunResult compare_with_eager(CompiledModule& fused, torch::jit::Module& m, const std::vector<c10::IValue>& inputs,
                                    const std::string& what) {
  RunResult r;
  std::vector<at::Tensor> before;
  for (const auto& v : inputs)
    if (v.isTensor()) before.push_back(v.toTensor().clone());
  r.eager = flatten(m.forward(inputs));
  r.plan = fused.plan_for(inputs);
  r.fused = flatten(fused(inputs));
  EXPECT_EQ(r.fused.size(), r.eager.size()) << what;
  std::vector<at::Tensor> ref;
  for (size_t i = 0; i < r.fused.size() && i < r.eager.size(); ++i) {
    auto c = check_close(r.fused[i], r.eager[i]);
    if (!c.ok && at::isFloatingType(r.fused[i].scalar_type())) {
      // Where eager itself rounds differently, judge both against float64 (DESIGN.md).
      if (ref.empty()) ref = reference64(m, inputs);
      c = check_close(r.fused[i], r.eager[i], ref.at(i).to(at::kDouble));
    }
    EXPECT_TRUE(c.ok) << what << ": output " << i << ": " << c.message << "\nfused: " << r.fused[i].flatten().slice(0, 0, 12)
                      << "\neager: " << r.eager[i].flatten().slice(0, 0, 12);
  }
  size_t k = 0;
  for (const auto& v : inputs)
    if (v.isTensor()) {
      EXPECT_TRUE(same_values(v.toTensor(), before[k++])) << what << ": an input was modified";
    }
  return r;
}

// compare_with_eager on a module compiled for this call alone.
inline RunResult run_and_compare(torch::jit::Module& m, const std::vector<c10::IValue>& inputs,
                                 const std::string& what, const CompileOptions& options = {}) {
  auto compiled = std::make_shared<CompiledModule>(compile(m, options));
  RunResult r = compare_with_eager(*compiled, m, inputs, what);
  r.compiled = std::move(compiled);
  return r;
}

// conv2d(x, w, b, stride 1, padding 1) [-> batch_norm] -> `act`(y), frozen parameters, in `dtype`; 8 input
// channels, `channels` output channels.
inline torch::jit::Module conv_block(const std::string& act, bool bn, at::ScalarType dtype, bool return_conv = false,
                                     int64_t channels = 16) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("ConvBlock");
  m.register_parameter("w", at::randn({channels, 8, 3, 3}) * 0.2, false);
  m.register_parameter("b", at::randn({channels}) * 0.1, false);
  m.register_buffer("gamma", at::rand({channels}) + 0.5);
  m.register_buffer("beta", at::randn({channels}) * 0.1);
  m.register_buffer("mean", at::randn({channels}) * 0.1);
  m.register_buffer("var", at::rand({channels}) + 0.5);
  std::string body = "    c = torch.conv2d(x, self.w, self.b, [1, 1], [1, 1], [1, 1], 1)\n";
  body += bn ? "    y = torch.batch_norm(c, self.gamma, self.beta, self.mean, self.var, False, 0.1, 1e-05, False)\n"
             : "    y = c\n";
  body += "    z = " + act + "\n";
  body += return_conv ? "    return (z, c)\n" : "    return z\n";
  m.define("def forward(self, x):\n" + body);
  m.eval();
  m.to(dtype);
  return m;
}

}  // namespace fusion_jit::testing
