// Regression tests of wrong results and of serving from many threads (issue 13): each failed before its
// fix. Through the TorchScript path (compile) and trace(); the torch.compile path is in
// tests/python/test_correctness.py.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <thread>

#include "codegen/kernel_spec.h"
#include "fusion_jit/cache.h"
#include "test_util.h"

namespace fusion_jit::testing {
namespace {

// The plan's result (the first call of a signature returns the capture run's result).
c10::IValue second_call(CompiledModule& f, const std::vector<c10::IValue>& in) {
  f(in);
  return f(in);
}

TEST(WrongResults, RandomDrawsAreNotMergedAndFollowEagersGenerator) {
  auto m = script("x", "    a = torch.rand_like(x)\n    b = torch.rand_like(x)\n    return a - b + x * 0.0");
  at::Tensor x = at::zeros({64});
  auto fused = compile(m);
  at::Tensor r = second_call(fused, {x}).toTensor();
  EXPECT_GT(r.abs().max().item<double>(), 0) << "rand_like(x) - rand_like(x) was merged into zeros\n"
                                              << fused.explain({x});
  at::manual_seed(7);
  at::Tensor eager = m.forward({x}).toTensor();
  at::manual_seed(7);
  at::Tensor got = fused({x}).toTensor();
  EXPECT_TRUE(got.equal(eager)) << "the plan did not draw eager's numbers in eager's order";
  const ExecutablePlan* plan = fused.plan_for({x});
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->aten_ops.at("aten::rand_like"), 2) << plan->explain();
}

TEST(WrongResults, RandomDrawOfAFrozenWeightIsNotFolded) {
  torch::jit::Module m("Noise");
  m.register_parameter("w", at::ones({8}), false);
  m.define("def forward(self, x):\n    return torch.randn_like(self.w) * 2.0 + x\n");
  m.eval();
  auto fused = compile(m);
  at::Tensor x = at::zeros({8});
  at::Tensor a = second_call(fused, {x}).toTensor().clone();
  at::Tensor b = fused({x}).toTensor();
  EXPECT_FALSE(a.equal(b)) << "randn_like(frozen weight) was folded into one constant";
  at::manual_seed(3);
  at::Tensor eager = m.forward({x}).toTensor();
  at::manual_seed(3);
  EXPECT_TRUE(fused({x}).toTensor().equal(eager));
}

TEST(WrongResults, RandomDrawsKeepTheirOrderAcrossFusedGroups) {
  // r1 uses a group that needs r2's value: fusing exp(x) with the add after r2 would run r2 before r1.
  auto m = script("x", "    a = torch.exp(x)\n    r1 = torch.rand_like(a)\n    r2 = torch.rand_like(x)\n"
                       "    c = a + r2\n    return (r1, c)");
  at::Tensor x = at::randn({32});
  auto fused = compile(m);
  second_call(fused, {x});
  at::manual_seed(11);
  auto eager = flatten(m.forward({x}));
  at::manual_seed(11);
  auto got = flatten(fused({x}));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].equal(eager[0])) << fused.explain({x});
  EXPECT_TRUE(check_close(got[1], eager[1]).ok) << fused.explain({x});
}

TEST(WrongResults, TracedRandomDrawsFollowEager) {
  auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::rand_like(in[0]) - at::rand_like(in[0])};
  };
  at::Tensor x = at::zeros({16});
  auto f = trace(fn, {x});
  second_call(f, {x});
  at::manual_seed(5);
  at::Tensor eager = fn({x})[0];
  at::manual_seed(5);
  at::Tensor got = flatten(f({x}))[0];
  EXPECT_TRUE(got.equal(eager));
  EXPECT_GT(got.abs().max().item<double>(), 0);
}

TEST(WrongResults, EvalDropoutStaysPure) {
  // dropout with train=False is the identity: no side effects, so it may be removed or merged.
  auto m = script("x", "    y = torch.dropout(x, 0.5, False)\n    return torch.relu(y) * 2.0");
  auto r = run_and_compare(m, {at::randn({32})}, "eval dropout");
  ASSERT_NE(r.plan, nullptr);
}

TEST(WrongResults, FoldedConstantOutputIsNewAtEveryCall) {
  // g(x) = (x + 1, tensor([1, 2]) * 2): the second output folds to a constant.
  at::Tensor c = at::tensor({1.0f, 2.0f});
  auto fn = [c](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + 1, c * 2}; };
  at::Tensor x = at::zeros({2});
  auto f = trace(fn, {x});
  for (int call = 0; call < 3; ++call) {
    auto out = flatten(f({x}));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(out[1].equal(at::tensor({2.0f, 4.0f}))) << "call " << call << " returned " << out[1];
    out[1].mul_(100);  // the caller's tensor: changing it must not change later results
    out[0].add_(5);
  }
  EXPECT_TRUE(c.equal(at::tensor({1.0f, 2.0f})));
}

