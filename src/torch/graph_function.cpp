// SignatureTable (graph_function.h) and GraphFunction, plans of graphs handed over as IR text
// (fusion_jit/fusion_jit.h).
#include "torch/graph_function.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>

#include <fmt/ranges.h>

#include <chrono>

#include "driver/build_plan.h"
#include "fusion_jit/cache.h"
#include "passes/passes.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "torch/session.h"

namespace fusion_jit {

DynamicSizes dynamic_sizes(const CompileOptions& options) {
  if (!options.dynamic) return Options::get().dynamic;
  return parse_dynamic_sizes("CompileOptions::dynamic", *options.dynamic);
}

void set_plan_size_args(DynamicSizes mode, const SignatureTable& table, PlanTarget* target) {
  const bool later = table.num_plans() > 0;
  target->size_args = mode == DynamicSizes::kOn || (mode == DynamicSizes::kAuto && later);
  target->size_args_if_compiled = mode == DynamicSizes::kAuto && !later;
}

std::set<std::string> passes_skipped(const std::set<std::string>& disable, const PlanTarget& target) {
  std::set<std::string> skip = disable;
  if (target.size_args) skip.insert("prepack.linear_mkl");
  return skip;
}

void apply_process_options(const CompileOptions& options) {
  FJ_CHECK(options.remote_cache.has_value() == options.remote_cache_key_file.has_value(),
           "CompileOptions::remote_cache and remote_cache_key_file go together (entries are code, signed with the "
           "key file's key)");
  if (options.remote_cache) cache::use_remote(*options.remote_cache, *options.remote_cache_key_file);
}

int shared_plans(const CompileOptions& options) {
  int kept = options.shared_plans.value_or(Options::get().shared_plans);
  FJ_CHECK(kept >= 1, "shared_plans must be >= 1, got {}", kept);
  return kept;
}

int specialization_limit(const CompileOptions& options) {
  int limit = options.specialization_limit.value_or(Options::get().specialization_limit);
  FJ_CHECK(limit >= 0, "the specialization limit must be >= 0, got {}", limit);
  return limit;
}

std::set<std::string> module_disable(const CompileOptions& options, const std::string& module) {
  std::set<std::string> known;
  for (const std::string& n : pipeline_names()) known.insert(n);
  known.insert("channels_last");
  known.insert("in_place");
  known.insert("symbolic");
  known.insert("symbolic.class");
  known.insert("weight_memo");  // read by the Python package (Note [Weights reordered once per content])
  std::set<std::string> out;
  for (const std::string& name : options.disable) {
    if (!known.count(name)) {
      const bool process_wide = Options::disable_names().count(name) > 0;
      FJ_CHECK(false, "{}: the disable option names '{}', {}; it takes: {}", module, name,
               process_wide ? "a process-wide switch (set it in FUSION_JIT_DISABLE)" : "which is not a pass or rule",
               fmt::join(known, ", "));
    }
    out.insert(name);
  }
  return out;
}

SignatureTable::SignatureTable(std::string name, int limit, int shared, WarningHandler warn)
    : name_(std::move(name)), limit_(limit), shared_limit_(shared), warn_(std::move(warn)) {}

void SignatureTable::add_shared_locked(const std::shared_ptr<Entry>& e) {
  if (e->shared) return;
  e->shared = true;
  e->last_use = ++clock_;
  shared_++;
  while (shared_ > shared_limit_) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second->shared && it->second->ready && it->second != e &&
          (oldest == entries_.end() || it->second->last_use < oldest->second->last_use))
        oldest = it;
    if (oldest == entries_.end()) break;
    entries_.erase(oldest);
    shared_--;
    dropped_++;
  }
}

void SignatureTable::warn(const std::string& message) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!warned_.insert(message).second) return;
  }
  if (warn_) warn_(message);
  else log_message(LogLevel::kWarn, message);
}

std::string SignatureTable::limit_warning(const std::string& reason) const {
  return fmt::format("{}: {}; new input signatures run eagerly (raise FUSION_JIT_SPECIALIZATION_LIMIT or the "
                     "specialization_limit option to compile more)", name_, reason);
}

