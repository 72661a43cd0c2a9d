#include "fusion_jit/fusion_jit.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <c10/core/GradMode.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <mutex>

#include "driver/build_plan.h"
#include "passes/passes.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "torch/executor.h"
#include "torch/graph_function.h"
#include "torch/module_access.h"
#include "torch/session.h"

namespace fusion_jit {
namespace tj = torch::jit;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<c10::IValue> graph_constant_tensors(const tj::Graph& g) {
  std::vector<c10::IValue> out;
  for (const tj::Node* n : g.nodes())
    if (n->kind() == c10::prim::Constant && n->output()->type()->kind() == c10::TypeKind::TensorType)
      if (auto v = tj::toIValue(n->output())) out.push_back(*v);
  return out;
}

}  // namespace

struct CompiledModule::Impl {
  Impl(std::string module_name, const CompileOptions& options)
      : name(std::move(module_name)),
        session(name, options),
        cuda_graphs(options.cuda_graphs.value_or(Options::get().cuda_graphs)) {}

  std::string name;
  // Note [The plan session]: passes, shape classes, plans, the signature table (one plan per signature,
  // graph_function.h), the folded constants.
  PlanSession session;
  SignatureTable& table = session.table();
  const std::set<std::string>& disable = session.disable();
  bool cuda_graphs = false;
  std::shared_ptr<tj::Graph> graph;
  bool skip_self = false;
  std::function<c10::IValue(const std::vector<c10::IValue>&)> eager;
  std::shared_ptr<tj::Module> module_keepalive;
  // The tensors of the graph's prim::Constant nodes (frozen weights and what freezing folded): results
  // that alias them, from the capture run or the eager fallback, are copied before they are returned.
  std::vector<c10::IValue> graph_constants;
  ChannelsLastCopies channels_last_copies;  // CaptureOptions's

  std::atomic<int64_t> calls{0}, eager_calls{0}, graph_replays{0};
  mutable std::mutex report_mu;
  std::string last_report;