TEST(WrongResults, FrozenWeightReturnedIsACopy) {
  torch::jit::Module m("ReturnsWeight");
  m.register_parameter("w", at::ones({4}), false);
  m.define("def forward(self, x):\n    return (x * 2.0, self.w * 3.0, self.w.t())\n");
  m.eval();
  auto fused = compile(m);
  at::Tensor x = at::ones({4});
  for (int call = 0; call < 3; ++call) {
    auto out = flatten(fused({x}));
    ASSERT_EQ(out.size(), 3u);
    EXPECT_TRUE(out[1].equal(at::full({4}, 3.0f))) << "call " << call;
    EXPECT_TRUE(out[2].equal(at::ones({4}))) << "call " << call;
    out[1].zero_();
    out[2].zero_();
  }
}

TEST(WrongResults, InputMutatedOnceWhenCaptureFails) {
  // x.add_ on an input stays in-place after mutation removal: capture refuses it before running anything,
  // and the eager run is the only one that changes x.
  auto m = script("x", "    x.add_(1.0)\n    return x * 2.0");
  auto fused = compile(m);
  at::Tensor x = at::zeros({4});
  at::Tensor out = fused({x}).toTensor();
  EXPECT_TRUE(x.equal(at::ones({4}))) << "input after one call: " << x;
  EXPECT_TRUE(out.equal(at::full({4}, 2.0f))) << out;
  EXPECT_EQ(fused.plan_for({x}), nullptr);
  EXPECT_NE(fused.explain({x}).find("in-place"), std::string::npos) << fused.explain({x});
}

TEST(WrongResults, RequiresGradInputsKeepTheirHistory) {
  auto fn = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * 2).exp()}; };
  at::Tensor x = at::randn({8}).requires_grad_(true);
  auto f = trace(fn, {x.detach()});
  for (int call = 0; call < 2; ++call) {
    at::Tensor y = flatten(f({x}))[0];
    ASSERT_TRUE(y.requires_grad()) << "call " << call << " dropped the grad history";
    x.mutable_grad() = at::Tensor();
    y.sum().backward();
    EXPECT_TRUE(check_close(x.grad(), (x.detach() * 2).exp() * 2).ok);
  }
  EXPECT_EQ(f.plan_for({x}), nullptr) << "a requires_grad signature runs eagerly";
  EXPECT_NE(f.explain({x}).find("requires grad"), std::string::npos) << f.explain({x});
  // Without grad mode there is no history to keep: the same inputs compile.
  c10::NoGradGuard no_grad;
  EXPECT_NE(f.plan_for({x}), nullptr);
  EXPECT_TRUE(check_close(flatten(f({x}))[0], (x * 2).exp()).ok);
}

TEST(WrongResults, PooledOutputsCanBeResized) {
  // Outputs of 1 MB and more come from the buffer pool; eager's outputs can be resize_d, so ours too.
  auto m = script("x", "    return torch.exp(x) * 2.0");
  at::Tensor x = at::randn({512, 1024});
  auto fused = compile(m);
  for (int call = 0; call < 2; ++call) {
    at::Tensor out = second_call(fused, {x}).toTensor();
    at::Tensor before = out.clone();
    out.resize_({1024, 1024});
    EXPECT_TRUE(out.slice(0, 0, 512).equal(before));
    out.resize_({4});
    out.fill_(1.0f);
    EXPECT_TRUE(out.equal(at::ones({4})));
  }
  at::Tensor small = fused({at::randn({2, 8})}).toTensor();  // not pooled: torch's allocator
  small.resize_({64, 64});
  EXPECT_EQ(small.numel(), 64 * 64);
}

// Compiling a signature holds, in its lowering (a kernel hook, Note [Kernel hooks]), until a call of
// another signature has been served: a call that waits for the compile never returns before the hook
// gives up (30 s), and `served` stays 0.
std::atomic<bool> g_hold_lowering{false};
std::atomic<int64_t> g_served{0};

