// The run loop without torch (runtime/run_loop.h): plans built from IR text run by a StepRunner over
// float buffers of its own, which computes the one ATen op these graphs use (aten::mm) by hand and logs
// what the loop asks of it. The first test compiles its kernels with the host compiler and checks the
// numbers against a reference computed here; the others check what the loop does with folded views,
// kernels writing over a dying input, releases and the arena, from the log.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "driver/build_plan.h"
#include "plan_of.h"
#include "runtime/memory_plan.h"
#include "runtime/run_loop.h"

namespace fusion_jit {
namespace {

// Op facts for these graphs: aten::slice.Tensor and aten::t are views; nothing mutates.
class Facts : public OpFacts {
 public:
  bool returns_alias(const Node& n) const override {
    return n.schema() == "aten::slice.Tensor" || n.schema() == "aten::t";
  }
  bool may_mutate(const Node&) const override { return false; }
  InPlaceForm in_place_form(const Node&) const override { return {}; }
};

using test_support::plan_of;

// A float tensor: storage shared by views, an offset in elements, and the type's sizes and strides.
struct Buf {
  std::shared_ptr<std::vector<float>> storage;
  int64_t offset = 0;
  float* data() const { return storage->data() + offset; }
};

// Holds a call's values as Bufs, computes aten::mm (contiguous [m,k] x [k,n]) and views, launches
// compiled kernels serially, and logs each request as a word: "in(%2)", "root(%2)", "cat(%4)",
// "over(%5<-%3)", "arena(%2@0)", "own(%4)", "k0", "const(%3)", "call(aten::mm)", "rel(%2)", "arena-done".
class LoggingRunner final : public StepRunner {
 public:
  LoggingRunner(const ExecutablePlan& plan, const MemoryPlan& memory) : plan_(plan), memory_(memory) {
    ctx_.parallel_for = [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, n); };
    ctx_.stream = [](Device, int) -> void* { return nullptr; };
    for (const Value* v : plan.graph->inputs()) names_[v->id()] = v->name();
    for (const Node* n : plan.graph->nodes())
      for (const Value* v : n->outputs()) names_[v->id()] = v->name();
  }
  std::map<int, Buf> env;
  std::vector<std::string> log;
  bool sole = true;       // what sole_reference answers
  bool run_kernels = false;  // launch compiled kernels (else only log)

  std::string name(int id) const { return names_.at(id); }
  const void* input(const KernelBuffer& b) override {
    log.push_back("in(" + b.value->name() + ")");
    return env.at(b.value->id()).data();
  }
  const void* root(int id) override {
    log.push_back("root(" + name(id) + ")");
    return env.at(id).data();
  }
  void* made_output(const KernelBuffer& b) override {
    log.push_back("cat(" + b.value->name() + ")");
    return env.at(b.value->id()).data();
  }
  bool sole_reference(int) override { return sole; }
  void* write_over(const KernelBuffer& b, int over) override {
    log.push_back(fmt::format("over({}<-{})", b.value->name(), name(over)));
    env[b.value->id()] = env.at(over);
    return env.at(over).data();
  }
  void* allocate(const KernelBuffer& b, int64_t offset) override {
    if (offset >= 0) {
      if (!arena_) arena_ = std::make_shared<std::vector<float>>(memory_.arena_bytes / 4);
      log.push_back(fmt::format("arena({}@{})", b.value->name(), offset));
      env[b.value->id()] = Buf{arena_, offset / 4};
    } else {
      log.push_back("own(" + b.value->name() + ")");
      env[b.value->id()] = Buf{std::make_shared<std::vector<float>>(b.value->tensor_type().numel()), 0};
    }
    return env.at(b.value->id()).data();
  }
  void launch(int kernel, void* const* buffers) override {
    log.push_back(fmt::format("k{}", kernel));
    if (run_kernels) plan_.launch(kernel, 0, buffers, ctx_);
  }
  void constant(const Node& n) override { log.push_back("const(" + n.output()->name() + ")"); }
  void call(size_t, const Node& n) override {
    log.push_back("call(" + n.schema() + ")");
    ASSERT_EQ(n.schema(), "aten::mm");
    const TensorType& a = n.args()[0].value->tensor_type();
    const TensorType& b = n.args()[1].value->tensor_type();
    const int64_t m = a.sizes[0], k = a.sizes[1], cols = b.sizes[1];
    const float* x = env.at(n.args()[0].value->id()).data();
    const float* y = env.at(n.args()[1].value->id()).data();
    Buf out{std::make_shared<std::vector<float>>(m * cols), 0};
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float acc = 0;
        for (int64_t l = 0; l < k; ++l) acc += x[i * a.strides[0] + l * a.strides[1]] * y[l * b.strides[0] + j * b.strides[1]];
        (*out.storage)[i * cols + j] = acc;
      }
    env[n.output()->id()] = out;
  }
  void release(int id) override {
    log.push_back("rel(" + name(id) + ")");
    env.erase(id);
  }
  void release_arena() override {
    log.push_back("arena-done");
    arena_.reset();
  }

