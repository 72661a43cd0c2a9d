// The public C++ API of fusion_jit: `#include <fusion_jit/fusion_jit.h>`, link fusion_jit::fusion_jit
// (find_package(fusion_jit); examples/cpp is a complete program).
//
//   auto fused = fusion_jit::compile(module);           // a TorchScript module
//   c10::IValue out = fused({x, y});                     // compiles at the first call per input signature
//   std::cout << fused.explain({x, y});                  // the plan: groups, ops, reasons, costs
//
//   auto f = fusion_jit::trace(fn, {x, y});              // a plain C++ function over tensors
//
// A signature is the inputs' dtypes, sizes, strides, devices and requires_grad (and the values of
// non-tensor inputs), with the grad mode. Each new signature is captured, optimized, fused, compiled and
// kept; past the specialization limit (FUSION_JIT_SPECIALIZATION_LIMIT, default 8) new signatures run
// eagerly, with one warning. A signature whose graph cannot be captured (control flow, in-place ops, ops
// outside ATen) also runs eagerly, with a warning that says why. Calls may come from many threads: a new
// signature compiles with no lock held, and callers of that signature wait for it.
//
// Errors: fusion_jit/error.h. The kernel cache, the counters and CUDA's availability: fusion_jit/cache.h.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusion_jit/cache.h"
#include "fusion_jit/error.h"

namespace torch::jit {
struct Module;
}

namespace fusion_jit {

struct ExecutablePlan;

// Receives each warning of a compiled module or graph function (a signature that runs eagerly and why).
// Each distinct warning is given once per module or function.
using WarningHandler = std::function<void(const std::string& message)>;

struct CompileOptions {
  std::optional<int> specialization_limit;  // default: the FUSION_JIT_SPECIALIZATION_LIMIT option
  // Plans kept for signatures that reuse an earlier signature's kernels (and signatures recorded as
  // eager); past it the least recently called is dropped and built again (no compiler) if it comes back.
  // At least 1; default: the FUSION_JIT_SHARED_PLANS option, itself 64.
  std::optional<int> shared_plans;
  // The cache's remote tier on Redis and the file of the key its entries are signed with (both or
  // neither; see cache::use_remote in fusion_jit/cache.h): like the Python backend's options of those
  // names, they set the tier for the whole process from this module on. Default: FUSION_JIT_REMOTE_CACHE
  // and FUSION_JIT_REMOTE_CACHE_KEY_FILE.
  std::optional<std::string> remote_cache, remote_cache_key_file;
  // "auto", "on" or "off" (default: the FUSION_JIT_DYNAMIC option, itself "auto"): whether CPU kernels
  // read their sizes as arguments, so that signatures differing only in sizes share compiled kernels.
  // auto: from the second compiled signature on. A signature that reuses the kernels of an earlier one
  // does not count against the specialization limit. Under auto and on, a CompiledModule's captures that
  // differ only in sizes make a shape class, whose plan later such signatures get by evaluation (no passes,
  // fusion or code generation; Note [Shape classes of captured graphs], src/torch/graph_function.h;
  // disable "symbolic.class" turns that off).
  std::optional<std::string> dynamic;
  bool enable_fusion = true;                // false: one kernel per fusible op
  // For measuring the fuser's decisions (`fusion-jit explain --measure-decisions`): >= 0 makes the N-th
  // fusion it accepts (0-based, in the order it makes them) the other way; -1 (default): none.
  int refuse_fusion_decision = -1;
  // Replay each CUDA plan as a CUDA Graph (captured at the second call of a signature; see
  // CudaGraphReplay in torch/cuda_support.h for what replay does to inputs and outputs). Default: the
  // FUSION_JIT_CUDA_GRAPHS option. Plans that cannot be captured run normally; explain() says why.
  std::optional<bool> cuda_graphs;
  // Passes, rule sets and rules left out for this module, besides those FUSION_JIT_DISABLE names for the
  // process: the pipeline's names (docs/options.md lists them, e.g. "prepack.linear_mkl" or
  // "epilogue"), "channels_last", "in_place", "symbolic", "symbolic.class" and "weight_memo". A name that is not one of them is an error, listing
  // them, when the module is made; the plan-building switches ("fusion", "horizontal", "cat", "gather",
  // "arena", "cache") are process-wide (FUSION_JIT_DISABLE; enable_fusion above for this module's fusion).
  std::vector<std::string> disable;
  // Default: printed to stderr (filtered by FUSION_JIT_LOG_LEVEL).
  WarningHandler on_warning;
};

struct ModuleStats {
  int64_t calls = 0;
  int64_t signatures = 0;     // signatures with a compiled plan
  int64_t eager_calls = 0;    // calls run eagerly (past the limit, or not capturable)
  int64_t graph_replays = 0;  // calls served by a CUDA Graph replay
  int64_t plans_kept = 0;     // signatures held now (plans and eager ones)
  int64_t plans_dropped = 0;  // shared plans dropped past CompileOptions::shared_plans
  double compile_ms = 0;      // capture + passes + fusion + codegen + compile, all signatures
  int64_t class_plans = 0;    // shape classes whose plan was built (CompileOptions::dynamic)
};

class CompiledModule {
 public:
  c10::IValue operator()(const std::vector<c10::IValue>& inputs);
  c10::IValue forward(const std::vector<c10::IValue>& inputs) { return (*this)(inputs); }
  // The plan for these inputs' signature, compiling it if needed (which runs the model once); nullptr
  // when the signature runs eagerly. It lives while the module keeps it: a plan that reuses an earlier
  // signature's kernels may be dropped once CompileOptions::shared_plans later signatures came.
  const ExecutablePlan* plan_for(const std::vector<c10::IValue>& inputs);
  // The plan as text, or why the signature runs eagerly.
  std::string explain(const std::vector<c10::IValue>& inputs);
  // Time of the last compilation, split by phase, in ms: capture, passes, fusion, codegen, compile.
  std::string last_compile_report() const;
  ModuleStats stats() const;
  // Ahead-of-time CUDA compilation, no GPU needed: captures the model on these (CPU) inputs, moves the
  // graph to cuda:0, and fuses, generates and compiles its kernels with NVRTC for `arch` ("sm_90"). The
  // plan is not kept and cannot run here; it carries the source, the binary and the kernels' resources.
  // With `run_nvrtc` false the kernels are generated but not compiled. With CompileOptions::dynamic "on"
  // the kernels take their sizes as arguments, as the plans of a GPU run would.
  std::shared_ptr<const ExecutablePlan> compile_cuda(const std::vector<c10::IValue>& inputs, const std::string& arch,
                                                     bool run_nvrtc = true);

