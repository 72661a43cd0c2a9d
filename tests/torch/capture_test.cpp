// Capture, signatures, fallback and tracing, through the public API.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <iostream>
#include <thread>

#include "cat_corpus.h"
#include "runtime/buffer_pool.h"
#include "support/options.h"
#include "support/error.h"
#include "test_util.h"
#include "torch/executor.h"

namespace fusion_jit::testing {
namespace {

// Note [ATen steps' buffers from the pool]: while a plan runs, torch's CPU allocator serves large requests
// (here the result of the plan's one ATen step, mm's [512, 1024] float32: 2 MB) from the buffer pool, and
// they go back to it when freed, already mapped: the next call gets the same buffer. Outside a plan's run
// the same request goes to torch's allocator, and raw allocations (oneDNN's, through ideep) round-trip.
TEST(Capture, AtenStepsLargeBuffersComeFromThePoolWhileAPlanRuns) {
  if (Options::get().cpu_pool_mb == 0) GTEST_SKIP() << "FUSION_JIT_CPU_POOL_MB=0: no pool";
  auto m = script("x, w", "    return torch.mm(x, w)");
  std::vector<c10::IValue> in = {at::randn({512, 256}), at::randn({256, 1024})};
  auto r = run_and_compare(m, in, "mm");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_TRUE(r.plan->kernels.empty()) << r.plan->explain();
  r.fused.clear();
  BufferPool& pool = BufferPool::instance();
  const auto requests = [&] { return pool.stats().hits + pool.stats().misses; };
  const int64_t before = requests();
  {
    at::Tensor outside = at::empty({512, 1024});
    outside.fill_(1);
    void* raw = c10::GetCPUAllocator()->raw_allocate(size_t{4} << 20);
    c10::GetCPUAllocator()->raw_deallocate(raw);
  }
  EXPECT_EQ(requests(), before) << "requests outside a plan's run";
  const void* first = nullptr;
  const int64_t hits = pool.stats().hits;
  for (int i = 0; i < 3; ++i) {
    at::Tensor out = flatten((*r.compiled)(in)).at(0);
    if (i == 0) {
      first = out.data_ptr();
    } else {
      EXPECT_EQ(out.data_ptr(), first) << "call " << i << ": the buffer freed by the call before";
    }
    EXPECT_TRUE(at::allclose(out, at::mm(in[0].toTensor(), in[1].toTensor()), 1e-4, 1e-4));
  }
  EXPECT_GE(requests() - before, 3);
  EXPECT_GE(pool.stats().hits - hits, 2);
}

TEST(Capture, ModuleWithParametersFreezesAndFuses) {
  torch::jit::Module m("Block");
  m.register_parameter("w", at::randn({16, 16}), false);
  m.register_parameter("b", at::randn({16}), false);
  m.define(R"(
def forward(self, x):
    h = torch.matmul(x, self.w) + self.b
    return torch.gelu(h) + x
)");
  m.eval();
  auto r = run_and_compare(m, {at::randn({4, 16})}, "block");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  EXPECT_EQ(r.plan->aten_ops.at("aten::matmul"), 1);
}

// compile() freezes a copy of the module (the header's promise): parameters and buffers changed in place
// afterwards (folded into the convolution, read by a kernel as a constant, read by an ATen step) are seen by
// no signature, compiled before or after the change. A plan mixing folded old weights with the caller's
// storage would fail here; freeze_module's constants are copies, so none does.
TEST(Capture, CompileFreezesACopyThatLaterChangesDoNotReach) {
  torch::jit::Module m("Block");
  m.register_parameter("w", at::randn({16, 8, 3, 3}) * 0.2, false);
  m.register_parameter("b", at::randn({16}) * 0.1, false);
  m.register_buffer("gamma", at::rand({16}) + 0.5);
  m.register_buffer("beta", at::randn({16}) * 0.1);
  m.register_buffer("mean", at::randn({16}) * 0.1);
  m.register_buffer("var", at::rand({16}) + 0.5);
  m.register_parameter("scale", at::rand({16, 1, 1}) + 0.5, false);
  m.register_parameter("proj", at::randn({12, 12}) * 0.3, false);
  m.register_parameter("shift", at::randn({8, 1, 1}), false);
  m.define("def forward(self, x):\n"
           "    c = torch.conv2d(torch.tanh(x + self.shift), self.w, self.b, [1, 1], [1, 1], [1, 1], 1)\n"
           "    y = torch.batch_norm(c, self.gamma, self.beta, self.mean, self.var, False, 0.1, 1e-05, False)\n"
           "    return torch.matmul(torch.relu(y) * self.scale, self.proj)\n");
  m.eval();
  at::Tensor x = at::randn({2, 8, 12, 12}), x2 = at::randn({1, 8, 12, 12});
  const at::Tensor want = m.forward({x}).toTensor(), want2 = m.forward({x2}).toTensor();
  auto fused = compile(m);
  ASSERT_TRUE(check_close(fused({x}).toTensor(), want).ok);
  ASSERT_NE(fused.plan_for({x}), nullptr);
  {
    c10::NoGradGuard no_grad;
    m.attr("scale").toTensor().mul_(-3);
    m.attr("gamma").toTensor().mul_(2);
    m.attr("proj").toTensor().mul_(-1);
    m.attr("shift").toTensor().mul_(-1);
  }
  ASSERT_FALSE(check_close(m.forward({x}).toTensor(), want).ok) << "the module itself sees its change";
  auto got = check_close(fused({x}).toTensor(), want);
  EXPECT_TRUE(got.ok) << "the compiled copy saw the module's change: " << got.message;
  auto got2 = check_close(fused({x2}).toTensor(), want2);
  EXPECT_TRUE(got2.ok) << "a signature compiled after the change: " << got2.message;
}

// A call three levels down (forward -> impl -> sub.forward -> sub.helper), as a TorchScript ResNet's
// forward -> _forward_impl -> Conv2d.forward -> _conv_forward, with the graph executor's optimization off (as the CLI and these tests
// run): torch's Inline took one level per run, and freezing then left a call to a method it had removed
// ("Couldn't find method: '_conv_forward'"); every level is inlined now.
TEST(Capture, CallsSeveralLevelsDeepAreInlined) {
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module sub("Sub");
  sub.register_parameter("w", at::randn({8}), false);
  sub.define("def helper(self, x):\n    return torch.relu(x) * self.w\n"
             "def forward(self, x):\n    return self.helper(x) + 1.0\n");
  torch::jit::Module m("Top");
  m.register_module("sub", sub);
  m.define("def impl(self, x):\n    return torch.tanh(self.sub.forward(x)) - 3.0\n"
           "def forward(self, x):\n    return self.impl(x)\n");
  m.eval();
  auto r = run_and_compare(m, {at::randn({4, 8})}, "nested calls");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  EXPECT_TRUE(r.plan->aten_ops.empty()) << r.plan->explain();
}

TEST(Capture, ShapeArithmeticBecomesLiterals) {
  auto m = script("x", "    n = x.size(0) * 2\n    y = x.view(n, -1)\n    return torch.relu(y) * 2.0");
  auto r = run_and_compare(m, {at::randn({4, 6})}, "view");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  r = run_and_compare(m, {at::randn({2, 10})}, "view, another shape");
}

TEST(Capture, TupleAndIntermediateOutputs) {
  auto m = script("x", "    a = torch.exp(x)\n    b = a * 2.0\n    return (a, b, torch.cumsum(b, 0))");
  auto r = run_and_compare(m, {at::randn({8})}, "tuple");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
}

// Branches the input signature decides (Note [Shape-only branches]) are captured as the branch taken: a
// rank check that raises (BatchNorm's _check_input_dim), and a branch on a size, per signature.
TEST(Capture, BranchesOnShapesAreCapturedAsTheBranchTaken) {
  auto check = script("x", "    assert x.dim() == 2, 'expected a 2-d input'\n    return torch.relu(x) * 2.0");
  auto r = run_and_compare(check, {at::randn({4, 6})}, "rank check");
  ASSERT_NE(r.plan, nullptr) << "captured";
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  auto fused = compile(check);
  try {
    fused({at::randn({4})});
    ADD_FAILURE() << "a 1-d input did not raise";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected a 2-d input"), std::string::npos) << "the model's own error: " << e.what();
  }
  EXPECT_NE(fused.explain({at::randn({4})}).find("the model raises on this input signature"), std::string::npos)
      << fused.explain({at::randn({4})});

  auto by_size = script("x", "    if x.size(0) > 2:\n        y = x * 2.0\n    else:\n        y = x - 1.0\n"
                             "    return torch.tanh(y)");
  for (int64_t n : {4, 1}) {
    auto rr = run_and_compare(by_size, {at::randn({n, 3})}, "size branch, n = " + std::to_string(n));
    ASSERT_NE(rr.plan, nullptr) << n;
    EXPECT_EQ(rr.plan->kernels.size(), 1u) << rr.plan->explain();
    EXPECT_EQ(rr.plan->fused_ops, 2) << "the branch taken and tanh\n" << rr.plan->explain();
  }
}

TEST(Capture, ControlFlowRunsEagerlyWithAReason) {
  auto m = script("x", "    if bool(x.sum() > 0):\n        return x * 2.0\n    return x - 1.0");
  auto fused = compile(m);
  at::Tensor x = at::ones({3});
  EXPECT_TRUE(fused({x}).toTensor().equal(x * 2.0));
  EXPECT_EQ(fused.plan_for({x}), nullptr);
  std::string why = fused.explain({x});
  EXPECT_EQ(why.rfind("runs eagerly: ", 0), 0u) << why;
  EXPECT_NE(why.find("not captured"), std::string::npos) << why;
  EXPECT_EQ(fused.stats().eager_calls, 1);
}

TEST(Capture, InPlaceOpsAreMadeFunctional) {
  auto m = script("x", "    y = x * 2.0\n    y.add_(1.0)\n    torch.relu_(y)\n    return y");
  auto r = run_and_compare(m, {at::randn({16})}, "in-place");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
}

// Note [Scalars freezing would drop]: TorchScript's freezing would turn `mask * 1` and `mask + 0` into
// the bool mask itself (eager's are int64) and `mask - 0` (eager raises) into it too; the plan and the
// eager fallback keep eager's dtypes and error, in a branch as at the top, and the user's module is left
// without the attributes the compile adds to its copy.
TEST(Capture, IntegerLiteralsThatFreezingWouldDropKeepEagersDtype) {
  auto m = script("x, y",
                  "    mask = x > 0\n"
                  "    a = mask * 1\n"
                  "    if x.dim() == 1:\n        b = (y > 0) + 0\n    else:\n        b = mask * 2\n"
                  "    return a, b, x * 1, x + 0");
  auto r = run_and_compare(m, {at::randn({16}), at::randn({16})}, "x * 1 of a bool mask");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_EQ(r.fused.size(), 4u);
  for (size_t i = 0; i < r.fused.size(); ++i) EXPECT_EQ(r.fused[i].scalar_type(), r.eager[i].scalar_type()) << i;
  EXPECT_EQ(r.fused[0].scalar_type(), at::kLong);
  EXPECT_EQ(r.fused[1].scalar_type(), at::kLong);
  EXPECT_FALSE(m.hasattr("_fj_int_1")) << "the user's module was changed";
  auto bad = script("x", "    return (x > 0) - 0");
  EXPECT_THROW(bad.forward({at::randn({4})}), std::exception);
  EXPECT_THROW(compile(bad)({at::randn({4})}), std::exception) << "eager raises on bool - 0";
}

TEST(Capture, OneCompiledPlanPerSignatureUpToTheLimit) {
  auto m = script("x", "    return torch.sigmoid(x) * x");
  CompileOptions o;
  o.specialization_limit = 2;
  o.dynamic = "off";  // each size its own kernels (the next test: sizes as arguments)
  auto fused = compile(m, o);
  for (int n : {3, 3, 4, 5, 6}) {
    at::Tensor x = at::randn({n});
    EXPECT_TRUE(at::allclose(fused({x}).toTensor(), at::sigmoid(x) * x));
  }
  auto s = fused.stats();
  EXPECT_EQ(s.signatures, 2);    // [3] and [4]
  EXPECT_EQ(s.eager_calls, 2);   // [5] and [6], past the limit
  EXPECT_EQ(s.calls, 5);
  // Strides are part of the signature.
  at::Tensor t = at::randn({4, 3}).t();
  EXPECT_NE(fused.explain({t}).find("specialization limit of 2 signatures reached"), std::string::npos);
}

// Note [Sizes as kernel arguments]: under FUSION_JIT_DYNAMIC=auto (the default) the first signature is
// compiled with literal sizes and the second with sizes as arguments; every later signature that differs
// only in sizes reuses the second's kernels: no compiler runs, it does not count against the limit, and
// past the limit it is still served. Sizes: primes, vector-width multiples and their neighbours, rows
// longer than a chunk; then one row and an empty tensor (a size-1 dim broadcasts: another class, past
// the limit it runs eagerly). Each against eager.
TEST(DynamicSizes, SignaturesThatDifferInSizesShareKernels) {
  auto m = script("x, y", "    a = torch.relu(x) * y + 1.0\n    return (torch.softmax(a, 1), a.sum(1))");
  CompileOptions o;
  o.specialization_limit = 2;
  std::vector<std::string> warnings;
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto fused = compile(m, o);
  auto run = [&](int64_t rows, int64_t cols) {
    return compare_with_eager(fused, m, {at::randn({rows, cols}), at::randn({cols})}, fmt::format("[{},{}]", rows, cols))
        .plan;
  };
  const int64_t compiles = counters().host_compiles;
  const ExecutablePlan* first = run(4, 5);
  ASSERT_NE(first, nullptr);
  for (const auto& k : first->kernels) EXPECT_TRUE(k.spec.args.empty()) << "the first signature is static";
  const ExecutablePlan* second = run(7, 17);
  ASSERT_NE(second, nullptr);
  ASSERT_FALSE(second->kernels.empty());
  for (const auto& k : second->kernels) EXPECT_FALSE(k.spec.args.empty()) << "the second reads its sizes";
  const int64_t after_two = counters().host_compiles;
  EXPECT_LE(after_two - compiles, 2);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{13, 31}, {3, 15}, {64, 16}, {2, 33}, {129, 257}, {5, 1031}}) {
    const ExecutablePlan* p = run(rows, cols);
    ASSERT_NE(p, nullptr) << rows << "x" << cols << " ran eagerly: " << fused.explain({at::randn({rows, cols}), at::randn({cols})});
    EXPECT_EQ(p->code_class, second->code_class) << rows << "x" << cols;
  }
  EXPECT_EQ(counters().host_compiles, after_two) << "sizes of the second signature's class compile nothing";
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(fused.stats().signatures, 8);
  EXPECT_EQ(fused.stats().eager_calls, 0);
  // A size-1 dim and an empty tensor: their results are eager's, whichever way they run.
  run(1, 9);
  run(0, 9);
  EXPECT_EQ(counters().host_compiles, after_two) << "past the limit a new class is not compiled";
  EXPECT_LE(warnings.size(), 1u) << "the limit warns once";
  for (const auto& w : warnings) EXPECT_NE(w.find("specialization limit of 2 signatures reached"), std::string::npos) << w;
}