 private:
  const ExecutablePlan& plan_;
  const MemoryPlan& memory_;
  LaunchContext ctx_;
  std::shared_ptr<std::vector<float>> arena_;
  std::map<int, std::string> names_;
};

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// The plan's steps, one word each: "k" for a kernel, an ATen step's schema.
std::string steps_of(const ExecutablePlan& p) {
  std::vector<std::string> w;
  for (const ExecStep& st : p.steps) w.push_back(st.kernel >= 0 ? "k" : st.node->schema());
  return joined(w);
}

// The graph's inputs, in order, as buffers of their own.
void give_inputs(LoggingRunner& r, const ExecutablePlan& p, const std::vector<std::vector<float>>& values) {
  for (size_t i = 0; i < values.size(); ++i)
    r.env[p.graph->inputs()[i]->id()] = Buf{std::make_shared<std::vector<float>>(values[i]), 0};
}

std::vector<int64_t> no_views(const ExecutablePlan& p) { return std::vector<int64_t>(p.steps.size(), -1); }

TEST(RunLoop, RunsACompiledPlanOverBuffersOfItsOwn) {
  // k0 writes %2 (x * 2), mm reads it, k1 applies relu(%3 + 1) and may write over the dying product.
  const char* ir = R"(graph(%0 : f32[4,8], %1 : f32[8,3]):
  %2 : f32[4,8] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[4,3] = aten::mm(%2, %1)
  %4 : f32[4,3] = aten::add.Scalar(%3, -1.0, 1)
  %5 : f32[4,3] = aten::relu(%4)
  return (%5)
)";
  auto p = plan_of(ir, /*compile=*/true);
  ASSERT_EQ(steps_of(*p), "k aten::mm k");
  Facts facts;
  const MemoryPlan memory = plan_memory(*p, facts);
  const RunSchedule schedule = schedule_run(*p, no_views(*p));
  LoggingRunner r(*p, memory);
  r.run_kernels = true;
  std::vector<float> x(32), w(24);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  for (int i = 0; i < 24; ++i) w[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  give_inputs(r, *p, {x, w});
  run_steps(*p, schedule, memory, r);
  const Buf& out = r.env.at(p->graph->outputs()[0]->id());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) {
      float acc = 0;
      for (int l = 0; l < 8; ++l) acc += 2.0f * x[i * 8 + l] * w[l * 3 + j];
      EXPECT_FLOAT_EQ(out.data()[i * 3 + j], std::max(acc - 1.0f, 0.0f)) << i << "," << j;
    }
  // Only the output is left, and the product's storage became the result's.
  EXPECT_EQ(r.env.size(), 1u) << joined(r.log);
  EXPECT_NE(joined(r.log).find("over(%5<-%3)"), std::string::npos) << joined(r.log);
}