void hold_until_served(const FusionGroup&, KernelSpec&) {
  if (!g_hold_lowering) return;
  const auto t0 = std::chrono::steady_clock::now();
  while (g_served == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(Serving, CompilingOneSignatureDoesNotBlockAnother) {
  auto m = script("x", "    return torch.tanh(x * 1.5) + torch.sigmoid(x)");
  KernelHooks hooks;
  hooks.after_lowering = hold_until_served;
  set_kernel_hooks(hooks);
  g_hold_lowering = false;
  g_served = 0;
  auto fused = compile(m);
  at::Tensor small = at::randn({8});
  second_call(fused, {small});  // compiled
  std::atomic<bool> compiling{true};
  g_hold_lowering = true;
  std::thread compiler([&] {
    at::Tensor big = at::randn({3, 5});
    fused({big});
    compiling = false;
  });
  at::Tensor expected = m.forward({small}).toTensor();
  bool wrong = false;
  while (compiling && !wrong) {
    wrong = !check_close(fused({small}).toTensor(), expected).ok;
    if (compiling) g_served++;
  }
  compiler.join();
  g_hold_lowering = false;
  set_kernel_hooks({});
  EXPECT_FALSE(wrong);
  EXPECT_GT(g_served.load(), 0) << "calls of a compiled signature waited for another signature's compile";
  EXPECT_EQ(fused.stats().signatures, 2);
}

TEST(Serving, ManyThreadsGetEagersResults) {
  auto m = script("x, y", "    a = torch.relu(x) * y + 1.0\n    return (a.sum(1), torch.softmax(a, 1))");
  auto fused = compile(m);
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<std::vector<at::Tensor>> expected;
  for (int64_t n : {4, 5, 6, 7, 8, 9}) {
    inputs.push_back({at::randn({n, 16}), at::randn({n, 16})});
    expected.push_back(flatten(m.forward(inputs.back())));
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        size_t k = static_cast<size_t>(t + i) % inputs.size();
        auto got = flatten(fused(inputs[k]));
        for (size_t o = 0; o < got.size(); ++o) bad += !check_close(got[o], expected[k][o]).ok;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(fused.stats().signatures, 6);
  EXPECT_EQ(fused.stats().calls, 8 * 40);
}

// Four threads each calling `fused` `calls` times, thread t on inputs[(t * stride + i) % size]: the number of
// outputs unlike `expected` (eager's).
int wrong_results_from_threads(CompiledModule& fused, const std::vector<std::vector<c10::IValue>>& inputs,
                               const std::vector<std::vector<at::Tensor>>& expected, int calls, int stride) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < calls; ++i) {
        size_t k = static_cast<size_t>(t * stride + i) % inputs.size();
        auto got = flatten(fused(inputs[k]));
        for (size_t j = 0; j < got.size(); ++j) bad += !check_close(got[j], expected[k][j]).ok;
      }
    });
  for (auto& th : threads) th.join();
  return bad.load();
}

// Threads calling more sizes than the table keeps (Note [Shared plans are kept by recency]): plans are
// dropped and built again while other threads run them; every result is eager's.
TEST(Serving, ThreadsCyclingSizesPastTheSharedBound) {
  auto m = script("x, y", "    a = torch.relu(x) * y + 1.0\n    return (a.sum(1), torch.softmax(a, 1))");
  CompileOptions o;
  o.shared_plans = 2;
  auto fused = compile(m, o);
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<std::vector<at::Tensor>> expected;
  for (int64_t n = 3; n < 13; ++n) {
    inputs.push_back({at::randn({n, 16}), at::randn({n, 16})});
    expected.push_back(flatten(m.forward(inputs.back())));
  }
  fused(inputs[0]);
  fused(inputs[1]);  // the code every later size reuses
  EXPECT_EQ(wrong_results_from_threads(fused, inputs, expected, 30, 3), 0);
  EXPECT_GT(fused.stats().plans_dropped, 0);
  EXPECT_LE(fused.stats().plans_kept, 2 + 2);
  EXPECT_EQ(fused.stats().eager_calls, 0);
}

// A frozen conv net (batch norm folded into the conv, Note [Folded constants shared across signatures])
// served from four threads at nine batch sizes, plans dropped past the shared bound and built again while
// other threads fold the same weights: every result is eager's.
TEST(Serving, ThreadsFoldingOneFrozenWeightForManyBatchSizes) {
  auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat);
  CompileOptions o;
  o.shared_plans = 3;
  auto fused = compile(m, o);
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<std::vector<at::Tensor>> expected;
  for (int64_t n = 1; n < 10; ++n) {
    inputs.push_back({at::randn({n, 8, 12, 12})});
    expected.push_back(flatten(m.forward(inputs.back())));
  }
  EXPECT_EQ(wrong_results_from_threads(fused, inputs, expected, 24, 5), 0);
  EXPECT_EQ(fused.stats().eager_calls, 0);
}

