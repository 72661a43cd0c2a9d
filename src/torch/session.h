// PlanSession: the one way from a graph to a plan instance, which every door takes.
//
// Note [The plan session]
// Each door holds one session: CompiledModule (TorchScript modules and C++ functions; each new input
// signature a capture), GraphFunction (graphs given as IR text: the torch.compile backend, a symbolic FX
// graph as its shape class's graph) and package_graphs (the package of a TorchScript module is built through
// its CompiledModule's session). The door makes the graph (a capture run, or a parse); the session does the
// rest, the same way for each:
//   the passes (optimize: the pass pipeline, ATen's constant evaluator, constants folded once across the
//     door's signatures, Note [Folded constants shared across signatures])
//   -> the shape class (plan: an instance of the class the capture belongs to, CapturedClasses, Note [Shape
//      classes of captured graphs]; for IR text the class's graph is given, build_class and instance)
//   -> or a plan of its own (plan_alone: build_plan's fusion, code generation and compile)
//   -> under the limit and admission of the door's SignatureTable (target(): sizes as kernel arguments as
//      the table's state says, past the limit only code the table has)
//   -> the instance, its ATen steps resolved (in place unless the disable names say otherwise).
// The session owns the SignatureTable, the folded constants and the classes; the door keeps its capture,
// its eager fallback, its run and its stats. The fuzzer's batches take plan_alone too (src/fuzz/oracle.cpp),
// so that a fuzzed graph gets the passes, constant evaluation and plan a user's graph gets; its check of a
// shape class builds the class's plan under guards of its own, to name the phase of each guard
// (src/fuzz/shape_class.cpp).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fusion_jit/fusion_jit.h"
#include "torch/executor.h"
#include "torch/graph_function.h"

namespace fusion_jit {

class PlanSession {
 public:
  PlanSession(std::string name, const CompileOptions& options);

  const std::string& name() const { return table_.name(); }
  SignatureTable& table() { return table_; }
  const SignatureTable& table() const { return table_; }
  bool enable_fusion() const { return enable_fusion_; }
  const std::set<std::string>& disable() const { return disable_; }  // CompileOptions::disable, checked
  DynamicSizes dynamic() const { return dynamic_; }
  bool in_place() const { return !disable_.count("in_place"); }

  // The target of a new signature's plan: fusion as the options say, sizes as kernel arguments as the
  // table's state says (set_plan_size_args), `admit` the table's (null under the limit).
  PlanTarget target(const SignatureTable::Admit& admit) const;
  // The passes and rules a plan for `target` leaves out (passes_skipped), with `extra`.
  std::set<std::string> skipped(const PlanTarget& target, const std::set<std::string>& extra = {}) const;

  // The passes on `cap` (optimize_captured), constants folded once across this session's plans; `to_cuda`:
  // for a plan on cuda:0 from a CPU capture (optimize_captured_on_cuda, which shares nothing).
  void optimize(CapturedGraph& cap, const std::set<std::string>& skip, bool to_cuda = false);

  // The plan of a new signature's capture: an instance of its shape class where one fits (dynamic sizes not
  // off, "symbolic.class" not disabled), else its own (plan_alone). *report: the timings of what ran.
  std::unique_ptr<PlanInstance> plan(CapturedGraph cap, const PlanTarget& target, const std::set<std::string>& skip,
                                     double capture_ms, std::string* report);
  // The capture's own plan: the passes, build_plan (fusion, code generation, compile), the ATen steps
  // resolved. *report (when given): the timings. `after_passes` (when given) sees the optimized graph
  // before the plan is built (the fuzzer starts its NVRTC check of the graph's CUDA kernels there).
  std::unique_ptr<PlanInstance> plan_alone(CapturedGraph cap, const PlanTarget& target,
                                           const std::set<std::string>& skip, double capture_ms = 0,
                                           std::string* report = nullptr,
                                           const std::function<void(const Graph&)>& after_passes = {});

  // Note [Plans of a shape class] for graphs given as a class's graph (GraphFunction::add_from_class):
  // the plan built for `class_ir`, or null.
  std::shared_ptr<const ClassPlan> find_class(const std::string& class_ir) const;
  // Builds the plan of the class graph `cls` (build_class_plan) and keeps it under `class_ir`; a class
  // another thread built meanwhile wins.
  std::shared_ptr<const ClassPlan> build_class(const std::string& class_ir, CapturedGraph cls,
                                               const SignatureTable::Admit& admit);
  // Shape classes whose plan is built, of both kinds.
  int num_classes() const;
  // Forgets every plan, class and folded constant.
  void clear();

 private:
  // The plan of a class's graph (build_class_plan) with this session's options and folded constants.
  std::shared_ptr<ClassPlan> class_plan(CapturedGraph cls, const SignatureTable::Admit& admit);

  SignatureTable table_;
  bool enable_fusion_ = true;
  int refuse_decision_ = -1;  // CompileOptions::refuse_fusion_decision
  std::set<std::string> disable_;
  DynamicSizes dynamic_;
  FoldedConstants folded_;
  CapturedClasses captured_classes_;
  mutable std::mutex classes_mu_;
  std::map<std::string, std::shared_ptr<const ClassPlan>> ir_classes_;  // by the class graph's text
};

}  // namespace fusion_jit
