// SignatureTable: the one "one plan per input signature" table of fusion_jit. CompiledModule (TorchScript
// modules and traced functions) and GraphFunction (graphs handed over as IR text, hence the torch.compile
// backend) keep their plans in one each; the specialization limit and its warning live only here.
//
// Note [One plan per input signature]
// - A call looks its signature up under the table's lock (a std::unordered_map, on every call: a small
//   part of a served call; absl::flat_hash_map was measured slower there, bench/RESULTS.md "Signature
//   lookup").
// - A new signature under the limit is reserved under the lock, then compiled with no lock held: calls
//   of other signatures go on meanwhile, callers of the same signature wait for it (`Entry::ready`).
// - A new signature past the limit, or one the caller says must run eagerly (an input that requires grad
//   under grad mode), is recorded as eager with its reason. Every distinct warning is given once per
//   table, through CompileOptions::on_warning (by default the log, on stderr).
// - The limit counts the signatures that brought code of their own (Note [Sizes as kernel arguments]):
//   a compiled signature whose plan's code_class an earlier one has, or whose plan has no kernel of ours
//   (ATen's and the libraries' calls only, nothing compiled), is given its reservation back. Past the
//   limit, once the table holds a plan whose kernels read their sizes as arguments, a new signature is
//   still captured and its plan built, admitted only if its code_class is one the table has or it has no
//   kernels (so no compiler runs); otherwise it runs eagerly, with the limit's warning.
// - Note [Shared plans are kept by recency]: the entries that the limit does not bound (plans whose code an
//   earlier signature brought or that have none, and signatures recorded as eager) are kept up to a bound per table
//   (CompileOptions::shared_plans, FUSION_JIT_SHARED_PLANS); past it the least recently called of them is
//   dropped, and, should its signature come again, built again (capture, passes and code generation:
//   milliseconds, no compiler, since the plan that brought its code is kept) or recorded as eager again.
//   A served model that sees a new sequence length in every request thus holds a bounded number of
//   plans. A call holds its entry (a shared_ptr): dropping one that runs is safe.
// - A compile either returns the plan, or returns null with the reason the signature runs eagerly from
//   then on (a capture that failed), or throws: then nothing is recorded, the reservation is given back,
//   and the exception reaches the caller (GraphFunction::add's errors, FUSION_JIT_ASSERT_NO_COMPILE).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fusion_jit/fusion_jit.h"
#include "support/options.h"
#include "torch/executor.h"

namespace fusion_jit {

class SignatureTable {
 public:
  struct Entry {
    std::shared_ptr<PlanInstance> instance;  // null: the signature runs eagerly
    std::string eager_reason;
    double compile_ms = 0;
    bool ready = false;  // compiled (or found eager); guarded by the table's lock until then
    // Guarded by the table's lock: whether the limit does not bound it (Note [Shared plans are kept by
    // recency]) and when it was last found.
    bool shared = false;
    int64_t last_use = 0;
  };
  // Compiles the signature's plan; returns null with *eager_reason set when it must run eagerly. `admit`
  // is for PlanTarget::admit: null under the limit; past it, it admits the code classes the table has
  // (and build_plan's PlanRefused, caught by the table, makes the signature eager).
  using Admit = std::function<bool(const std::string& code_class)>;
  using Compile = std::function<std::unique_ptr<PlanInstance>(std::string* eager_reason, const Admit& admit)>;

  // `limit`: signatures compiled at most; `shared`: shared entries kept at most (Note [Shared plans are kept
  // by recency]); `warn` null: the log's warning.
  SignatureTable(std::string name, int limit, int shared, WarningHandler warn);

  // The entry of `sig`, waiting while another thread compiles it; null when there is none and the limit
  // still allows one. Past the limit an eager entry is recorded and returned (with `record`; else null).
  std::shared_ptr<const Entry> find(const std::string& sig, bool record = true);
  // The entry of `sig` as find() gives it, or, when there is none, a new one: eager with `eager_reason`
  // when that is given, else compiled by `compile` with no lock held. `*compiled_here` says whether this
  // call compiled it.
  std::shared_ptr<const Entry> get_or_compile(const std::string& sig, const Compile& compile,
                                              const std::string& eager_reason = "", bool* compiled_here = nullptr);
  // Gives `message` to the warning handler unless this table gave it already.
  void warn(const std::string& message);