  struct Impl;
  explicit CompiledModule(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  friend struct ModuleAccess;  // the package builder (fusion_jit/package.h)
  std::shared_ptr<Impl> impl_;
};

// Freezes (in eval mode) and inlines a copy of the module; the module itself is not changed. The compiled
// module computes with the parameters and buffers as they are at this call (freezing copies them into the
// plans' constants): a later change to the module (in place, through .data, or by assignment) is not seen,
// by plans compiled before or after it; compile again to take it.
CompiledModule compile(const torch::jit::Module& module, CompileOptions options = {});

using TensorFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
// Traces `fn` on the example inputs through torch's tracer. The result is called with tensors only and
// returns a list of tensors.
CompiledModule trace(TensorFunction fn, const std::vector<at::Tensor>& example_inputs, CompileOptions options = {});

// A graph handed over in the IR's text form whose inputs are tensors (the Python backend's FX graphs,
// specialized by the caller on the values of their non-tensor inputs as `key`). It keeps one plan per
// input signature, as CompiledModule does (the same table, limit and warnings): run() runs the plan of
// the call's signature; when there is none the caller captures the graph for these inputs and add()s it.
//
//   GraphFunction f("forward");
//   switch (f.run(inputs, "", &outs)) {
//     case GraphFunction::Status::kRan: break;
//     case GraphFunction::Status::kNoPlan: if (f.add(inputs, "", ir_text, constants).compiled) break;
//                                          [[fallthrough]];  // the limit was reached meanwhile
//     case GraphFunction::Status::kEager: outs = run_the_graph_eagerly(inputs);
//   }
struct GraphPlanInfo {
  bool compiled = false;     // false: the signature runs eagerly (eager_reason); nothing was compiled
  std::string eager_reason;
  bool added_here = false;   // this call compiled the plan (false: another call had, or was compiling it)
  int kernels = 0;
  int fused_ops = 0;         // IR nodes inside kernels
  int aten_ops = 0;          // IR nodes run through ATen per call (constants not counted)
  double compile_ms = 0;     // parse, passes, fusion, codegen and compile of this plan
  bool from_plan_cache = false;
  // add_from_class: why the call lies outside the class (a guard its plan took fails there, a symbol below
  // 2); nothing was added. "" inside.
  std::string outside_class;
  bool class_built_here = false;  // add_from_class built the class's plan at this call
};

class GraphFunction {
 public:
  explicit GraphFunction(std::string name, CompileOptions options = {});
  ~GraphFunction();
  enum class Status {
    kRan,     // *outputs holds the plan's results
    kNoPlan,  // no plan for this signature yet: add() one
    kEager,   // this signature runs eagerly (the specialization limit was reached): the caller runs it
  };
  // Runs the plan of these inputs' signature (and `key`: what else the caller specialized on) into
  // *outputs. A signature being compiled by another thread is waited for.
  Status run(const std::vector<at::Tensor>& inputs, const std::string& key, std::vector<at::Tensor>* outputs);
  // Parses `ir`, checks that `inputs` match its inputs' types, optimizes, fuses and compiles it as the
  // plan of this signature; `fj::constant(i)` in it is constants[i]. Throws fusion_jit::Error (TypeError
  // when an input does not match) naming what is wrong; nothing is added then. Past the specialization
  // limit nothing is compiled (GraphPlanInfo::compiled is false; the first time, a warning).
  // With `outputs`: a graph whose types were derived (a symbolic graph's instance at these sizes) rather
  // than seen at run time. The new plan is run once on `inputs` before it is added, each ATen step's
  // results checked against the graph's types (a mismatch throws, and nothing is added), and its results
  // are put in *outputs (left empty when another thread added the plan: run() it then).
  GraphPlanInfo add(const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& ir,
                    const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs = nullptr);
  // add() of the shape class's graph `class_ir` (as add_from_class takes it) concretized at `bindings`:
  // every size, stride and integer the number its expression takes there. For a signature of the class
  // that gets a plan of its own (outside the class's plan, or that plan refused); checked as add() with
  // outputs checks a derived graph when `outputs` is given.
  GraphPlanInfo add_at(const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& class_ir,
                       const std::map<std::string, int64_t>& bindings, const std::vector<at::Tensor>& constants,
                       std::vector<at::Tensor>* outputs = nullptr);
  // Note [Plans of a shape class] (src/runtime/plan.h): adds the plan of this signature as an instance
  // of the plan of the shape class `class_ir`, a graph whose sizes are expressions over symbols (its header
  // naming each symbol's value at the call it was written for, "graph[s0=37](...)"). That plan is built
  // (passes, fusion, code generation, one compile) at the class's first use and kept; this call and every
  // later one of the class get theirs by evaluating it at `bindings`, the symbols' values at the call:
  // no parse, passes, fusion, code generation or compiler. Outside the class (GraphPlanInfo::outside_class)
  // nothing is added: the caller adds the signature's own graph. Inputs are checked as add() checks them,
  // against the class's input types at `bindings` (TypeError); the instance runs once on `inputs`, its ATen
  // steps' results checked against its types, as add() with outputs does, its results in *outputs.
  GraphPlanInfo add_from_class(const std::vector<at::Tensor>& inputs, const std::string& key,
                               const std::string& class_ir, const std::map<std::string, int64_t>& bindings,
                               const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs);
  // Shape classes whose plan is built (add_from_class).
  int num_classes() const;
  // The plan of this signature as text (explain_plan), or "" when there is none.
  std::string explain(const std::vector<at::Tensor>& inputs, const std::string& key) const;
  int num_plans() const;
  // Plans dropped past CompileOptions::shared_plans (Note [Shared plans are kept by recency]).
  int plans_dropped() const;
  // Drops every plan and eager signature (the next call of each signature must add it again).
  void clear();

 private:
  GraphPlanInfo add_graph(const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& ir,
                          const std::map<std::string, int64_t>* at, const std::vector<at::Tensor>& constants,
                          std::vector<at::Tensor>* outputs);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusion_jit