// Note [Shared plans are kept by recency]: a served model that sees a new size in every call holds a
// bounded number of plans. Past CompileOptions::shared_plans, the least recently called plan that reuses
// another's kernels is dropped; its signature, should it come back, is built again without a compiler.
// Signatures recorded as eager past the limit are bounded the same way. Each result against eager.
TEST(DynamicSizes, SharedPlansAreKeptByRecency) {
  auto m = script("x", "    return torch.softmax(torch.relu(x) * 2.0, 1)");
  CompileOptions o;
  o.specialization_limit = 2;
  o.shared_plans = 3;
  o.on_warning = [](const std::string&) {};
  auto fused = compile(m, o);
  auto run = [&](int64_t rows, int64_t cols) {
    at::Tensor x = at::randn({rows, cols});
    auto c = check_close(fused({x}).toTensor(), m.forward({x}).toTensor());
    EXPECT_TRUE(c.ok) << rows << "x" << cols << ": " << c.message;
  };
  run(4, 5);  // static
  run(6, 7);  // sizes as arguments: brings the code the later ones reuse
  const int64_t compiles = counters().host_compiles;
  for (int64_t n = 8; n < 20; ++n) {
    run(n, n + 3);
    EXPECT_LE(fused.stats().plans_kept, 2 + 3) << n;
  }
  EXPECT_EQ(fused.stats().plans_dropped, 12 - 3);
  EXPECT_EQ(fused.stats().signatures, 14);
  // The most recent three are kept; an older one is built again, and nothing is compiled.
  run(19, 22);
  EXPECT_EQ(fused.stats().signatures, 14);
  run(8, 11);
  EXPECT_EQ(fused.stats().signatures, 15);
  EXPECT_EQ(fused.stats().plans_dropped, 10);
  // A call refreshes its plan: 8x11 was called last, so the next drop is another one.
  run(8, 11);
  run(30, 31);
  run(8, 11);
  EXPECT_EQ(fused.stats().signatures, 16);
  EXPECT_EQ(counters().host_compiles, compiles) << "a plan built again reuses the kept kernels";
  // The two signatures the limit counts are never dropped.
  run(4, 5);
  run(6, 7);
  EXPECT_EQ(fused.stats().signatures, 16);
  // Eager records past the limit (a dim of 1 is another class, not compiled past it) are bounded too.
  for (int64_t n = 2; n < 12; ++n) run(1, n);
  EXPECT_LE(fused.stats().plans_kept, 2 + 3);
  EXPECT_EQ(fused.stats().eager_calls, 10);
}