std::shared_ptr<SignatureTable::Entry> SignatureTable::find_locked(std::unique_lock<std::mutex>& lock,
                                                                   const std::string& sig, bool record,
                                                                   bool* past_limit) {
  *past_limit = false;
  auto it = entries_.find(sig);
  if (it != entries_.end()) {
    std::shared_ptr<Entry> e = it->second;
    ready_.wait(lock, [&] { return e->ready; });
    e->last_use = ++clock_;
    return e;
  }
  if (reserved_ < limit_ || !record) return nullptr;
  auto e = std::make_shared<Entry>();
  e->eager_reason = fmt::format("specialization limit of {} signatures reached", limit_);
  e->ready = true;
  entries_.emplace(sig, e);
  add_shared_locked(e);
  *past_limit = true;
  return e;
}

std::shared_ptr<const SignatureTable::Entry> SignatureTable::find(const std::string& sig, bool record) {
  bool past_limit = false;
  std::shared_ptr<Entry> e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    e = find_locked(lock, sig, record, &past_limit);
  }
  if (past_limit) warn(limit_warning(e->eager_reason));
  return e;
}

std::shared_ptr<const SignatureTable::Entry> SignatureTable::get_or_compile(const std::string& sig,
                                                                            const Compile& compile,
                                                                            const std::string& eager_reason,
                                                                            bool* compiled_here) {
  if (compiled_here) *compiled_here = false;
  std::shared_ptr<Entry> e;
  int64_t generation = 0;
  bool eager_now = false;  // recorded as eager here, nothing to compile
  bool admit_only = false;  // past the limit: admitted only with a known code class
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = entries_.find(sig);
    if (it != entries_.end()) {
      e = it->second;
      ready_.wait(lock, [&] { return e->ready; });
      e->last_use = ++clock_;
      return e;
    }
    e = std::make_shared<Entry>();
    entries_.emplace(sig, e);
    if (!eager_reason.empty()) {
      e->eager_reason = eager_reason;
      e->ready = eager_now = true;
      add_shared_locked(e);
    } else if (reserved_ >= limit_ && !(size_args_ && limit_ > 0)) {
      e->eager_reason = fmt::format("specialization limit of {} signatures reached", limit_);
      e->ready = eager_now = true;
      add_shared_locked(e);
    } else if (reserved_ >= limit_) {
      admit_only = true;
      generation = generation_;
    } else {
      reserved_++;
      generation = generation_;
    }
  }
  if (eager_now) {
    if (eager_reason.empty())
      warn(limit_warning(e->eager_reason));
    else
      warn(fmt::format("{}: {}", name_, eager_reason));
    return e;
  }
  // Compiled with no lock held: calls of other signatures go on meanwhile.
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<PlanInstance> instance;
  std::string reason;
  std::exception_ptr error;
  bool refused = false;  // past the limit with code of its own
  const Admit admit = [this](const std::string& code_class) {
    std::lock_guard<std::mutex> g(mu_);
    return code_class.empty() || classes_.count(code_class) > 0;
  };
  try {
    try {
      instance = compile(&reason, admit_only ? admit : Admit());
    } catch (const PlanRefused&) {
      instance = nullptr;
      refused = true;
      reason = fmt::format("specialization limit of {} signatures reached", limit_);
    }
    FJ_INTERNAL_ASSERT(instance || !reason.empty(), "{}: a compile gave neither a plan nor a reason", name_);
  } catch (...) {
    error = std::current_exception();
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> g(mu_);
    const bool current = generation == generation_;
    e->compile_ms = ms;
    if (current) compile_ms_ += ms;
    if (instance) {
      e->instance = std::move(instance);
      if (current) {
        plans_++;
        const ExecutablePlan& p = *e->instance->plan;
        // A signature whose code an earlier one brought, or that has no code (its plan is ATen's and
        // the libraries' calls only: nothing was compiled for it), does not count against the limit.
        const bool shared = admit_only || p.code_class.empty() || !classes_.insert(p.code_class).second;
        if (shared && !admit_only) reserved_--;
        for (const auto& k : p.kernels) size_args_ = size_args_ || !k.spec.args.empty();
        e->ready = true;
        if (shared) add_shared_locked(e);
      }
    } else {
      e->eager_reason = error ? "compiling it failed" : reason;
      if (current) {
        if (!admit_only) reserved_--;
        e->ready = true;
        if (error) entries_.erase(sig);
        else add_shared_locked(e);
      }
    }
    e->ready = true;
  }
  ready_.notify_all();
  if (error) std::rethrow_exception(error);
  if (compiled_here) *compiled_here = true;
  if (refused) warn(limit_warning(e->eager_reason));
  else if (!e->instance) warn(fmt::format("{}: this input signature runs eagerly: {}", name_, e->eager_reason));
  return e;
}