  // Whether two distinct tensors of a result share storage (a tensor and a view of it): the layouts given
  // back at a channels-last plan's end (aten::contiguous per output) would copy them apart, so such a graph
  // keeps the NCHW capture (Note [Channels-last plans]).
  static bool outputs_share_storage(const c10::IValue& result) {
    std::vector<at::Tensor> ts;
    map_tensors(result, [&ts](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) ts.push_back(t);
      return t;
    });
    for (size_t i = 0; i < ts.size(); ++i)
      for (size_t j = i + 1; j < ts.size(); ++j)
        if (!ts[i].is_same(ts[j]) && ts[i].storage().is_alias_of(ts[j].storage())) return true;
    return false;
  }

  // Captures the graph for these inputs (Note [Channels-last plans]); `skip`: as prepare's.
  CapturedGraph capture(const std::vector<c10::IValue>& inputs, c10::IValue* result, const std::set<std::string>& skip) {
    CaptureResult cap = capture_graph(graph, inputs, skip_self);
    if (!skip.count("channels_last") && !Options::get().disabled.count("channels_last") &&
        wants_channels_last_capture(*graph) && !outputs_share_storage(cap.result)) {
      // Note [Channels-last plans]: where the cost model says the layout pays, captured again with
      // channels-last conv weights; the first run's result is eager's and gives eager's output layouts.
      // A graph that refuses the layout (a view that only a copy could give of a channels-last tensor)
      // keeps the NCHW capture: the layout is an optimization.
      LayoutDecision layout = decide_channels_last(*cap.captured.graph);
      if (layout.channels_last) {
        try {
          CaptureResult cl = capture_graph(graph, inputs, skip_self,
                                           CaptureOptions{/*channels_last_weights=*/true, &channels_last_copies});
          if (restore_eager_layouts(cl.captured, cap.captured)) cap.captured = std::move(cl.captured);
          else layout.line = "layout: NCHW kept (an output's eager layout is neither contiguous nor channels-last)";
        } catch (const std::exception& e) {
          layout.line = "layout: NCHW kept (channels-last failed: " + message_of(e) + ")";
        }
      }
      cap.captured.graph->notes().push_back(layout.line);
    }
    *result = std::move(cap.result);
    return std::move(cap.captured);
  }

  // Captures the graph for these inputs and runs the passes; the instance holds the optimized graph.
  // `skip`: passes or rule sets left out (run_pipeline). `to_cuda`: a plan for cuda:0
  // (optimize_captured_on_cuda).
  std::unique_ptr<PlanInstance> prepare(const std::vector<c10::IValue>& inputs, c10::IValue* result,
                                        double* capture_ms, double* passes_ms, const std::set<std::string>& skip = {},
                                        bool to_cuda = false) {
    auto t0 = std::chrono::steady_clock::now();
    auto inst = std::make_unique<PlanInstance>();
    inst->captured = capture(inputs, result, skip);
    *capture_ms = ms_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    session.optimize(inst->captured, skip, to_cuda);
    *passes_ms = ms_since(t1);
    return inst;
  }

  // prepare() for a plan that runs on cuda:0, from CPU inputs (compile_cuda, CUDA packages), with no
  // channels-last capture (Note [Channels-last plans]): a layout decision measured for the CPU's oneDNN only.
  std::unique_ptr<PlanInstance> prepare_cuda(const std::vector<c10::IValue>& inputs, c10::IValue* result,
                                             std::set<std::string> skip) {
    skip.insert("channels_last");
    double capture_ms = 0, passes_ms = 0;
    return prepare(inputs, result, &capture_ms, &passes_ms, skip, /*to_cuda=*/true);
  }

  c10::IValue run(PlanInstance& inst, const std::vector<c10::IValue>& inputs) {
    bool replayed = false;
    c10::IValue out = run_instance(inst, inputs, cuda_graphs, name, &replayed);
    if (replayed) graph_replays++;
    return out;
  }

  void set_report(std::string report) {
    std::lock_guard<std::mutex> g(report_mu);
    last_report = std::move(report);
  }

  // Captures these inputs and gives their plan: an instance of their shape class, or optimized, fused and
  // compiled on its own (the table's Compile). Any failure (ours, torch's, the model's own on these inputs)
  // makes the signature run eagerly, and eager's own error, if any, reaches the caller from the eager run;
  // FUSION_JIT_ASSERT_NO_COMPILE's error is thrown.
  std::unique_ptr<PlanInstance> compile(const std::vector<c10::IValue>& inputs, c10::IValue* first_result,
                                        std::string* eager_reason, const SignatureTable::Admit& admit) {
    try {
      c10::IValue result;
      const PlanTarget target = session.target(admit);
      const std::set<std::string> skip = session.skipped(target);
      auto t0 = std::chrono::steady_clock::now();
      CapturedGraph cap = capture(inputs, &result, skip);
      std::string report;
      std::unique_ptr<PlanInstance> inst = session.plan(std::move(cap), target, skip, ms_since(t0), &report);
      set_report(std::move(report));
      if (first_result) *first_result = std::move(result);
      return inst;
    } catch (const PlanRefused&) {
      throw;  // past the limit, with code of its own: the table records it as the limit's
    } catch (const std::exception& err) {
      auto* c10_error = dynamic_cast<const c10::Error*>(&err);
      *eager_reason = c10_error ? first_line(c10_error->what_without_backtrace()) : err.what();
      if (eager_reason->empty()) *eager_reason = "capturing or compiling it failed";
      if (Options::get().assert_no_compile && eager_reason->find("FUSION_JIT_ASSERT_NO_COMPILE") != std::string::npos)
        throw;
      return nullptr;
    }
  }

  // The entry of these inputs' signature, compiling it if new; `first_result` receives the capture
  // run's result when this call compiled.
  std::shared_ptr<const SignatureTable::Entry> entry_for(const std::vector<c10::IValue>& inputs,
                                                         c10::IValue* first_result) {
    std::string sig = input_signature(inputs);
    sig += c10::GradMode::is_enabled() ? '\1' : '\0';
    return table.get_or_compile(
        sig, [&](std::string* why, const SignatureTable::Admit& admit) { return compile(inputs, first_result, why, admit); },
        grad_eager_reason(inputs));
  }

  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
};

c10::IValue CompiledModule::operator()(const std::vector<c10::IValue>& inputs) {
  c10::IValue first;
  auto e = impl_->entry_for(inputs, &first);
  impl_->calls++;
  if (!e->instance) {
    impl_->eager_calls++;
    return unalias_constants(impl_->eager(inputs), impl_->graph_constants);
  }
  if (!first.isNone()) return unalias_constants(std::move(first), impl_->graph_constants);
  return impl_->run(*e->instance, inputs);
}

const ExecutablePlan* CompiledModule::plan_for(const std::vector<c10::IValue>& inputs) {
  auto e = impl_->entry_for(inputs, nullptr);
  return e->instance ? e->instance->plan.get() : nullptr;
}

std::string CompiledModule::explain(const std::vector<c10::IValue>& inputs) {
  auto e = impl_->entry_for(inputs, nullptr);
  if (!e->instance) return "runs eagerly: " + e->eager_reason + "\n";
  std::string s = e->instance->plan->explain() + instance_explain(*e->instance);
  if (impl_->cuda_graphs) {
    std::lock_guard<std::mutex> g(e->instance->graph_mu);
    if (e->instance->cuda_graph) s += fmt::format("cuda graphs: captured, {} replays\n", e->instance->cuda_graph->replays());
    else if (e->instance->graph_tried) s += "cuda graphs: not used: " + e->instance->graph_note + "\n";
    else s += "cuda graphs: captured at the next call\n";
  }
  return s;
}