// A graph whose plan has no kernel of ours (here a matmul and a view: ATen's steps only) compiles nothing
// for a new signature, so signatures past the specialization limit still get plans, kept by recency as the
// shared ones are. Before, each of them counted against the limit, and a served model whose graph ran
// entirely in library calls (a linear with oneDNN's post-op after another) ran eagerly from its ninth
// length on.
TEST(DynamicSizes, PlansWithoutKernelsDoNotCountAgainstTheLimit) {
  auto m = script("x", "    return torch.matmul(x, x.t()).view(-1)");
  CompileOptions o;
  o.specialization_limit = 2;
  o.shared_plans = 3;
  std::vector<std::string> warnings;
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto fused = compile(m, o);
  const int64_t compiles = counters().host_compiles;
  for (int64_t n = 2; n < 14; ++n) {
    at::Tensor x = at::randn({n, 5});
    auto c = check_close(fused({x}).toTensor(), m.forward({x}).toTensor());
    EXPECT_TRUE(c.ok) << n << ": " << c.message;
    EXPECT_LE(fused.stats().plans_kept, 3) << n;
  }
  EXPECT_EQ(fused.stats().eager_calls, 0);
  EXPECT_EQ(fused.stats().signatures, 12);
  EXPECT_EQ(fused.stats().plans_dropped, 12 - 3);
  EXPECT_EQ(counters().host_compiles, compiles);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  // The limit still stops every compile at 0.
  o.specialization_limit = 0;
  auto none = compile(m, o);
  at::Tensor x = at::randn({3, 5});
  EXPECT_TRUE(check_close(none({x}).toTensor(), m.forward({x}).toTensor()).ok);
  EXPECT_EQ(none.stats().eager_calls, 1);
}

// A model compiled again (a restarted process, here a second module with a table of its own) whose first
// signature is a new size of a class compiled before: under auto its first plan reads its sizes, because
// that code is compiled already, and no compiler runs.
TEST(DynamicSizes, AFirstSignatureTakesSizeArgumentsWhenThatCodeIsCompiled) {
  auto m = script("x", "    return torch.softmax(torch.tanh(x) * 2.0, 1)");
  auto first = compile(m);
  first({at::randn({3, 6})});
  at::Tensor x = at::randn({5, 11});
  const ExecutablePlan* dynamic = first.plan_for({x});
  ASSERT_NE(dynamic, nullptr);
  ASSERT_FALSE(dynamic->kernels.empty());
  ASSERT_FALSE(dynamic->kernels[0].spec.args.empty());
  const int64_t compiles = counters().host_compiles;
  auto again = compile(m);
  at::Tensor y = at::randn({9, 23});
  EXPECT_TRUE(at::allclose(again({y}).toTensor(), at::softmax(at::tanh(y) * 2.0, 1), 1e-6, 1e-6));
  const ExecutablePlan* p = again.plan_for({y});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->code_class, dynamic->code_class);
  EXPECT_EQ(counters().host_compiles, compiles);
  // A size whose code nobody compiled: the first plan keeps literal sizes, as before.
  auto third = compile(script("x", "    return torch.sigmoid(x) - 1.5"));
  const ExecutablePlan* q = third.plan_for({at::randn({4, 4})});
  ASSERT_NE(q, nullptr);
  for (const auto& k : q->kernels) EXPECT_TRUE(k.spec.args.empty());
}

// Note [Shape classes of captured graphs]: a module's second signature that differs from its first only in
// sizes makes the shape class of the two captures, and every later signature whose capture is the class's
// graph at its sizes gets its plan as an instance of the class's plan: no passes, fusion, code generation
// or compiler. A transformer-like block (a frozen weight, a matmul, a softmax over the length, a reshape
// to the product of two extents, a layer norm, a sum over the length) at batch sizes and lengths; a
// batch of 1 (a size that is a class of its own) is planned on its own. Each result against eager.
TEST(DynamicSizes, LaterSignaturesOfAModuleAreInstancesOfItsShapeClass) {
  torch::jit::Module m("TestModule");
  m.register_parameter("w", at::randn({16}), false);
  m.define(
      "def forward(self, x):\n"
      "    b, l, h = x.size()\n"
      "    q = torch.relu(x) * self.w\n"
      "    s = torch.softmax(torch.matmul(q, x.transpose(1, 2)) / 4.0, -1)\n"
      "    y = torch.matmul(s, x).reshape(b * l, h)\n"
      "    return torch.layer_norm(y, [h]) + 1.0, y.sum(0), s.sum(-1)\n");
  m.eval();
  CompileOptions o;
  std::vector<std::string> warnings;
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto fused = compile(m, o);
  auto run = [&](int64_t b, int64_t l) {  // the plan's run, not the capture's
    return compare_with_eager(fused, m, {at::randn({b, l, 16})}, fmt::format("[{},{},16]", b, l)).plan;
  };
  const ExecutablePlan* first = run(2, 5);
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(first->bindings.empty()) << "the first signature is planned on its own";
  const ExecutablePlan* second = run(2, 9);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->bindings, (SymBindings{{"s0", 9}})) << second->explain();
  const int64_t compiles = counters().host_compiles;
  for (auto [b, l] : {std::pair<int64_t, int64_t>{2, 13}, {2, 2}, {2, 31}, {2, 64}, {2, 37}}) {
    const ExecutablePlan* p = run(b, l);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->bindings, (SymBindings{{"s0", l}})) << l << ": not an instance:\n" << p->explain();
    EXPECT_NE(fused.last_compile_report().find("an instance of its shape class's plan"), std::string::npos)
        << fused.last_compile_report();
  }
  EXPECT_EQ(counters().host_compiles, compiles) << "instances compile nothing";
  EXPECT_EQ(fused.stats().class_plans, 1);
  // Another batch size: a class of the two extents, from the captures at [3,7] and [4,7].
  run(3, 7);
  const ExecutablePlan* both = run(4, 11);
  ASSERT_NE(both, nullptr);
  EXPECT_EQ(both->bindings.size(), 2u) << both->explain();
  const int64_t compiles_two = counters().host_compiles;
  const ExecutablePlan* later = run(5, 19);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->bindings, (SymBindings{{"s0", 5}, {"s1", 19}})) << later->explain();
  EXPECT_EQ(counters().host_compiles, compiles_two);
  EXPECT_EQ(fused.stats().class_plans, 2);
  // A batch of 1 and a length of 1: dims that broadcast or merge, not in the class; eager's results.
  const ExecutablePlan* one = run(1, 9);
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(one->bindings.empty());
  run(2, 1);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(fused.stats().eager_calls, 0);
  // disable="symbolic.class": each signature planned on its own.
  o.disable = {"symbolic.class"};
  auto alone = compile(m, o);
  for (int64_t l : {5, 9, 13}) {
    const ExecutablePlan* p = alone.plan_for({at::randn({2, l, 16})});
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->bindings.empty()) << l;
  }
  EXPECT_EQ(alone.stats().class_plans, 0);
}