  const std::string& name() const { return name_; }
  int limit() const { return limit_; }
  int num_plans() const;
  int num_dropped() const;    // shared entries dropped past the bound (Note [Shared plans are kept by recency])
  int num_entries() const;    // signatures held now, plans and eager ones
  double compile_ms() const;  // all compiles, failed ones included
  void clear();

 private:
  std::shared_ptr<Entry> find_locked(std::unique_lock<std::mutex>& lock, const std::string& sig, bool record,
                                     bool* past_limit);
  std::string limit_warning(const std::string& reason) const;
  // Marks `e` shared and drops the least recently found ready shared entries past the bound.
  void add_shared_locked(const std::shared_ptr<Entry>& e);

  const std::string name_;
  const int limit_;
  const int shared_limit_;
  const WarningHandler warn_;
  mutable std::mutex mu_;
  std::condition_variable ready_;  // an entry became ready
  std::unordered_map<std::string, std::shared_ptr<Entry>> entries_;
  int reserved_ = 0;  // signatures compiled or being compiled (counted against the limit)
  std::unordered_set<std::string> classes_;  // code classes of the compiled plans
  bool size_args_ = false;  // a compiled plan has kernels that read their sizes as arguments
  int plans_ = 0;
  int shared_ = 0;    // entries marked shared
  int dropped_ = 0;
  int64_t clock_ = 0;  // last_use stamps
  double compile_ms_ = 0;
  int64_t generation_ = 0;  // clear() starts a new one: compiles begun before it do not count after it
  std::unordered_set<std::string> warned_;
};

// The limit of CompileOptions, or the FUSION_JIT_SPECIALIZATION_LIMIT option.
int specialization_limit(const CompileOptions& options);
// What CompileOptions sets for the whole process (the remote tier); Error naming a bad value.
void apply_process_options(const CompileOptions& options);
// CompileOptions::shared_plans, or the FUSION_JIT_SHARED_PLANS option.
int shared_plans(const CompileOptions& options);
// CompileOptions::dynamic, or the FUSION_JIT_DYNAMIC option; Error naming a bad value.
DynamicSizes dynamic_sizes(const CompileOptions& options);
// Sets `target`'s size_args under `mode` for the next plan of `table`: always for on, from the table's
// second compiled plan for auto; auto's first plan reads its sizes only where that code is compiled
// already (PlanTarget::size_args_if_compiled).
void set_plan_size_args(DynamicSizes mode, const SignatureTable& table, PlanTarget* target);
// The passes and rules left out of a plan's pipeline: `disable`, and for a plan whose kernels read their
// sizes (a dynamic class, `target.size_args`) prepack.linear_mkl: MKL's packed weight serves only its exact
// row count, so every length of a served model would hold a packed copy of each weight; oneDNN's
// reordered weight serves any rows and is shared by octave (Note [Folded constants shared across
// signatures], torch/executor.h).
std::set<std::string> passes_skipped(const std::set<std::string>& disable, const PlanTarget& target);
// CompileOptions::disable as a set, checked: Error naming an unknown or process-wide name and the names
// it takes. `module`: the module's name, for the message.
std::set<std::string> module_disable(const CompileOptions& options, const std::string& module);
// The graph of `ir` (GraphFunction::add's IR text) for `inputs`, with `constants` for its fj::constant
// nodes, parsed and checked (each input's type is the graph input's, the outputs are tensors, every
// constant index is in range), not optimized; `what` names the graph in errors.
// With `at`: a shape class's graph (Note [Plans of a shape class]), its inputs' types checked at the symbols'
// values `at`, which must give each of its symbols.
CapturedGraph captured_from_ir(const std::string& what, const std::vector<at::Tensor>& inputs, const std::string& ir,
                               const std::vector<at::Tensor>& constants, const SymBindings* at = nullptr);


// Note [Plans of a shape class] (runtime/plan.h): a class's plan, kept by the graph function or module
// that built it, with what each instance needs.
struct ClassPlan {
  std::unique_ptr<ExecutablePlan> plan;
  std::unique_ptr<Graph> captured;  // the class's graph before the passes (each instance's input types,
                                    // eager peak memory, and the captures it is checked against)
  std::vector<c10::IValue> constants;
};
// Builds the plan of the class graph `cap` (passes, fusion, code generation with every size a kernel
// argument: `target.size_args` is set) under a GuardScope, its guards kept in the plan. `disable`: the
// module's CompileOptions::disable (passes_skipped adds what a class leaves out).
std::shared_ptr<ClassPlan> build_class_plan(CapturedGraph cap, PlanTarget target, const std::set<std::string>& disable,
                                            FoldedConstants* folded);
// Why `at` lies outside the class (a symbol below 2, a guard that fails there), or "".
std::string class_outside(const ClassPlan& cls, const SymBindings& at);
// The plan of the class at `at`, by evaluation (instantiate_plan), its ATen steps resolved; `output_kind`
// and eager_peak_bytes are the caller's to set where they differ from a list and 0.
std::unique_ptr<PlanInstance> class_instance(const ClassPlan& cls, const SymBindings& at, bool in_place);

// Note [Shape classes of captured graphs]
// The TorchScript and C++ function paths (CompiledModule) capture each new input signature: capture is one
// eager run, which gives the call its result, and its graph is exact for that signature. With
// CompileOptions::dynamic "auto" or "on", captures that are one program up to their integers (the same
// ops, arguments, dtypes, devices, literals and constants; same_program, bucketed by structure_hash) form a
// family. The second capture of a family that differs from the first makes its shape class: generalize()
// (Note [Graphs of two sizes], ir/graph.h) walks the two typed graphs, gives a symbol to each input extent
// that changed and an expression to each integer that differs, and the class's graph is kept only where
// both captures are its instances (is_instance). Its plan is built once (build_class_plan), and each later
// capture of the family that is an instance of the class's graph at the symbols' values read from its
// input sizes, with the same constants (the same tensors), and where every guard of the plan holds, gets
// its plan as an instance: no passes, fusion, code generation or compiler. Since the class's graph there is
// the capture's graph, the instance is the plan that capture would have built (Note [Plans of a shape
// class]). A capture that fits no class is planned on its own, as before, and becomes the family's
// reference for the next, unless an input extent is 0 or 1 where the reference's is not (sizes 0 and 1 are
// classes of their own; such a capture would make no class with the next). The first signature's plan is
// built on its own (static under auto). A family whose class's plan fails to build, or does not hold at
// the capture it was made with (a pass decided on a size), is not generalized again: each try would build
// a plan. disable="symbolic.class" (or FUSION_JIT_DISABLE) plans every signature on its own, as before.
// Thread-safe: one lock, held while a class is built.
class CapturedClasses {
 public:
  using BuildClass = std::function<std::shared_ptr<ClassPlan>(CapturedGraph cls)>;
  // The plan of `cap` (a new signature's capture, before the passes) as an instance of
  // the family's class, building the class from the family's reference capture when there is one and
  // none fits; null where none does (then `cap` is the family's reference from now on). `why` (when
  // given): why not, for explain.
  std::unique_ptr<PlanInstance> instance_for(CapturedGraph& cap, bool in_place, const BuildClass& build,
                                             std::string* why = nullptr);
  int num_classes() const;
  void clear();

 private:
  struct Family {
    std::shared_ptr<const Graph> reference;  // the capture the next is generalized with
    std::vector<c10::IValue> constants;
    std::vector<std::shared_ptr<const ClassPlan>> classes;
    std::string no_class;  // why its class failed: none is made again
  };
  // The class of `f`'s reference capture and `cap`, built and added to `f` into *made, and the symbols'
  // values at `cap` into *at; "" where `cap` is its instance, else why not.
  std::string make_class(Family& f, const CapturedGraph& cap, const BuildClass& build,
                         std::shared_ptr<const ClassPlan>* made, std::optional<SymBindings>* at);

  mutable std::mutex mu_;
  // By structure_hash(): the families of one hash, each one program up to its integers.
  std::unordered_map<size_t, std::vector<Family>> families_;
};

}  // namespace fusion_jit