std::string CompiledModule::last_compile_report() const {
  std::lock_guard<std::mutex> g(impl_->report_mu);
  return impl_->last_report;
}

ModuleStats CompiledModule::stats() const {
  ModuleStats s;
  s.calls = impl_->calls.load();
  s.signatures = impl_->table.num_plans();
  s.eager_calls = impl_->eager_calls.load();
  s.plans_kept = impl_->table.num_entries();
  s.plans_dropped = impl_->table.num_dropped();
  s.graph_replays = impl_->graph_replays.load();
  s.compile_ms = impl_->table.compile_ms();
  s.class_plans = impl_->session.num_classes();
  return s;
}

std::unique_ptr<PlanInstance> ModuleAccess::prepare(CompiledModule& m, const std::vector<c10::IValue>& inputs,
                                                   const std::set<std::string>& skip, c10::IValue* result,
                                                   bool to_cuda) {
  std::set<std::string> all = m.impl_->disable;
  all.insert(skip.begin(), skip.end());
  if (to_cuda) return m.impl_->prepare_cuda(inputs, result, all);
  double capture_ms = 0, passes_ms = 0;
  return m.impl_->prepare(inputs, result, &capture_ms, &passes_ms, all);
}
const std::string& ModuleAccess::name(const CompiledModule& m) { return m.impl_->name; }
bool ModuleAccess::enable_fusion(const CompiledModule& m) { return m.impl_->session.enable_fusion(); }
DynamicSizes ModuleAccess::dynamic(const CompiledModule& m) { return m.impl_->session.dynamic(); }
bool ModuleAccess::in_place(const CompiledModule& m) { return m.impl_->session.in_place(); }

std::shared_ptr<const ExecutablePlan> CompiledModule::compile_cuda(const std::vector<c10::IValue>& inputs,
                                                                 const std::string& arch, bool run_nvrtc) {
  for (size_t i = 0; i < inputs.size(); ++i)
    FJ_CHECK(!inputs[i].isTensor() || !inputs[i].toTensor().is_cuda(),
             "compile_cuda: input {} is already on a GPU; give CPU inputs (the plan is moved to cuda:0)", i);
  c10::IValue result;
  auto inst = impl_->prepare_cuda(inputs, &result, impl_->disable);
  PlanTarget target;
  target.enable_fusion = impl_->session.enable_fusion();
  target.arch["cuda"] = arch;
  target.compile = run_nvrtc;
  target.size_args = impl_->session.dynamic() == DynamicSizes::kOn;  // Note [CUDA size arguments]
  std::shared_ptr<ExecutablePlan> plan = build_plan(std::move(inst->captured.graph), target);
  if (const TargetCode* c = plan->code_for(Device::kCUDA); c && !plan->fallback_groups.empty())
    c->target->compile(c->source, arch);  // throws NVRTC's log
  return plan;
}

namespace {

// Note [Scalars freezing would drop]
// freeze_module runs TorchScript's alias-sensitive peephole pass, which replaces `x * 1`, `x + 0` and
// `x - 0` (integer literals, alpha 1) by `x` whenever x's dtype is not known to be floating. For a bool x
// that changes the result: eager's `mask * 1` and `mask + 0` are int64 tensors, and `mask - 0` raises,
// where the peephole leaves the bool mask (a silent wrong dtype in both the plan and the eager
// fallback). The pass only rewrites literals that are constants, so before freezing those literals
// become reads of module attributes that freezing preserves (`_fj_int_0`, `_fj_int_1`, on a copy of
// the module: the user's is left as it is); after freezing, the plan's graph reads the numbers again.
const char* kKeptIntNames[] = {"_fj_int_0", "_fj_int_1"};

bool constant_int(const tj::Value* v, int64_t want) {
  auto iv = tj::toIValue(v);
  return iv && iv->isInt() && iv->toInt() == want;
}

// The literal inputs of `g`'s nodes the peephole would match: (node, input index, literal).
std::vector<std::tuple<tj::Node*, size_t, int64_t>> literals_freezing_drops(tj::Block* block) {
  std::vector<std::tuple<tj::Node*, size_t, int64_t>> out;
  for (tj::Node* n : block->nodes()) {
    for (tj::Block* b : n->blocks()) {
      auto inner = literals_freezing_drops(b);
      out.insert(out.end(), inner.begin(), inner.end());
    }
    if (n->matches("aten::mul.Scalar(Tensor self, Scalar other) -> Tensor") && constant_int(n->input(1), 1)) {
      out.emplace_back(n, 1, 1);
    } else if ((n->matches("aten::add.Scalar(Tensor self, Scalar other, Scalar alpha) -> Tensor") ||
                n->matches("aten::sub.Scalar(Tensor self, Scalar other, Scalar alpha) -> Tensor")) &&
               constant_int(n->input(1), 0) && constant_int(n->input(2), 1)) {
      out.emplace_back(n, 1, 0);
      out.emplace_back(n, 2, 1);
    }
  }
  return out;
}

}  // namespace