// CompileOptions::remote_cache and remote_cache_key_file (process-wide, as the environment): both or
// neither, a malformed URL named; nothing is compiled or changed on error. (The tier itself:
// tests/unit/remote_cache_test.cpp, tests/cli_test.py, tests/python/test_remote_cache.py.)
TEST(Serving, RemoteCacheOptionsAreChecked) {
  auto m = script("x", "    return torch.relu(x)");
  CompileOptions o;
  o.remote_cache = "redis://127.0.0.1:1";
  try {
    compile(m, o);
    ADD_FAILURE() << "a URL without a key file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("go together"), std::string::npos) << e.what();
  }
  o.remote_cache = "http://127.0.0.1:1";
  o.remote_cache_key_file = "/nonexistent/key";
  try {
    compile(m, o);
    ADD_FAILURE() << "a malformed URL was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("remote_cache=http://127.0.0.1:1: unknown scheme"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(cache::remote().address.empty()) << "the process's tier was changed by a rejected option";
}

// The specialization limit and its warning (one, whatever the number of signatures past it), the same
// for a TorchScript module and for a graph handed over as IR text: both keep their plans in one table.
// The same for the graph functions of the C++ API (and of the Python backend): a signature whose input
// requires grad under grad mode is eager, so the caller's eager run keeps the history.
TEST(WrongResults, GraphFunctionInputsRequiringGradRunEagerly) {
  GraphFunction f("graph");
  const std::string ir = "graph(%0 : f32[8]):\n  %1 : f32[8] = aten::exp(%0)\n  return (%1)\n";
  at::Tensor x = at::randn({8}).requires_grad_(true);
  std::vector<at::Tensor> outs;
  EXPECT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kNoPlan);
  GraphPlanInfo info = f.add({x}, "", ir, {});
  EXPECT_FALSE(info.compiled) << "a plan would return results without grad history";
  EXPECT_NE(info.eager_reason.find("input 0 requires grad"), std::string::npos) << info.eager_reason;
  EXPECT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kEager);
  EXPECT_EQ(f.num_plans(), 0);
  // Without grad mode the same input compiles, and the earlier eager entry does not stand in its way.
  c10::NoGradGuard no_grad;
  EXPECT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kNoPlan);
  EXPECT_TRUE(f.add({x}, "", ir, {}).compiled);
  ASSERT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kRan);
  EXPECT_TRUE(check_close(outs.at(0), x.exp()).ok);
}

TEST(Serving, TheLimitWarnsOnceForModulesAndGraphFunctions) {
  std::vector<std::string> warnings;
  CompileOptions o;
  o.specialization_limit = 1;
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto m = script("x", "    return torch.relu(x) + 1.0");
  auto fused = compile(m, o);
  for (int64_t n : {4, 5, 6, 5, 7}) fused({at::randn({n})});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("specialization limit of 1 signatures reached"), std::string::npos) << warnings[0];
  EXPECT_EQ(fused.stats().signatures, 1);
  EXPECT_EQ(fused.stats().eager_calls, 4);

  warnings.clear();
  GraphFunction f("graph", o);
  const std::string ir = "graph(%0 : f32[4]):\n  %1 : f32[4] = aten::relu(%0)\n  return (%1)\n";
  std::vector<at::Tensor> outs;
  at::Tensor x = at::tensor({-1.0f, 2.0f, -3.0f, 4.0f});
  EXPECT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kNoPlan);
  GraphPlanInfo info = f.add({x}, "", ir, {});
  EXPECT_TRUE(info.compiled && info.added_here);
  EXPECT_EQ(f.run({x}, "", &outs), GraphFunction::Status::kRan);
  EXPECT_TRUE(outs.at(0).equal(at::relu(x)));
  // Another key is another signature: past the limit, eager, with one warning.
  EXPECT_EQ(f.run({x}, "other", &outs), GraphFunction::Status::kEager);
  EXPECT_EQ(f.run({x}, "third", &outs), GraphFunction::Status::kEager);
  EXPECT_FALSE(f.add({x}, "fourth", ir, {}).compiled);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("specialization limit of 1"), std::string::npos) << warnings[0];
  EXPECT_EQ(f.num_plans(), 1);
  // A second add of a known signature returns its plan, compiled once.
  GraphPlanInfo again = f.add({x}, "", ir, {});
  EXPECT_TRUE(again.compiled);
  EXPECT_FALSE(again.added_here);
}

// Threads adding the same new signature of a graph function: one compiles, the others wait and get its
// plan.
TEST(Serving, GraphFunctionCompilesASignatureOnce) {
  GraphFunction f("graph");
  const std::string ir = "graph(%0 : f32[8]):\n  %1 : f32[8] = aten::sigmoid(%0)\n  return (%1)\n";
  at::Tensor x = at::randn({8});
  std::atomic<int> compiled{0}, ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<at::Tensor> outs;
      if (f.run({x}, "", &outs) == GraphFunction::Status::kNoPlan) compiled += f.add({x}, "", ir, {}).added_here;
      ran += f.run({x}, "", &outs) == GraphFunction::Status::kRan && check_close(outs.at(0), at::sigmoid(x)).ok;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(compiled.load(), 1);
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(f.num_plans(), 1);
}

}  // namespace
}  // namespace fusion_jit::testing
