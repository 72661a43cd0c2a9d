// PlanSession (Note [The plan session], torch/session.h).
#include "torch/session.h"

#include <fmt/format.h>

#include <chrono>

#include "driver/build_plan.h"
#include "support/error.h"
#include "support/options.h"

namespace fusion_jit {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

PlanSession::PlanSession(std::string name, const CompileOptions& options)
    : table_(name, specialization_limit(options), shared_plans(options), options.on_warning),
      enable_fusion_(options.enable_fusion),
      refuse_decision_(options.refuse_fusion_decision),
      disable_(module_disable(options, name)),
      dynamic_(dynamic_sizes(options)) {
  FJ_CHECK(options.refuse_fusion_decision >= -1, "CompileOptions::refuse_fusion_decision is {}: give -1 (none) or a "
           "decision's index (0 or more)", options.refuse_fusion_decision);
  apply_process_options(options);
}

PlanTarget PlanSession::target(const SignatureTable::Admit& admit) const {
  PlanTarget t;
  t.enable_fusion = enable_fusion_;
  t.refuse_decision = refuse_decision_;
  set_plan_size_args(dynamic_, table_, &t);
  t.admit = admit;
  return t;
}

std::set<std::string> PlanSession::skipped(const PlanTarget& target, const std::set<std::string>& extra) const {
  std::set<std::string> skip = passes_skipped(disable_, target);
  skip.insert(extra.begin(), extra.end());
  return skip;
}

void PlanSession::optimize(CapturedGraph& cap, const std::set<std::string>& skip, bool to_cuda) {
  if (to_cuda)
    optimize_captured_on_cuda(cap, skip);
  else
    optimize_captured(cap, skip, &folded_);
}

std::unique_ptr<PlanInstance> PlanSession::plan(CapturedGraph cap, const PlanTarget& target,
                                                const std::set<std::string>& skip, double capture_ms,
                                                std::string* report) {
  std::string class_note;
  if (dynamic_ != DynamicSizes::kOff && !disable_.count("symbolic.class") &&
      !Options::get().disabled.count("symbolic.class")) {
    const auto t0 = std::chrono::steady_clock::now();
    auto build = [&](CapturedGraph cls) { return class_plan(std::move(cls), target.admit); };
    if (auto inst = captured_classes_.instance_for(cap, in_place(), build, &class_note)) {
      *report = fmt::format("capture {:.1f} ms, an instance of its shape class's plan {:.1f} ms", capture_ms,
                            ms_since(t0));
      return inst;
    }
  }
  auto inst = plan_alone(std::move(cap), target, skip, capture_ms, report);
  inst->class_note = class_note;
  return inst;
}

std::unique_ptr<PlanInstance> PlanSession::plan_alone(CapturedGraph cap, const PlanTarget& target,
                                                      const std::set<std::string>& skip, double capture_ms,
                                                      std::string* report,
                                                      const std::function<void(const Graph&)>& after_passes) {
  const auto t0 = std::chrono::steady_clock::now();
  auto inst = std::make_unique<PlanInstance>();
  inst->captured = std::move(cap);
  optimize(inst->captured, skip);
  const double passes_ms = ms_since(t0);
  if (after_passes) after_passes(*inst->captured.graph);
  inst->plan = build_plan(std::move(inst->captured.graph), target);
  inst->captured.graph = nullptr;
  resolve_aten_steps(*inst, in_place());
  const ExecutablePlan& p = *inst->plan;
  if (report)
    *report = fmt::format("capture {:.1f} ms, passes {:.1f} ms, fusion {:.1f} ms, codegen {:.1f} ms, compile {:.1f} ms",
                          capture_ms, passes_ms, p.fusion_ms, p.codegen_ms, p.compile_ms);
  return inst;
}

std::shared_ptr<const ClassPlan> PlanSession::find_class(const std::string& class_ir) const {
  std::lock_guard<std::mutex> g(classes_mu_);
  auto it = ir_classes_.find(class_ir);
  return it == ir_classes_.end() ? nullptr : it->second;
}

std::shared_ptr<ClassPlan> PlanSession::class_plan(CapturedGraph cls, const SignatureTable::Admit& admit) {
  PlanTarget t;
  t.enable_fusion = enable_fusion_;
  t.refuse_decision = refuse_decision_;
  t.admit = admit;
  return build_class_plan(std::move(cls), t, disable_, &folded_);
}

std::shared_ptr<const ClassPlan> PlanSession::build_class(const std::string& class_ir, CapturedGraph cls,
                                                          const SignatureTable::Admit& admit) {
  std::shared_ptr<ClassPlan> built = class_plan(std::move(cls), admit);
  std::lock_guard<std::mutex> g(classes_mu_);
  return ir_classes_.emplace(class_ir, std::move(built)).first->second;
}

int PlanSession::num_classes() const {
  std::lock_guard<std::mutex> g(classes_mu_);
  return static_cast<int>(ir_classes_.size()) + captured_classes_.num_classes();
}

void PlanSession::clear() {
  table_.clear();
  {
    std::lock_guard<std::mutex> g(classes_mu_);
    ir_classes_.clear();
  }
  captured_classes_.clear();
  folded_.clear();
}

}  // namespace fusion_jit