CompiledModule compile(const torch::jit::Module& module, CompileOptions options) {
  auto impl = std::make_shared<CompiledModule::Impl>(module.type()->name() ? module.type()->name()->name() : "module",
                                                     options);
  // freeze_module works on its own copy; a module in training mode is first copied and set to eval. The
  // frozen graph's constants are tensors of their own, not the caller's storage: a change to the module
  // after compile reaches no plan (Capture.CompileFreezesACopyThatLaterChangesDoNotReach).
  tj::Module source = module;
  if (module.is_training()) {
    source = module.deepcopy();
    source.eval();
  }
  // Freezing needs the forward graph inlined (Python inlines at compile time; a module loaded in C++ is
  // not), every level of it. Inlining rewrites the method's graph in place, which keeps its meaning.
  inline_all_calls(*source.get_method("forward").graph());
  // Note [Scalars freezing would drop]: such literals become reads of preserved attributes.
  std::vector<std::string> preserved;
  if (!literals_freezing_drops(source.get_method("forward").graph()->block()).empty()) {
    source = source.clone();  // a class type of its own: attributes registered on it stay off the user's
    auto graph = source.get_method("forward").graph();
    tj::Value* self = graph->inputs().at(0);
    for (int64_t k : {0, 1}) {
      if (!source.hasattr(kKeptIntNames[k])) source.register_attribute(kKeptIntNames[k], c10::IntType::get(), k);
      preserved.push_back(kKeptIntNames[k]);
    }
    for (auto [n, i, k] : literals_freezing_drops(graph->block())) {
      tj::WithInsertPoint guard(n);
      tj::Node* get = graph->insertNode(graph->createGetAttr(self, kKeptIntNames[k]));
      n->replaceInput(i, get->output());
    }
  }
  auto frozen = std::make_shared<tj::Module>(tj::freeze_module(source, preserved));
  impl->graph = frozen->get_method("forward").graph()->copy();
  if (!preserved.empty()) {
    std::vector<tj::Node*> reads;
    std::function<void(tj::Block*)> collect = [&](tj::Block* b) {
      for (tj::Node* n : b->nodes()) {
        for (tj::Block* inner : n->blocks()) collect(inner);
        if (n->kind() == c10::prim::GetAttr && n->s(c10::attr::name).rfind("_fj_int_", 0) == 0) reads.push_back(n);
      }
    };
    collect(impl->graph->block());
    for (tj::Node* n : reads) {
      tj::WithInsertPoint guard(n);
      n->output()->replaceAllUsesWith(impl->graph->insertConstant(n->s(c10::attr::name) == kKeptIntNames[1] ? 1 : 0));
      n->destroy();
    }
  }
  prepare_torchscript_graph(impl->graph);
  impl->graph_constants = graph_constant_tensors(*impl->graph);
  impl->skip_self = true;
  impl->module_keepalive = frozen;
  impl->eager = [frozen](const std::vector<c10::IValue>& in) { return frozen->forward(in); };
  return CompiledModule(impl);
}

CompiledModule trace(TensorFunction fn, const std::vector<at::Tensor>& example_inputs, CompileOptions options) {
  auto impl = std::make_shared<CompiledModule::Impl>("traced function", options);
  tj::Stack stack(example_inputs.begin(), example_inputs.end());
  auto traced = tj::tracer::trace(
      stack,
      [&fn](tj::Stack in) {
        std::vector<at::Tensor> ts;
        for (auto& v : in) ts.push_back(v.toTensor());
        auto out = fn(ts);
        c10::List<at::Tensor> list;
        for (auto& t : out) list.push_back(t);
        return tj::Stack{c10::IValue(list)};
      },
      [](const at::Tensor&) { return std::string(); }, /*strict=*/false, /*force_outplace=*/false);
  impl->graph = traced.first->graph;
  prepare_torchscript_graph(impl->graph);
  impl->graph_constants = graph_constant_tensors(*impl->graph);
  impl->eager = [fn](const std::vector<c10::IValue>& in) {
    std::vector<at::Tensor> ts;
    for (const auto& v : in) ts.push_back(v.toTensor());
    c10::List<at::Tensor> list;
    for (auto& t : fn(ts)) list.push_back(t);
    return c10::IValue(list);
  };
  return CompiledModule(impl);
}

}  // namespace fusion_jit