// Note [Shape classes of captured graphs]: a capture with an extent of 1 where the family's reference has
// more (a class of its own) does not replace the reference, so the next size still makes the class with it.
TEST(DynamicSizes, ASizeOfOneDoesNotReplaceTheFamilysReference) {
  auto m = script("x", "    return torch.softmax(torch.relu(x) * 0.5, -1), x.sum(1)");
  auto fused = compile(m, CompileOptions{});
  for (int64_t l : {5, 1, 7}) compare_with_eager(fused, m, {at::randn({3, l})}, fmt::format("[3,{}]", l));
  EXPECT_EQ(fused.stats().class_plans, 1) << fused.last_compile_report();
  const ExecutablePlan* p = compare_with_eager(fused, m, {at::randn({3, 9})}, "[3,9]").plan;
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->bindings, (SymBindings{{"s0", 9}})) << p->explain();
}

// Note [Shape classes of captured graphs] from many threads: four threads meet new lengths of one module
// at once (two of them sharing some), each result eager's; one class, and at most the two compiles of the
// first signature and the class.
TEST(DynamicSizes, ThreadsMeetingNewLengthsAtOnceGetEagersResults) {
  auto m = script("x", "    return torch.softmax(torch.relu(x) * 0.5, -1), x.sum(1)");
  auto fused = compile(m);
  const int64_t before = counters().host_compiles;
  std::atomic<int> ok{0}, wrong{0};
  std::vector<std::thread> threads;
  const std::vector<std::vector<int64_t>> lengths = {{16, 5, 40}, {37, 63, 9}, {21, 5, 33}, {7, 100, 12}};
  for (const auto& mine : lengths)
    threads.emplace_back([&, mine] {
      for (int round = 0; round < 2; ++round)
        for (int64_t n : mine) {
          std::vector<c10::IValue> in{at::randn({3, n})};
          auto got = flatten(fused(in)), want = flatten(m.forward(in));
          bool same = got.size() == want.size();
          for (size_t i = 0; same && i < want.size(); ++i) same = check_close(got[i], want[i]).ok;
          ++(same ? ok : wrong);
        }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load(), 24);
  EXPECT_EQ(fused.stats().signatures, 11);  // the distinct lengths
  EXPECT_EQ(fused.stats().eager_calls, 0);
  EXPECT_EQ(fused.stats().class_plans, 1);
  EXPECT_LE(counters().host_compiles - before, 2);
}

// A restarted process (here a second module, the on-disk cache kept) makes the same class from its first
// two captures and reads its plan from the plan cache (Note [Symbolic sizes in the plan cache]): no
// compiler runs, whatever lengths it meets first.
TEST(DynamicSizes, AWarmStartReadsTheCapturedClassFromThePlanCache) {
  auto m = script("x", "    return torch.layer_norm(torch.tanh(x) * 2.0, [x.size(-1)]) + 1.0");
  auto first = compile(m);
  for (int64_t n : {5, 9, 13}) first({at::randn({2, n, 24})});
  ASSERT_EQ(first.stats().class_plans, 1);
  const int64_t compiles = counters().host_compiles;
  auto again = compile(m);
  for (int64_t n : {6, 10, 14, 30}) compare_with_eager(again, m, {at::randn({2, n, 24})}, std::to_string(n));
  EXPECT_EQ(again.stats().class_plans, 1);
  EXPECT_EQ(counters().host_compiles, compiles) << "the first signature's code and the class's are in the caches";
  const ExecutablePlan* p = again.plan_for({at::randn({2, 30, 24})});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->bindings, (SymBindings{{"s0", 30}}));
}

// A capture whose number follows a size by chance: x.size(0) % 5 (a slice's end) is 2 and 3 at lengths 7
// and 8, which makes a class in which it is s0-5. A later length where it is not (12: 2, not 7) does not
// concretize to its capture, so it is not an instance of that class (it may make a class of its own with
// an earlier capture: 12 and 7 end at 2 both); one where it is (9) is an instance: every result is eager's.
TEST(DynamicSizes, ANumberThatFollowedASizeByChanceDoesNotJoinTheClass) {
  auto m = script("x", "    return torch.sigmoid(x[:x.size(0) % 5]) * 2.0");
  auto fused = compile(m);
  auto run = [&](int64_t len) { return compare_with_eager(fused, m, {at::randn({len})}, std::to_string(len)).plan; };
  run(7);
  const ExecutablePlan* cls = run(8);
  ASSERT_NE(cls, nullptr);
  EXPECT_EQ(cls->bindings, (SymBindings{{"s0", 8}})) << fused.explain({at::randn({8})});
  const ExecutablePlan* nine = run(9);
  ASSERT_NE(nine, nullptr);
  EXPECT_EQ(nine->bindings, (SymBindings{{"s0", 9}})) << fused.explain({at::randn({9})});
  for (int64_t len : {12, 13, 10, 11}) {
    const ExecutablePlan* p = run(len);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->explain().find("s0-5"), std::string::npos)
        << len << ": an instance of the class where s0-5 is not its number:\n" << p->explain();
  }
}