int SignatureTable::num_plans() const {
  std::lock_guard<std::mutex> g(mu_);
  return plans_;
}

int SignatureTable::num_dropped() const {
  std::lock_guard<std::mutex> g(mu_);
  return dropped_;
}

int SignatureTable::num_entries() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<int>(entries_.size());
}

double SignatureTable::compile_ms() const {
  std::lock_guard<std::mutex> g(mu_);
  return compile_ms_;
}

void SignatureTable::clear() {
  std::lock_guard<std::mutex> g(mu_);
  // Entries being compiled stay valid for their waiters (they hold them); they are no longer found.
  entries_.clear();
  reserved_ = plans_ = shared_ = 0;
  classes_.clear();
  size_args_ = false;
  compile_ms_ = 0;
  generation_++;
  warned_.clear();
}

namespace {

// The graph's input types at `at` (a class's graph, Note [Plans of a shape class]; null: its own numbers)
// against the inputs'. TypeError naming the first that differs.
void check_inputs(const std::string& what, const Graph& g, const std::vector<at::Tensor>& inputs,
                  const SymBindings* at) {
  FJ_CHECK(g.inputs().size() == inputs.size(), "{}: the graph takes {} inputs, {} were given", what, g.inputs().size(),
           inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* in = g.inputs()[i];
    FJ_TYPE_CHECK(in->is_tensor(), "{}: graph input {} is a {}, not a tensor", what, i, in->type().str());
    FJ_TYPE_CHECK(inputs[i].defined(), "{}: input {} is an undefined tensor", what, i);
    TensorType want = in->tensor_type();
    if (at) {
      for (SymInt& x : want.sizes) x = SymInt(x.evaluate(*at));
      for (SymInt& x : want.strides) x = SymInt(x.evaluate(*at));
    }
    TensorType t = tensor_type_of(inputs[i]);
    FJ_TYPE_CHECK(t == want, "{}: input {} is {}, the graph's input is {}{}", what, i, t.str(), want.str(),
                  at ? " (" + in->tensor_type().str() + " of its class)" : std::string());
  }
}

}  // namespace

CapturedGraph captured_from_ir(const std::string& what, const std::vector<at::Tensor>& inputs, const std::string& ir,
                               const std::vector<at::Tensor>& constants, const SymBindings* at) {
  CapturedGraph cap;
  cap.graph = parse_graph(ir);
  cap.output_kind = OutputKind::kList;
  const Graph& g = *cap.graph;
  FJ_CHECK(at || g.symbols().empty(), "{}: the graph has symbolic sizes ({}); plans are built from graphs of numbers",
           what, print_graph(g).substr(0, print_graph(g).find('(')));
  if (at)
    for (const auto& [name, hint] : g.symbols())
      FJ_CHECK(at->count(name), "{}: the class's symbol {} has no value at this call", what, name);
  check_inputs(what, g, inputs, at);
  for (const Value* o : g.outputs())
    FJ_TYPE_CHECK(o->is_tensor(), "{}: graph output {} is a {}; outputs must be tensors", what, o->name(),
                  o->type().str());
  for (const at::Tensor& c : constants) cap.constants.emplace_back(c);
  for (const Node* n : g.nodes())
    if (n->is_constant())
      FJ_CHECK(n->constant_index() >= 0 && n->constant_index() < static_cast<int64_t>(constants.size()),
               "{}: fj::constant({}) is out of range: {} constants were given", what, n->constant_index(),
               constants.size());
  verify_graph(g);
  return cap;
}