TEST(RunLoop, AFoldedViewIsNeverMadeAndItsRootLivesToItsLastKernel) {
  // %3 (the second half of the product's rows, 8 rows of 16 floats in: 512 bytes) is read by one kernel
  // only: never made; the kernel reads the product at that offset, and the product dies after it.
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[8,16] = aten::slice.Tensor(%2, 0, 8, 16, 1)
  %4 : f32[8,16] = aten::relu(%3)
  return (%4)
)";
  auto p = plan_of(ir, /*compile=*/true);
  ASSERT_EQ(steps_of(*p), "aten::mm aten::slice.Tensor k");
  std::vector<int64_t> views = no_views(*p);
  views[1] = 8 * 16;
  Facts facts;
  const MemoryPlan memory = plan_memory(*p, facts);
  const RunSchedule s = schedule_run(*p, views);
  EXPECT_EQ(s.folded, (std::vector<bool>{false, true, false}));
  LoggingRunner r(*p, memory);
  r.run_kernels = true;
  std::vector<float> x(256), w(256);
  for (int i = 0; i < 256; ++i) {
    x[i] = static_cast<float>(i % 11) - 5.0f;
    w[i] = static_cast<float>(i % 3) - 1.0f;
  }
  give_inputs(r, *p, {x, w});
  run_steps(*p, s, memory, r);
  // The plan released %2 after the slice, its last reader; the schedule after the kernel.
  EXPECT_EQ(joined(r.log), "call(aten::mm) rel(%0) rel(%1) root(%2) own(%4) k0 rel(%3) rel(%2)");
  const float* out = r.env.at(p->graph->outputs()[0]->id()).data();
  for (int i = 8; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float acc = 0;
      for (int l = 0; l < 16; ++l) acc += x[i * 16 + l] * w[l * 16 + j];
      EXPECT_FLOAT_EQ(out[(i - 8) * 16 + j], std::max(acc, 0.0f)) << i << "," << j;
    }

  // Returned, or read by an ATen step, a view is made.
  auto q = plan_of(R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[16,16] = aten::t(%2)
  %4 : f32[16,16] = aten::mm(%3, %1)
  %5 : f32[16,16] = aten::relu(%3)
  return (%4, %5)
)", false);
  ASSERT_EQ(steps_of(*q), "aten::mm aten::t aten::mm k");
  std::vector<int64_t> qviews = no_views(*q);
  qviews[1] = 0;
  EXPECT_EQ(schedule_run(*q, qviews).folded, (std::vector<bool>{false, false, false, false}));
  auto v = plan_of(R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[16,16] = aten::t(%2)
  return (%3)
)", false);
  EXPECT_EQ(schedule_run(*v, std::vector<int64_t>{-1, 0}).folded, (std::vector<bool>{false, false}));
}

TEST(RunLoop, AKernelWritesOverADyingInputOnlyWhereNothingElseHoldsIt) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[16,16] = aten::relu(%2)
  return (%3)
)";
  auto p = plan_of(ir, /*compile=*/false);
  ASSERT_EQ(steps_of(*p), "aten::mm k");
  Facts facts;
  const MemoryPlan memory = plan_memory(*p, facts);
  const RunSchedule s = schedule_run(*p, no_views(*p));
  for (bool sole : {true, false}) {
    LoggingRunner r(*p, memory);
    r.sole = sole;
    give_inputs(r, *p, {std::vector<float>(256), std::vector<float>(256)});
    run_steps(*p, s, memory, r);
    EXPECT_EQ(joined(r.log), sole ? "call(aten::mm) rel(%0) rel(%1) in(%2) over(%3<-%2) k0 rel(%2)"
                                  : "call(aten::mm) rel(%0) rel(%1) in(%2) own(%3) k0 rel(%2)");
  }
}

TEST(RunLoop, IntermediatesGoToTheArenaWhichIsLetGoAfterTheLastIsBorn) {
  // %2 and %4 die within the call: placed in the arena (at disjoint lifetimes, the same bytes); after
  // %4's kernel no value is placed, and the arena is let go there.
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::mm(%2, %1)
  %4 : f32[16,16] = aten::mul.Scalar(%3, 3.0)
  %5 : f32[16,16] = aten::mm(%4, %1)
  return (%5)
)";
  auto p = plan_of(ir, /*compile=*/false);
  ASSERT_EQ(steps_of(*p), "k aten::mm k aten::mm");
  Facts facts;
  const MemoryPlan memory = plan_memory(*p, facts, /*in_place=*/false);
  ASSERT_EQ(memory.last_birth, 2);
  LoggingRunner r(*p, memory);
  give_inputs(r, *p, {std::vector<float>(256), std::vector<float>(256)});
  run_steps(*p, schedule_run(*p, no_views(*p)), memory, r);
  EXPECT_EQ(joined(r.log),
            "in(%0) arena(%2@0) k0 rel(%0) call(aten::mm) rel(%2) in(%3) arena(%4@0) k1 rel(%3) arena-done "
            "call(aten::mm) rel(%1) rel(%4)");
}

}  // namespace
}  // namespace fusion_jit