// dynamic="on" reads sizes from the first signature on; an unknown value names itself.
TEST(DynamicSizes, OnFromTheFirstSignatureAndABadValueIsAnError) {
  auto m = script("x", "    return torch.sigmoid(x) * x");
  CompileOptions o;
  o.dynamic = "on";
  auto fused = compile(m, o);
  at::Tensor x = at::randn({37});
  const ExecutablePlan* p = fused.plan_for({x});
  ASSERT_NE(p, nullptr);
  ASSERT_FALSE(p->kernels.empty());
  EXPECT_EQ(p->kernels[0].spec.args, std::vector<int64_t>({37}));
  EXPECT_TRUE(at::allclose(fused({x}).toTensor(), at::sigmoid(x) * x));
  o.dynamic = "sometimes";
  try {
    compile(m, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CompileOptions::dynamic=sometimes: expected auto, on or off"), std::string::npos)
        << e.what();
  }
}

TEST(Capture, WrongInputCountIsAUserError) {
  auto m = script("x, y", "    return x + y");
  auto fused = compile(m);
  // The eager fallback raises torch's own error, naming the argument that is missing; not any error.
  try {
    fused({at::ones({2})});
    ADD_FAILURE() << "one input of two did not raise";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward() is missing value for argument 'y'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fused.stats().signatures, 0) << "nothing was captured for a call that raised";
}

TEST(Trace, PlainFunctionIsTracedAndFused) {
  auto fn = [](const std::vector<at::Tensor>& in) {
    at::Tensor y = (in[0] * in[1] + 1.0).tanh();
    return std::vector<at::Tensor>{y, y.relu() - in[1]};
  };
  at::Tensor a = at::randn({32, 8}), b = at::randn({8});
  auto traced = trace(fn, {a, b});
  const ExecutablePlan* plan = traced.plan_for({a, b});
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->kernels.size(), 1u) << plan->explain();
  auto out = flatten(traced({a, b}));
  auto ref = fn({a, b});
  ASSERT_EQ(out.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(check_close(out[i], ref[i]).ok);
}

TEST(Plan, IntermediatesAreReleasedAndConstantsFolded) {
  torch::jit::Module m("Scale");
  m.register_parameter("s", at::full({8}, 2.0), false);
  m.define("def forward(self, x):\n    return x * (self.s * 3.0)\n");
  m.eval();
  auto r = run_and_compare(m, {at::randn({4, 8})}, "folded");
  ASSERT_NE(r.plan, nullptr);
  // s * 3.0 was folded into one constant: the kernel has one op.
  EXPECT_EQ(r.plan->fused_ops, 1) << r.plan->explain();
}

// The plan's next two calls (the first call gave the capture's eager result): each output's values and
// strides as eager's; `each` checks more on a call's outputs.
void expect_later_calls_match(const RunResult& r, const std::vector<c10::IValue>& in,
                              const std::function<void(std::vector<at::Tensor>&)>& each = nullptr) {
  for (int call = 0; call < 2; ++call) {
    auto out = flatten((*r.compiled)(in));
    ASSERT_EQ(out.size(), r.eager.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(check_close(out[i], r.eager[i]).ok) << "output " << i << "\n" << out[i] << "\n" << r.eager[i];
      EXPECT_EQ(out[i].sizes(), r.eager[i].sizes()) << "output " << i;
      if (out[i].numel() > 1) {
        EXPECT_EQ(out[i].strides(), r.eager[i].strides()) << "output " << i;
      }
    }
    if (each) each(out);
  }
}

// Small factories of literals (arange, scalar_tensor, zeros, full) fold with what is computed from them
// alone (a causal mask): no ATen step or kernel is left for them; a returned one is the caller's own
// tensor (writing into it changes no later call). The size limit: ConstantFold.SmallFactoriesOfLiteralsOnly.
TEST(Plan, SmallFactoriesOfLiteralsAreFolded) {
  auto m = script("x",
                  "    i = torch.arange(8)\n"
                  "    mask = torch.where(i.unsqueeze(1) >= i.unsqueeze(0), torch.scalar_tensor(0.0), "
                  "torch.scalar_tensor(-1e9))\n"
                  "    return x + mask, torch.zeros(3), torch.full([2], 1.5) + 1.0, torch.zeros(64, 1024) + x.sum()");
  std::vector<c10::IValue> in{at::randn({2, 8, 8})};
  auto r = run_and_compare(m, in, "factories");
  ASSERT_NE(r.plan, nullptr);
  for (const char* s : {"aten::arange", "aten::scalar_tensor", "aten::full", "aten::ge.Tensor", "aten::where.self"})
    EXPECT_EQ(r.plan->aten_ops.count(s), 0u) << s << "\n" << r.plan->explain();
  ASSERT_EQ(r.eager.size(), 4u);
  // The caller's tensor: the next call still returns zeros.
  expect_later_calls_match(r, in, [](std::vector<at::Tensor>& out) { out[1].fill_(7.0); });
}

// Note [Views made at plan build]: intermediate views (read by a kernel, by ATen's mm, by another view)
// are made without the dispatcher; a returned view still comes from it, a view of its base as eager's.
TEST(Plan, ViewsMadeAtPlanBuildGiveEagersValuesAndReturnedViewsStayViews) {
  torch::jit::Module m("Views");
  m.define(R"(
def forward(self, x, w):
    a = torch.relu(x)
    b = a.view(-1, 8).t()
    c = torch.mm(b, w)
    d = c.unsqueeze(0).expand(3, -1, -1) + 1.0
    return d, a, a.view(-1)
)");
  m.eval();
  std::vector<c10::IValue> in{at::randn({4, 2, 8}), at::randn({8, 5})};
  auto r = run_and_compare(m, in, "views");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_EQ(r.eager.size(), 3u);
  expect_later_calls_match(r, in, [](std::vector<at::Tensor>& out) {
    EXPECT_TRUE(out[2].is_view()) << "a returned view is a view, as eager's";
    EXPECT_TRUE(out[2]._base().is_same(out[1])) << "its base is the returned a, as in eager";
  });
}

// Slices and selects of intermediates are made at plan build too, at their start's offset: negative
// starts and indices, steps, clamped and empty ranges, read by kernels and by ATen's mm, as eager's.
TEST(Plan, SlicesAndSelectsMadeAtPlanBuildStartWhereEagersDo) {
  torch::jit::Module m("Slices");
  m.define(R"(
def forward(self, x, w):
    a = torch.relu(x) + 0.5
    f = torch.mm(a[2:], w)
    return a[1:5] * 2.0, a[:, -6::2] + 1.0, a[-1].exp(), a.select(1, 2).neg(), f, a[7:3] * 3.0, a[:, 5:100] - 1.0
)");
  m.eval();
  std::vector<c10::IValue> in{at::randn({6, 8}), at::randn({8, 5})};
  auto r = run_and_compare(m, in, "slices");
  ASSERT_NE(r.plan, nullptr);
  expect_later_calls_match(r, in);
}

// Splits and chunks whose pieces are hidden are made at plan build, each piece at its offset: uneven
// pieces, a negative dim, a sliced input (its own storage offset), pieces read by kernels, by mm and by a
// view; a split with a returned piece still runs through the dispatcher. Values and strides as eager's.
TEST(Plan, SplitsMadeAtPlanBuildGiveEagersPieces) {
  torch::jit::Module m("Splits");
  m.define(R"(
def forward(self, x, w):
    a = torch.relu(x) + 0.5
    p, q, r = a.split(3, 1)
    s, t = torch.chunk(a[1:], 2, -1)
    u, v = torch.split(a, [2, 4], 0)
    k1, k2 = a.chunk(2, 0)
    return p * 2.0, torch.mm(q.t(), w[:6]), r.unsqueeze(0) + 1.0, s - t, u.sum(0) + v.mean(0), k1, k2 * 3.0
)");
  m.eval();
  std::vector<c10::IValue> in{at::randn({6, 8}), at::randn({8, 5})};
  auto r = run_and_compare(m, in, "splits");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_EQ(r.eager.size(), 7u);
  expect_later_calls_match(r, in, [](std::vector<at::Tensor>& out) {
    EXPECT_TRUE(out[5].is_view()) << "a returned piece is a view, as eager's";
  });
}

// chunk and split consumers read their slices in place: the kernel takes the views (offset and strides)
// as inputs, no copy runs.
TEST(Plan, ChunkAndSplitConsumersReadTheirSlicesInPlace) {
  auto m = script("x", "    a, b = x.chunk(2, -1)\n    c, d = torch.split(x, [3, 5], 0)\n"
                       "    return a * torch.sigmoid(b), c.sum(0) + d.mean(0)");
  auto r = run_and_compare(m, {at::randn({8, 16})}, "chunk");
  ASSERT_NE(r.plan, nullptr);
  for (const auto& [schema, count] : r.plan->aten_ops)
    EXPECT_TRUE(schema == "aten::chunk" || schema == "aten::split_with_sizes" || schema == "aten::split.sizes" ||
                schema == "prim::ListUnpack")
        << schema << " runs through ATen\n" << r.plan->explain();
  EXPECT_EQ(r.plan->fused_ops, 5) << r.plan->explain();
}

// Note [Concatenation in kernels]: cats and stacks of items of one shape are stored by their items'
// kernel, against eager (values and strides), over layouts, dims, dtypes and item kinds; the rest run
// through ATen with results unchanged.
TEST(Concatenation, CatAndStackAreStoredByTheirItemsKernel) {
  struct Case {
    const char* what;
    const char* args;
    const char* body;
    std::vector<at::Tensor> inputs;
    bool fused;  // no aten::cat or aten::stack step left
  };
  at::manual_seed(0);
  auto nhwc = [](at::Tensor t) { return t.contiguous(at::MemoryFormat::ChannelsLast); };
  std::vector<Case> cases = {
      {"rotary", "x, c, s",
       "    x1 = x[:, :, :, :8]\n    x2 = x[:, :, :, 8:]\n    r = torch.cat((-x2, x1), -1)\n    return x * c + r * s",
       {at::randn({2, 4, 32, 16}), at::randn({32, 16}), at::randn({32, 16})}, true},
      {"one value twice", "f", "    e = torch.cat((f * 2.0, f * 2.0), -1)\n    return e.cos(), e.sin()",
       {at::randn({1, 32, 8})}, true},
      {"stack along each dim", "a, b",
       "    return torch.stack((a.relu(), b * 2.0, a + b), 0), torch.stack((a.relu(), b), 1), "
       "torch.stack((a.exp(), b), 2), torch.stack((a.neg(), b), -1)",
       {at::randn({4, 5}), at::randn({4, 5})}, true},
      {"onto an empty cache, read on", "p, k", "    return torch.cat((p, k * 3.0 + 1.0), 2).relu()",
       {at::randn({2, 2, 0, 16}), at::randn({2, 2, 32, 16})}, true},
      {"channels-last items along channels", "x, y", "    return torch.cat((x.relu(), y * 2.0), 1)",
       {nhwc(at::randn({2, 3, 5, 4})), nhwc(at::randn({2, 3, 5, 4}))}, true},
      {"transposed items", "x, y", "    return torch.cat((x.t() * 2.0, y.t().exp()), 0)",
       {at::randn({6, 4}), at::randn({6, 4})}, true},
      {"an input and a computed item", "x, y", "    return torch.cat((x, y.sigmoid(), x), 0)",
       {at::randn({3, 7}), at::randn({3, 7})}, true},
      {"float16", "x, y", "    return torch.cat((x * 0.5, y + 1.0), 1)",
       {at::randn({3, 9}).to(at::kHalf), at::randn({3, 9}).to(at::kHalf)}, true},
      {"int32", "x, y", "    return torch.stack((x * 3, y % 5), 0)",
       {at::randint(-50, 50, {3, 9}).to(at::kInt), at::randint(-50, 50, {3, 9}).to(at::kInt)}, true},
      {"items of two shapes", "x, y", "    return torch.cat((x.exp(), y.exp()), 0)",
       {at::randn({3, 7}), at::randn({2, 7})}, true},
      {"items of two dtypes", "x, y", "    return torch.cat((x * 2.0, y), 0)",
       {at::randn({3, 7}), at::randint(0, 5, {3, 7}).to(at::kInt)}, false},
  };
  for (auto& c : cases) {
    auto m = script(c.args, c.body);
    std::vector<c10::IValue> in(c.inputs.begin(), c.inputs.end());
    auto r = run_and_compare(m, in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    bool left = r.plan->aten_ops.count("aten::cat") || r.plan->aten_ops.count("aten::stack");
    EXPECT_EQ(!left, c.fused) << c.what << "\n" << r.plan->explain();
    if (c.fused) {
      EXPECT_EQ(r.plan->aten_ops.count("prim::ListConstruct"), 0u) << c.what << "\n" << r.plan->explain();
    }
  }
  // The rotary case is one kernel: the cat moves after the ops that read it (views.pointwise_of_cat).
  auto m = script("x, c, s", cases[0].body);
  std::vector<c10::IValue> in(cases[0].inputs.begin(), cases[0].inputs.end());
  auto r = run_and_compare(m, in, "rotary");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
}

// Note [Cats of unequal items]: the cat corpus against eager on CPU (values and strides); no cat runs
// through ATen.
TEST(Concatenation, ItemsOfUnequalSizesAreOneKernelWithAPiecePerItem) {
  for (auto& c : cat_cases()) {
    auto m = script(c.args, c.body);
    std::vector<c10::IValue> in(c.inputs.begin(), c.inputs.end());
    auto r = run_and_compare(m, in, c.name);
    ASSERT_NE(r.plan, nullptr) << c.name;
    EXPECT_EQ(r.plan->aten_ops.count("aten::cat"), 0u) << c.name << "\n" << r.plan->explain();
    EXPECT_EQ(r.plan->kernels.size(), c.kernels) << c.name << "\n" << r.plan->explain();
  }
}

// Note [Views through pointwise ops]: a view between fused ops moves to the first op's inputs, so both
// ops are one kernel, which reads its inputs through the views; values and strides as eager's.
TEST(ViewsInKernels, AViewBetweenFusedOpsIsAnIndexMapOfOneKernel) {
  struct Case {
    const char* what;
    const char* args;
    const char* body;
    std::vector<at::Tensor> inputs;
    size_t kernels;  // generated kernels of the plan
  };
  at::manual_seed(0);
  std::vector<Case> cases = {
      {"transpose", "x, b", "    return (x + b).transpose(0, 1) * 2.0", {at::randn({6, 5}), at::randn({5})}, 1},
      {"t", "x", "    return x.exp().t().relu()", {at::randn({6, 5})}, 1},
      {"permute of a chain", "x", "    return (x.sigmoid() * 3.0 - 1.0).permute(2, 0, 1).tanh()",
       {at::randn({2, 3, 4})}, 1},
      {"view", "x", "    return (x * 2.0).view(-1, 4).neg()", {at::randn({2, 3, 4})}, 1},
      {"reshape", "x", "    return (x * 2.0).reshape(6, 4) + 1.0", {at::randn({2, 3, 4})}, 1},
      {"flatten", "x", "    return (x * 2.0).flatten(1) + 1.0", {at::randn({2, 3, 4})}, 1},
      {"unsqueeze and squeeze", "x", "    return (x.abs().unsqueeze(1) + 1.0).squeeze(1).sqrt()",
       {at::randn({5, 7})}, 1},
      {"expand and clone (repeat_kv)", "k",
       "    r = (k * 0.5)[:, :, None, :, :].expand(2, 2, 3, 8, 4).clone()\n    return r.reshape(2, 6, 8, 4)",
       {at::randn({2, 2, 8, 4})}, 1},
      {"transposed input", "x", "    return (x * 2.0).t().exp()", {at::randn({6, 5}).t()}, 1},
      {"expanded input", "x", "    return (x + 1.0).transpose(0, 1).exp()", {at::randn({5}).expand({4, 5})}, 1},
      {"reshape that must copy", "x", "    return (x.t() * 2.0).reshape(-1) + 1.0", {at::randn({6, 5})}, 2},
      {"view at the output, returned with its base", "x", "    y = x * 2.0\n    return y, y.view(-1), y.t() + 1.0",
       {at::randn({3, 4})}, 2},
      {"the view also returned", "x", "    v = (x * 2.0).t()\n    return v.relu(), v", {at::randn({3, 4})}, 2},
      {"float16", "x", "    return (x * 0.5).transpose(1, 2).sigmoid()", {at::randn({2, 3, 4}).to(at::kHalf)}, 1},
      {"int32", "x", "    return (x * 3).t() + 1", {at::randint(-50, 50, {3, 9}).to(at::kInt)}, 1},
      // The moved producer's result is stored in the view's layout for an ATen op to read.
      {"into an op that runs through ATen", "x", "    return torch.remainder((x * 3).t(), x.t())",
       {at::randint(1, 50, {3, 9}).to(at::kInt)}, 1},
      // A 0-d int64 operand of an int32 comparison: eager compares in int32 (2^32 + 1 becomes 1), and so
      // must the moved comparison; expanded with the view it compared in int64 (fuzz seed
      // 3803078624763686185, Note [Views through pointwise ops]).
      {"0-d operand of another dtype", "x, s", "    return torch.le(x, s).reshape(-1).logical_not()",
       {at::randint(-3, 4, {3, 4}).to(at::kInt), at::scalar_tensor(int64_t{4294967297}, at::kLong)}, 1},
  };
  for (auto& c : cases) {
    auto m = script(c.args, c.body);
    std::vector<c10::IValue> in(c.inputs.begin(), c.inputs.end());
    auto r = run_and_compare(m, in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    EXPECT_EQ(r.plan->kernels.size(), c.kernels) << c.what << "\n" << r.plan->explain();
    if (std::string(c.what) == "into an op that runs through ATen") {
      EXPECT_NE(r.plan->explain().find("views.through_pointwise x1"), std::string::npos) << r.plan->explain();
      EXPECT_EQ(r.plan->aten_ops.count("aten::remainder.Tensor"), 1u) << r.plan->explain();
    }
  }
  // Returned views stay views of what eager returns them of.
  auto m = script("x", "    y = x * 2.0\n    return y, y.view(-1)");
  std::vector<c10::IValue> in{at::randn({3, 4})};
  auto r = run_and_compare(m, in, "aliasing");
  ASSERT_EQ(r.fused.size(), 2u);
  EXPECT_TRUE(r.fused[1].is_alias_of(r.fused[0]));
}

// clone is a kernel (a copy in the captured layout): its results alias neither the input nor each other,
// also where common subexpressions would make two clones one value.
TEST(Clone, ResultsAliasNeitherTheInputNorEachOther) {
  auto m = script("x", "    a = x.clone()\n    b = x.clone()\n    return a, b, (x * 2.0).clone(), x.t().clone(), x * 3.0, x * 3.0");
  at::Tensor x = at::randn({6, 5});
  auto r = run_and_compare(m, {x}, "clones");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->aten_ops.count("aten::clone"), 0u) << r.plan->explain();
  ASSERT_EQ(r.fused.size(), 6u);
  EXPECT_NE(r.fused[4].data_ptr(), r.fused[5].data_ptr());
  EXPECT_NE(r.fused[0].data_ptr(), x.data_ptr());
  EXPECT_NE(r.fused[1].data_ptr(), x.data_ptr());
  EXPECT_NE(r.fused[0].data_ptr(), r.fused[1].data_ptr());
  EXPECT_EQ(r.fused[3].strides(), r.eager[3].strides());
}

// Rotary embeddings: q * cos + cat(-q2, q1) * sin, with cos and sin broadcast over heads, is one kernel
// (views.pointwise_of_cat, views.slice_through_pointwise) storing both halves; results are eager's, also
// in float16 and where a cat item is an input read elsewhere too.
TEST(ViewsInKernels, ACatReadByPointwiseOpsIsStoredByTheirKernel) {
  auto m = script("q, cos, sin",
                  "    h = q.shape[-1] // 2\n"
                  "    r = torch.cat((-q[..., h:], q[..., :h]), -1)\n"
                  "    return q * cos + r * sin");
  for (at::ScalarType t : {at::kFloat, at::kHalf}) {
    std::vector<c10::IValue> in{at::randn({1, 4, 32, 16}).to(t), at::randn({1, 1, 32, 16}).to(t),
                                at::randn({1, 1, 32, 16}).to(t)};
    auto r = run_and_compare(m, in, "rotary");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops.count("aten::cat"), 0u) << r.plan->explain();
  }
  auto m2 = script("x, y", "    c = torch.cat((x, y * 2.0), 0)\n    return torch.relu(c + 1.0) * 3.0, x.sum()");
  auto r2 = run_and_compare(m2, {at::randn({3, 5}), at::randn({2, 5})}, "cat of unequal items read by pointwise ops");
  ASSERT_NE(r2.plan, nullptr);
  EXPECT_EQ(r2.plan->explain().find("pointwise_of_cat"), std::string::npos) << r2.plan->explain();
}

// Note [Views folded into kernel loads]: views that only kernels read are never made; the kernel reads
// the root's data at the view's offset, and the root stays alive until that kernel (here the transposed
// exp, whose other reader, the mm, runs earlier; and slices of two GEMM results).
TEST(Plan, ViewsReadOnlyByKernelsAreFoldedIntoTheirLoads) {
  auto m = script("x, y", "    a = x.exp()\n    s = torch.mm(a, y)\n    return a.t() * s");
  std::vector<c10::IValue> in{at::randn({8, 8}), at::randn({8, 8})};
  auto r = run_and_compare(m, in, "a transposed kernel output");
  ASSERT_NE(r.plan, nullptr);
  std::string text = r.compiled->explain(in);
  EXPECT_NE(text.find("views made at plan build: 1, 1 of them folded into kernel loads"), std::string::npos) << text;
  auto m2 = script("x, y", "    a = torch.mm(x, y)\n    b = torch.mm(y, x)\n    return a[1:] * 2.0 + b[:, :-1].t()");
  std::vector<c10::IValue> in2{at::randn({6, 6}), at::randn({6, 6})};
  auto r2 = run_and_compare(m2, in2, "slices of GEMM results");
  ASSERT_NE(r2.plan, nullptr);
  text = r2.compiled->explain(in2);
  EXPECT_NE(text.find("views made at plan build: 3, 3 of them folded into kernel loads"), std::string::npos) << text;
  // A view also returned is made (and stays a view of its base, as eager's).
  auto m3 = script("x, y", "    a = torch.mm(x, y)\n    v = a[1:]\n    return v * 2.0, v");
  auto r3 = run_and_compare(m3, in2, "a returned slice");
  ASSERT_NE(r3.plan, nullptr);
  ASSERT_EQ(r3.fused.size(), 2u);
  EXPECT_EQ(r3.fused[1].storage_offset(), 6);
}

// Note [Peak memory], on known values: eager holds two 4 KB results at once (x * 2 while its sum is made,
// then that sum while relu's result is made); the plan's one kernel writes only the result, whose view
// shares its storage.
TEST(PeakMemory, KnownValuesOfAChainAndAView) {
  auto m = script("x", "    c = torch.relu(x * 2.0 + 1.0)\n    return c, c.view(-1)");
  auto r = run_and_compare(m, {at::randn({32, 32})}, "chain");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(plan_peak_bytes(*r.plan), 4096);
  std::string text = r.compiled->explain({at::randn({32, 32})});
  EXPECT_NE(text.find("memory: peak 4.0 KB per call, eager 8.0 KB (50%)"), std::string::npos) << text;
}

// A pre-norm transformer block (the demo's), results unchanged. With a relu MLP its plan's peak is below
// eager's: the MLP's linear writes its result with relu applied (oneDNN's post-op), where eager holds the
// linear's result and relu's at once. A float32 gelu MLP is MKL's GEMM and our kernel instead (faster, as
// Inductor's freezing makes it: Note [Convolution rules]), which holds both as eager does: at most eager's.
TEST(PeakMemory, TransformerBlockPlanNeedsLessThanEager) {
  for (const char* act : {"relu", "gelu"}) {
    torch::jit::setGraphExecutorOptimize(false);
    at::manual_seed(0);
    torch::jit::Module m("Block");
    const int64_t d = 256, f = 1024;
    for (const char* n : {"wq", "wk", "wv", "wo"}) m.register_parameter(n, at::randn({d, d}) * 0.05, false);
    m.register_parameter("w1", at::randn({f, d}) * 0.05, false);
    m.register_parameter("b1", at::randn({f}) * 0.05, false);
    m.register_parameter("w2", at::randn({d, f}) * 0.05, false);
    m.register_parameter("b2", at::randn({d}) * 0.05, false);
    m.register_parameter("g", at::ones({d}), false);
    m.register_parameter("beta", at::zeros({d}), false);
    m.define(std::string(R"(
def forward(self, x, mask):
    h = torch.layer_norm(x, [256], self.g, self.beta, 1e-05)
    q = torch.linear(h, self.wq)
    k = torch.linear(h, self.wk)
    v = torch.linear(h, self.wv)
    s = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.0625 + mask, -1)
    x = x + torch.linear(torch.matmul(s, v), self.wo)
    h2 = torch.layer_norm(x, [256], self.g, self.beta, 1e-05)
    return x + torch.linear(torch.)") + act + "(torch.linear(h2, self.w1, self.b1)), self.w2, self.b2)\n");
    m.eval();
    std::vector<c10::IValue> in{at::randn({4, 64, d}), at::triu(at::full({64, 64}, -1e4), 1)};
    auto r = run_and_compare(m, in, std::string("transformer block with ") + act);
    ASSERT_NE(r.plan, nullptr) << act;
    std::string text = r.compiled->explain(in);
    auto at_ = text.find("memory: peak ");
    ASSERT_NE(at_, std::string::npos) << text;
    auto pct = text.find("%)", at_);
    ASSERT_NE(pct, std::string::npos) << text;
    int percent = std::stoi(text.substr(text.rfind('(', pct) + 1));
    std::cout << act << ": " << text.substr(at_, text.find('\n', at_) - at_) << "\n";
    if (std::string(act) == "relu") EXPECT_LT(percent, 100) << act << ": " << text.substr(at_);
    else EXPECT_LE(percent, 100) << act << ": " << text.substr(at_);
    EXPECT_GT(percent, 0) << text.substr(at_);
    // Its intermediates share an arena, which never raises the peak over allocating each alone.
    MemoryPlan mp = plan_memory(*r.plan);
    EXPECT_GT(mp.values, 1) << text.substr(at_);
    EXPECT_LT(mp.arena_bytes, mp.value_bytes) << text.substr(at_);
    EXPECT_LE(plan_peak_bytes(*r.plan, &mp), plan_peak_bytes(*r.plan)) << text.substr(at_);
  }
}

// Note [Static memory plan], on known values: x * 2 dies at the first mm and the mm's result * 3 is made
// after it, so the two 1 KB intermediates share the arena's first kilobyte; the returned value has its own.
// (Kernels writing over the mm's results, Note [Kernel results written over a dying input], would leave
// one intermediate: turned off here.)
TEST(MemoryPlan, IntermediatesWithDisjointLifetimesShareTheArena) {
  auto m = script("x, w", "    k = torch.mm(torch.mm(x * 2.0, w) * 3.0, w)\n    return k + 1.0");
  std::vector<c10::IValue> in{at::randn({16, 16}), at::randn({16, 16})};
  CompileOptions o;
  o.disable = {"in_place"};
  auto r = run_and_compare(m, in, "chain", o);
  ASSERT_NE(r.plan, nullptr);
  ASSERT_EQ(r.plan->kernels.size(), 3u) << r.plan->explain();
  MemoryPlan mp = plan_memory(*r.plan, /*in_place=*/false);
  EXPECT_EQ(mp.arena_bytes, 1024);
  EXPECT_EQ(mp.values, 2);
  for (const Value* o : r.plan->graph->outputs()) EXPECT_EQ(mp.offset[o->id()], -1);
  std::string text = r.compiled->explain(in);
  EXPECT_NE(text.find("; arena 1.0 KB for 2 intermediates of 2.0 KB"), std::string::npos) << text;
  // Every call gets its own arena: results of two calls are independent.
  CompiledModule& fused = *r.compiled;
  at::Tensor first = fused(in).toTensor();
  std::vector<c10::IValue> in2{at::randn({16, 16}), in[1]};
  at::Tensor second = fused(in2).toTensor();
  EXPECT_TRUE(check_close(first, r.eager[0]).ok);
  EXPECT_TRUE(check_close(second, m.forward(in2).toTensor()).ok);
}

// The number in explain's "kernels writing over a dying input: N" line, 0 without it.
int kernels_in_place(const std::string& explain) {
  const std::string line = "kernels writing over a dying input: ";
  const auto at = explain.find(line);
  return at == std::string::npos ? 0 : std::stoi(explain.substr(at + line.size()));
}

// Note [Kernel results written over a dying input]: a kernel reading an ATen result that dies there writes
// its output over it, which takes one result off the peak. Never over an input, a result returned or read
// later, one of another type (dtype, a broadcast); and one that reaches the kernel through an op returning
// its argument unannotated (dropout with p = 0) is planned so, but the caller's input it is at run time
// stays unwritten (the run-time check). Each against eager with the inputs checked unchanged
// (run_and_compare), and called again through the same plan.
TEST(MemoryPlan, KernelsWriteOverADyingAtenResultAndNothingLive) {
  std::vector<c10::IValue> in{at::randn({16, 16}), at::randn({16, 16})};
  struct Case {
    const char* body;
    int in_place;  // kernels
  } cases[] = {
      {"    y = torch.mm(x, w)\n    return torch.relu(y * 2.0 + 1.0)\n", 1},
      {"    y = torch.mm(x, w)\n    return y, torch.relu(y)\n", 0},                        // y returned
      {"    y = torch.mm(x, w)\n    a = torch.relu(y)\n    return torch.mm(a, y)\n", 0},    // y read later
      {"    return torch.relu(x * 2.0)\n", 0},                                               // an input
      {"    y = torch.mm(x, w)\n    return torch.relu(y).double()\n", 0},                      // another dtype
      {"    y = torch.mm(x, w[:, :1])\n    return y * x\n", 0},                              // broadcast
      {"    return torch.relu(torch.dropout(x, 0.0, True) * 2.0)\n", 1},                     // x at run time
  };
  for (const Case& k : cases) {
    auto m = script("x, w", k.body);
    auto r = run_and_compare(m, in, k.body);
    ASSERT_NE(r.plan, nullptr) << k.body;
    const std::string ex = r.compiled->explain(in);
    EXPECT_EQ(kernels_in_place(ex), k.in_place) << k.body << ex;
    auto again = flatten((*r.compiled)(in));
    ASSERT_EQ(again.size(), r.fused.size());
    for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(at::equal(again[i], r.fused[i])) << k.body;
  }
  // The peak: y alone (1 KB) where the kernel writes over it, y and the result apart.
  auto m = script("x, w", cases[0].body);
  auto r = run_and_compare(m, in, "written over");
  ASSERT_NE(r.plan, nullptr);
  const MemoryPlan over = plan_memory(*r.plan), apart = plan_memory(*r.plan, /*in_place=*/false);
  EXPECT_EQ(plan_peak_bytes(*r.plan, &over), 1024);
  EXPECT_EQ(plan_peak_bytes(*r.plan, &apart), 2048);
  // The disable option turns it off for one module.
  CompileOptions o;
  o.disable = {"in_place"};
  auto off = run_and_compare(m, in, "in_place disabled", o);
  EXPECT_EQ(kernels_in_place(off.compiled->explain(in)), 0) << off.compiled->explain(in);
}

// Results made after the arena is let go are the plan's own, whatever address their storage object gets
// (malloc hands the arena's back at once): returned as they are, a result and its view still one storage
// as eager's are, not copied apart as if they lay in the arena.
// (A key/value cache update: the rotated half of this step's key lies in the arena until the key's
// kernel has read it; the value's cat is made after.)
TEST(MemoryPlan, ResultsMadeAfterTheArenaIsGoneAreNotCopied) {
  auto m = script("past_k, past_v, k, v, c, s",
                  "    r = torch.cat((-k[..., 32:], k[..., :32]), -1)\n"
                  "    kk = torch.cat((past_k, k * c + r * s), 2)\n"
                  "    vv = torch.cat((past_v, v), 2)\n"
                  "    return kk, vv, vv.view(-1)");
  std::vector<c10::IValue> in{at::randn({1, 8, 511, 64}), at::randn({1, 8, 511, 64}), at::randn({1, 8, 1, 64}),
                              at::randn({1, 8, 1, 64}),   at::randn({1, 1, 1, 64}),   at::randn({1, 1, 1, 64})};
  auto r = run_and_compare(m, in, "a result and its view after the arena");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_GT(plan_memory(*r.plan).arena_bytes, 0) << r.plan->explain();
  CompiledModule& fused = *r.compiled;
  for (int call = 0; call < 10; ++call) {
    auto out = fused(in).toTuple()->elements();
    ASSERT_EQ(out.size(), 3u);
    EXPECT_TRUE(out[2].toTensor().is_alias_of(out[1].toTensor())) << "call " << call;
  }
}

// An op whose schema promises a new tensor but that returns its input (dropout with p = 0, which the
// views.identity rule leaves to ATen since it draws from the generator in training) must not hand out
// arena bytes as a value of its own: another intermediate placed there later would overwrite it.
// In eval mode dropout is its input (views.identity): changed in place, it changes its input with it, as
// eager's does. (Without kernels writing over the mm's results, which would keep them out of the arena.)
TEST(MemoryPlan, OpsReturningTheirInputUnannotatedKeepTheirValue) {
  auto m = script("x, w", "    b = torch.dropout(x * 2.0, 0.0, True)\n    k = torch.mm(torch.mm(b, w) * 3.0, w)\n"
                          "    return k + b");
  std::vector<c10::IValue> in{at::randn({16, 16}), at::randn({16, 16})};
  CompileOptions o;
  o.disable = {"in_place"};
  auto r = run_and_compare(m, in, "dropout's result read after the arena reused its bytes", o);
  ASSERT_NE(r.plan, nullptr);
  ASSERT_EQ(r.plan->aten_ops.count("aten::dropout"), 1u) << r.plan->explain();
  MemoryPlan mp = plan_memory(*r.plan, /*in_place=*/false);
  EXPECT_EQ(mp.values, 2);
  EXPECT_EQ(std::count(mp.check.begin(), mp.check.end(), true), 2);  // dropout and the first mm read the arena
  auto m2 = script("x", "    a = x * 2.0\n    b = torch.dropout(a, 0.5, False)\n    b.add_(1.0)\n    return a * 1.5, b.sum()");
  auto r2 = run_and_compare(m2, {at::randn({16, 16})}, "dropout's result changed in place");
  ASSERT_NE(r2.plan, nullptr);
  EXPECT_EQ(r2.plan->aten_ops.count("aten::dropout"), 0u) << r2.plan->explain();
  // type_as returns its input where the dtype matches: changed in place, the graph runs eagerly.
  auto m3 = script("x, y", "    a = x * 2.0\n    b = a.type_as(y)\n    b.add_(1.0)\n    return a * 1.5, b.sum()");
  std::vector<c10::IValue> in3{at::randn({16, 16}), at::randn({2})};
  auto r3 = run_and_compare(m3, in3, "type_as's result changed in place");
  EXPECT_EQ(r3.plan, nullptr);
}

}  // namespace
}  // namespace fusion_jit::testing