// Shape classes (Note [Plans of a shape class], Note [Shape classes of captured graphs])

std::shared_ptr<ClassPlan> build_class_plan(CapturedGraph cap, PlanTarget target, const std::set<std::string>& disable,
                                            FoldedConstants* folded) {
  auto cls = std::make_shared<ClassPlan>();
  cls->captured = cap.graph->clone();
  target.size_args = true;
  ShapeGuards guards;
  {
    GuardScope scope(guards);
    guards.set_phase("constants");
    optimize_captured(cap, passes_skipped(disable, target), folded);
    guards.set_phase("plan");
    cls->plan = build_plan(std::move(cap.graph), target);
  }
  cls->constants = std::move(cap.constants);
  return cls;
}

std::string class_outside(const ClassPlan& cls, const SymBindings& at) {
  for (const auto& [name, value] : at)
    if (value < 2) return fmt::format("{} = {}: sizes 0 and 1 are classes of their own", name, value);
  for (const SymGuard& g : cls.plan->guards.guards())
    if (!g.holds(at)) return fmt::format("its guard {} ({}) fails", g.str(), g.phase.empty() ? "capture" : g.phase);
  return "";
}

std::unique_ptr<PlanInstance> class_instance(const ClassPlan& cls, const SymBindings& at, bool in_place) {
  auto inst = std::make_unique<PlanInstance>();
  inst->captured.output_kind = OutputKind::kList;
  inst->captured.constants = cls.constants;
  inst->plan = instantiate_plan(*cls.plan, at);
  resolve_aten_steps(*inst, in_place);
  return inst;
}

namespace {

// Each tensor input's sizes, in order.
std::vector<std::vector<int64_t>> input_sizes(const Graph& g) {
  std::vector<std::vector<int64_t>> out;
  for (const Value* v : g.inputs()) {
    out.emplace_back();
    if (v->is_tensor())
      for (const SymInt& d : v->tensor_type().sizes) out.back().push_back(d.hint());
  }
  return out;
}

// The extents that change from `a`'s inputs to `b`'s (first value -> second), or why there is no such map:
// one value that becomes two.
std::map<int64_t, int64_t> changed_extents(const Graph& a, const Graph& b, std::string* why) {
  const auto sa = input_sizes(a), sb = input_sizes(b);
  std::map<int64_t, int64_t> out;
  if (sa.size() != sb.size()) return out;
  for (size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].size() != sb[i].size()) return {};
    for (size_t d = 0; d < sa[i].size(); ++d) {
      if (sa[i][d] == sb[i][d]) continue;
      auto [it, added] = out.emplace(sa[i][d], sb[i][d]);
      if (!added && it->second != sb[i][d]) {
        *why = fmt::format("input extents of {} became {} and {}", sa[i][d], it->second, sb[i][d]);
        return {};
      }
    }
  }
  return out;
}

// Whether an input extent of `g` is 0 or 1 where `reference`'s is larger.
bool small_where_reference_is_not(const Graph& reference, const Graph& g) {
  const auto sr = input_sizes(reference), sg = input_sizes(g);
  for (size_t i = 0; i < sr.size() && i < sg.size(); ++i)
    for (size_t d = 0; d < sr[i].size() && d < sg[i].size(); ++d)
      if (sg[i][d] < 2 && sr[i][d] >= 2) return true;
  return false;
}

// The values of the class's symbols at the capture `g`, each read where the class's graph has it as an
// input's size (generalize() names one per input extent); nullopt where one is not read so or disagrees.
std::optional<SymBindings> bindings_at(const Graph& cls, const Graph& g) {
  if (cls.inputs().size() != g.inputs().size()) return std::nullopt;
  SymBindings at;
  for (size_t i = 0; i < cls.inputs().size(); ++i) {
    const Value *c = cls.inputs()[i], *v = g.inputs()[i];
    if (!c->is_tensor() || !v->is_tensor()) continue;
    const SymSizes &cs = c->tensor_type().sizes, &vs = v->tensor_type().sizes;
    if (cs.size() != vs.size()) return std::nullopt;
    for (size_t d = 0; d < cs.size(); ++d) {
      if (!cs[d].is_symbolic()) continue;
      const std::vector<std::string> names = cs[d].expr()->symbols();
      if (names.size() != 1 || cs[d].str() != names[0]) continue;
      auto [it, added] = at.emplace(names[0], vs[d].hint());
      if (!added && it->second != vs[d].hint()) return std::nullopt;
    }
  }
  for (const auto& [name, hint] : cls.symbols())
    if (!at.count(name)) return std::nullopt;
  return at;
}

bool same_constants(const std::vector<c10::IValue>& a, const std::vector<c10::IValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].isSameIdentity(b[i])) return false;
  return true;
}

}  // namespace

std::unique_ptr<PlanInstance> CapturedClasses::instance_for(CapturedGraph& cap, bool in_place, const BuildClass& build,
                                                            std::string* why) {
  std::string ignored;
  if (!why) why = &ignored;
  cap.graph->renumber();  // values in definition order, as a capture planned on its own always had them
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Family>& kind = families_[structure_hash(*cap.graph)];
  Family* f = nullptr;
  for (Family& k : kind)  // the family whose reference is the same program, sizes aside
    if (!f && k.reference && same_program(*k.reference, *cap.graph)) f = &k;
  if (!f) {
    kind.emplace_back();
    f = &kind.back();
  }
  std::shared_ptr<const ClassPlan> cls;
  std::optional<SymBindings> at;
  for (auto it = f->classes.begin(); it != f->classes.end() && !cls; ++it)
    if ((at = bindings_at(*(*it)->captured, *cap.graph)) && same_constants((*it)->constants, cap.constants) &&
        class_outside(**it, *at).empty() && is_instance(*(*it)->captured, *at, *cap.graph))
      cls = *it;
  if (!cls) *why = make_class(*f, cap, build, &cls, &at);
  if (cls && why->empty()) {
    auto inst = class_instance(*cls, *at, in_place);
    inst->captured.output_kind = cap.output_kind;
    inst->captured.eager_peak_bytes = eager_peak_bytes(*cap.graph);
    return inst;
  }
  if (!f->reference || !small_where_reference_is_not(*f->reference, *cap.graph)) {
    f->reference = cap.graph->clone();  // the family's reference from now on
    f->constants = cap.constants;
  }
  return nullptr;
}

std::string CapturedClasses::make_class(Family& f, const CapturedGraph& cap, const BuildClass& build,
                                        std::shared_ptr<const ClassPlan>* made, std::optional<SymBindings>* at) {
  if (!f.reference) return "the first capture of its kind";
  if (!f.no_class.empty()) return f.no_class;
  if (!same_constants(f.constants, cap.constants)) return "its constants are not those of the capture before it";
  std::string why;
  const std::map<int64_t, int64_t> extents = changed_extents(*f.reference, *cap.graph, &why);
  std::unique_ptr<Graph> class_graph = why.empty() ? generalize(*f.reference, *cap.graph, extents, &why) : nullptr;
  if (!class_graph) return why;
  CapturedGraph c;
  c.graph = std::move(class_graph);
  c.constants = cap.constants;
  c.output_kind = cap.output_kind;
  *at = bindings_at(*c.graph, *cap.graph);
  if (!*at || !is_instance(*c.graph, c.graph->symbols(), *f.reference, &why) || !is_instance(*c.graph, **at, *cap.graph, &why))
    return "the class's graph is not both captures' graph at their sizes" + (why.empty() ? "" : ": " + why);
  try {
    *made = build(std::move(c));
  } catch (const PlanRefused&) {
    throw;
  } catch (const std::exception& e) {
    return f.no_class = std::string("building its class's plan failed: ") + e.what();  // planned on its own
  }
  f.classes.push_back(*made);
  why = class_outside(**made, **at);
  if (why.empty()) return "";
  // The class's plan decided on a size that this capture does not share: the family is not generalized
  // again (each try would build a plan); its class serves the sizes where it holds.
  return f.no_class = "outside the class made with it: " + why;
}

int CapturedClasses::num_classes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [key, kind] : families_)
    for (const Family& f : kind) n += static_cast<int>(f.classes.size());
  return n;
}

void CapturedClasses::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  families_.clear();
}

// GraphFunction

struct GraphFunction::Impl {
  Impl(std::string name, const CompileOptions& o) : session(std::move(name), o), options(o) {}
  // Note [The plan session]: passes, shape classes, plans, the signature table, the folded constants.
  PlanSession session;
  SignatureTable& table = session.table();
  CompileOptions options;

  static std::string signature(const std::vector<at::Tensor>& inputs, const std::string& key,
                               std::vector<c10::IValue>* boxed) {
    boxed->assign(inputs.begin(), inputs.end());
    // With the grad mode, as CompiledModule's: an input that requires grad runs eagerly only under it.
    return input_signature(*boxed) + (c10::GradMode::is_enabled() ? '\2' : '\1') + key;
  }
  const std::string& name() const { return session.name(); }

  // Parses and compiles `ir` for these inputs (GraphFunction::add); with `at`, `ir` is a class's graph,
  // concretized there (GraphFunction::add_at).
  std::unique_ptr<PlanInstance> compile(const std::vector<at::Tensor>& inputs, const std::string& ir,
                                        const std::vector<at::Tensor>& constants, const SignatureTable::Admit& admit,
                                        const SymBindings* at = nullptr) {
    CapturedGraph cap = captured_from_ir(name(), inputs, ir, constants, at);
    if (at) {
      cap.graph = concretize(*cap.graph, *at);
      verify_graph(*cap.graph);
    }
    const PlanTarget target = session.target(admit);
    return session.plan_alone(std::move(cap), target, session.skipped(target));
  }

  // Builds the plan of the class `ir` (checked against `inputs` at `at`), its guards recorded.
  std::shared_ptr<const ClassPlan> build_class(const std::vector<at::Tensor>& inputs, const std::string& ir,
                                               const std::vector<at::Tensor>& constants, const SymBindings& at,
                                               const SignatureTable::Admit& admit) {
    return session.build_class(ir, captured_from_ir(name(), inputs, ir, constants, &at), admit);
  }

  // The plan of the class at `at` (Note [Plans of a shape class]), checked against `inputs`.
  std::unique_ptr<PlanInstance> instance(const ClassPlan& cls, const std::vector<at::Tensor>& inputs,
                                         const SymBindings& at) const {
    check_inputs(name(), *cls.captured, inputs, &at);
    auto inst = class_instance(cls, at, session.in_place());
    inst->captured.eager_peak_bytes = eager_peak_bytes(*concretize(*cls.captured, at));
    return inst;
  }
};

GraphFunction::GraphFunction(std::string name, CompileOptions options)
    : impl_(std::make_unique<Impl>(std::move(name), options)) {}
GraphFunction::~GraphFunction() = default;

GraphFunction::Status GraphFunction::run(const std::vector<at::Tensor>& inputs, const std::string& key,
                                         std::vector<at::Tensor>* outputs) {
  std::vector<c10::IValue> boxed;
  auto e = impl_->table.find(Impl::signature(inputs, key, &boxed));
  if (!e) return Status::kNoPlan;
  if (!e->instance) return Status::kEager;
  bool replayed = false;
  c10::IValue out = run_instance(*e->instance, boxed, impl_->options.cuda_graphs.value_or(false), impl_->name(),
                                 &replayed);
  outputs->clear();
  for (const c10::IValue& v : out.toListRef()) outputs->push_back(v.toTensor());
  return Status::kRan;
}

namespace {

// A new plan's first run, before it is published (add with outputs, add_from_class): a step whose results
// differ from the graph's types throws here.
void checked_first_run(const PlanInstance& inst, const std::vector<c10::IValue>& boxed, std::vector<at::Tensor>* outputs) {
  c10::IValue out = run_plan(inst, boxed, /*check_layouts=*/true);
  for (const c10::IValue& v : out.toListRef()) outputs->push_back(v.toTensor());
}

// What add_from_class throws out of the table's compile when the class's plan, built there, does not hold
// at the call: nothing is recorded.
struct OutsideClass : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What add and add_from_class say of the signature's entry.
GraphPlanInfo& describe_entry(const SignatureTable::Entry& e, GraphPlanInfo& info) {
  if (!e.instance) {
    info.eager_reason = e.eager_reason;
    return info;
  }
  const ExecutablePlan& p = *e.instance->plan;
  info.compiled = true;
  info.kernels = static_cast<int>(p.kernels.size());
  info.fused_ops = p.fused_ops;
  for (const auto& [schema, count] : p.aten_ops) info.aten_ops += count;  // constants are not counted there
  info.from_plan_cache = p.from_plan_cache;
  info.compile_ms = e.compile_ms;
  return info;
}

}  // namespace

GraphPlanInfo GraphFunction::add(const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& ir,
                                 const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs) {
  return add_graph(inputs, key, ir, nullptr, constants, outputs);
}

GraphPlanInfo GraphFunction::add_at(const std::vector<at::Tensor>& inputs, const std::string& key,
                                    const std::string& class_ir, const std::map<std::string, int64_t>& bindings,
                                    const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs) {
  return add_graph(inputs, key, class_ir, &bindings, constants, outputs);
}

GraphPlanInfo GraphFunction::add_graph(const std::vector<at::Tensor>& inputs, const std::string& key,
                                       const std::string& ir, const std::map<std::string, int64_t>* at,
                                       const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs) {
  std::vector<c10::IValue> boxed;
  GraphPlanInfo info;
  if (outputs) outputs->clear();
  const std::string sig = Impl::signature(inputs, key, &boxed);  // (fills `boxed`, read below)
  auto e = impl_->table.get_or_compile(
      sig,
      [&](std::string*, const SignatureTable::Admit& admit) {
        auto inst = impl_->compile(inputs, ir, constants, admit, at);
        if (outputs) checked_first_run(*inst, boxed, outputs);
        return inst;
      },
      grad_eager_reason(boxed), &info.added_here);
  return describe_entry(*e, info);
}

GraphPlanInfo GraphFunction::add_from_class(const std::vector<at::Tensor>& inputs, const std::string& key,
                                            const std::string& class_ir, const std::map<std::string, int64_t>& bindings,
                                            const std::vector<at::Tensor>& constants, std::vector<at::Tensor>* outputs) {
  std::vector<c10::IValue> boxed;
  GraphPlanInfo info;
  outputs->clear();
  std::shared_ptr<const ClassPlan> cls = impl_->session.find_class(class_ir);
  if (cls) {
    info.outside_class = class_outside(*cls, bindings);
    if (!info.outside_class.empty()) return info;
  }
  std::shared_ptr<const SignatureTable::Entry> e;
  try {
    const std::string sig = Impl::signature(inputs, key, &boxed);  // (fills `boxed`, read below)
    e = impl_->table.get_or_compile(
        sig,
        [&](std::string*, const SignatureTable::Admit& admit) {
          if (!cls) {
            cls = impl_->build_class(inputs, class_ir, constants, bindings, admit);
            info.class_built_here = true;
            const std::string why = class_outside(*cls, bindings);
            if (!why.empty()) throw OutsideClass(why);
          }
          auto inst = impl_->instance(*cls, inputs, bindings);
          checked_first_run(*inst, boxed, outputs);
          return inst;
        },
        grad_eager_reason(boxed), &info.added_here);
  } catch (const OutsideClass& o) {
    info.outside_class = o.what();
    return info;
  }
  return describe_entry(*e, info);
}

int GraphFunction::num_classes() const {
  return impl_->session.num_classes();
}

std::string GraphFunction::explain(const std::vector<at::Tensor>& inputs, const std::string& key) const {
  std::vector<c10::IValue> boxed;
  auto e = impl_->table.find(Impl::signature(inputs, key, &boxed), /*record=*/false);
  return e && e->instance ? e->instance->plan->explain() + instance_explain(*e->instance) : "";
}

int GraphFunction::num_plans() const { return impl_->table.num_plans(); }
int GraphFunction::plans_dropped() const { return impl_->table.num_dropped(); }

void GraphFunction::clear() {
  impl_->session.clear();
}

}  // namespace fusion_jit
