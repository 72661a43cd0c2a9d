#include "torch/api.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <c10/core/GradMode.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "driver/build_plan.h"
#include "passes/passes.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "torch/executor.h"

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
  std::string name;
  std::shared_ptr<tj::Graph> graph;
  bool skip_self = false;
  std::function<c10::IValue(const std::vector<c10::IValue>&)> eager;
  int limit = 8;
  bool enable_fusion = true;
  bool cuda_graphs = false;
  std::shared_ptr<tj::Module> module_keepalive;
  // The tensors of the graph's prim::Constant nodes (frozen weights and what freezing folded): results
  // that alias them, from the capture run or the eager fallback, are copied before they are returned.
  std::vector<c10::IValue> graph_constants;

  // One signature's plan. The first caller of a new signature compiles it outside the module's lock;
  // callers of the same signature wait for it (`ready`), callers of other signatures do not.
  struct Entry {
    std::unique_ptr<PlanInstance> instance;  // null: eager
    std::string eager_reason;
    bool ready = false;
  };
  std::mutex mu;
  std::condition_variable compiled;  // an entry became ready
  std::unordered_map<std::string, std::shared_ptr<Entry>> entries;
  ModuleStats stats;
  int reserved = 0;  // signatures compiled or being compiled (counted against the limit)
  std::string last_report;

  // Captures the graph for these inputs and runs the passes; the instance holds the optimized graph.
  std::unique_ptr<PlanInstance> prepare(const std::vector<c10::IValue>& inputs, c10::IValue* result,
                                        double* capture_ms, double* passes_ms) {
    auto t0 = std::chrono::steady_clock::now();
    auto inst = std::make_unique<PlanInstance>();
    CaptureResult cap = capture_graph(graph, inputs, skip_self);
    *capture_ms = ms_since(t0);
    inst->captured = std::move(cap.captured);
    *result = std::move(cap.result);
    auto t1 = std::chrono::steady_clock::now();
    optimize_captured(inst->captured);
    *passes_ms = ms_since(t1);
    return inst;
  }

  c10::IValue run(PlanInstance& inst, const std::vector<c10::IValue>& inputs) {
    bool replayed = false;
    c10::IValue out = run_instance(inst, inputs, cuda_graphs, name, &replayed);
    if (replayed) {
      std::lock_guard<std::mutex> s(mu);
      stats.graph_replays++;
    }
    return out;
  }

  // Why these inputs must run eagerly whatever the graph, or "".
  static std::string eager_only_reason(const std::vector<c10::IValue>& inputs) {
    if (!c10::GradMode::is_enabled()) return "";
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].isTensor() && inputs[i].toTensor().defined() && inputs[i].toTensor().requires_grad())
        return fmt::format("input {} requires grad and grad mode is on: compiled plans record no autograd "
                           "history, so this signature runs eagerly (call under torch::NoGradGuard to compile it)",
                           i);
    return "";
  }

  // Returns the entry for these inputs, compiling it if new; `first_result` receives the capture run's
  // result when this call compiled.
  std::shared_ptr<Entry> entry_for(const std::vector<c10::IValue>& inputs, c10::IValue* first_result) {
    std::string sig = input_signature(inputs);
    sig += c10::GradMode::is_enabled() ? '\1' : '\0';
    std::shared_ptr<Entry> e;
    {
      std::unique_lock<std::mutex> g(mu);
      auto it = entries.find(sig);
      if (it != entries.end()) {
        e = it->second;
        compiled.wait(g, [&] { return e->ready; });
        return e;
      }
      e = std::make_shared<Entry>();
      entries.emplace(sig, e);
      std::string eager = eager_only_reason(inputs);
      if (eager.empty() && reserved >= limit) {
        eager = fmt::format("specialization limit of {} signatures reached", limit);
        warn_once(name + ":limit", fmt::format("{}: {} new input signatures run eagerly (raise "
                                               "FUSION_JIT_SPECIALIZATION_LIMIT to compile more)",
                                               name, eager));
      } else if (!eager.empty()) {
        warn_once(name + ":grad", fmt::format("{}: {}", name, eager));
      }
      if (!eager.empty()) {
        e->eager_reason = std::move(eager);
        e->ready = true;
        return e;
      }
      reserved++;
    }
    // Compiled with no lock held: calls of other signatures go on meanwhile.
    auto t0 = std::chrono::steady_clock::now();
    std::string report, failure;
    bool rethrow = false;
    std::exception_ptr error;
    try {
      double capture_ms = 0, passes_ms = 0;
      c10::IValue result;
      auto inst = prepare(inputs, &result, &capture_ms, &passes_ms);
      PlanTarget target;
      target.enable_fusion = enable_fusion;
      inst->plan = build_plan(std::move(inst->captured.graph), target);
      inst->captured.graph = nullptr;
      const ExecutablePlan& p = *inst->plan;
      report = fmt::format("capture {:.1f} ms, passes {:.1f} ms, fusion {:.1f} ms, codegen {:.1f} ms, compile {:.1f} ms",
                           capture_ms, passes_ms, p.fusion_ms, p.codegen_ms, p.compile_ms);
      e->instance = std::move(inst);
      if (first_result) *first_result = std::move(result);
    } catch (const std::exception& err) {
      // Any failure (ours, torch's, the model's own on these inputs) is recorded: the signature runs
      // eagerly from now on, and eager's own error, if any, reaches the caller from the eager run.
      auto* c10_error = dynamic_cast<const c10::Error*>(&err);
      failure = c10_error ? first_line(c10_error->what_without_backtrace()) : err.what();
      rethrow = Options::get().assert_no_compile && failure.find("FUSION_JIT_ASSERT_NO_COMPILE") != std::string::npos;
      if (rethrow) error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> g(mu);
      stats.compile_ms += ms_since(t0);
      if (e->instance) {
        stats.signatures++;
        last_report = std::move(report);
      } else {
        reserved--;
        e->eager_reason = failure;
        if (rethrow) entries.erase(sig);
      }
      e->ready = true;
    }
    compiled.notify_all();
    if (error) std::rethrow_exception(error);
    if (!e->instance)
      warn_once(name + ":capture:" + e->eager_reason,
                fmt::format("{}: this input signature runs eagerly: {}", name, e->eager_reason));
    return e;
  }

  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
};

c10::IValue CompiledModule::operator()(const std::vector<c10::IValue>& inputs) {
  c10::IValue first;
  auto e = impl_->entry_for(inputs, &first);
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stats.calls++;
    if (!e->instance) impl_->stats.eager_calls++;
  }
  if (!e->instance) return unalias_constants(impl_->eager(inputs), impl_->graph_constants);
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
  std::string s = e->instance->plan->explain();
  if (impl_->cuda_graphs) {
    std::lock_guard<std::mutex> g(e->instance->graph_mu);
    if (e->instance->cuda_graph) s += fmt::format("cuda graphs: captured, {} replays\n", e->instance->cuda_graph->replays());
    else if (e->instance->graph_tried) s += "cuda graphs: not used: " + e->instance->graph_note + "\n";
    else s += "cuda graphs: captured at the next call\n";
  }
  return s;
}

std::string CompiledModule::last_compile_report() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->last_report;
}

ModuleStats CompiledModule::stats() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->stats;
}

std::shared_ptr<const ExecutablePlan> CompiledModule::compile_cuda(const std::vector<c10::IValue>& inputs,
                                                                 const std::string& arch, bool run_nvrtc) {
  for (size_t i = 0; i < inputs.size(); ++i)
    FJ_CHECK(!inputs[i].isTensor() || !inputs[i].toTensor().is_cuda(),
             "compile_cuda: input {} is already on a GPU; give CPU inputs (the plan is moved to cuda:0)", i);
  double capture_ms = 0, passes_ms = 0;
  c10::IValue result;
  auto inst = impl_->prepare(inputs, &result, &capture_ms, &passes_ms);
  set_device(*inst->captured.graph, Device::kCUDA, 0);
  PlanTarget target;
  target.enable_fusion = impl_->enable_fusion;
  target.cuda_arch = arch;
  target.compile = run_nvrtc;
  std::shared_ptr<ExecutablePlan> plan = build_plan(std::move(inst->captured.graph), target);
  if (!plan->fallback_groups.empty()) compile_cuda_source(plan->cuda_source, arch);  // throws NVRTC's log
  return plan;
}

CompiledModule compile(const torch::jit::Module& module, CompileOptions options) {
  auto impl = std::make_shared<CompiledModule::Impl>();
  impl->name = module.type()->name() ? module.type()->name()->name() : "module";
  // freeze_module works on its own copy; a module in training mode is first copied and set to eval.
  tj::Module source = module;
  if (module.is_training()) {
    source = module.deepcopy();
    source.eval();
  }
  // Freezing needs the forward graph inlined (Python inlines at compile time; a module loaded in C++ is
  // not). Inlining rewrites the method's graph in place, which keeps its meaning.
  tj::Inline(*source.get_method("forward").graph());
  auto frozen = std::make_shared<tj::Module>(tj::freeze_module(source));
  impl->graph = frozen->get_method("forward").graph()->copy();
  prepare_torchscript_graph(impl->graph);
  impl->graph_constants = graph_constant_tensors(*impl->graph);
  impl->skip_self = true;
  impl->module_keepalive = frozen;
  impl->eager = [frozen](const std::vector<c10::IValue>& in) { return frozen->forward(in); };
  impl->limit = options.specialization_limit.value_or(Options::get().specialization_limit);
  impl->enable_fusion = options.enable_fusion;
  impl->cuda_graphs = options.cuda_graphs.value_or(Options::get().cuda_graphs);
  return CompiledModule(impl);
}

CompiledModule trace(TensorFunction fn, const std::vector<at::Tensor>& example_inputs, CompileOptions options) {
  auto impl = std::make_shared<CompiledModule::Impl>();
  impl->name = "traced function";
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
  impl->limit = options.specialization_limit.value_or(Options::get().specialization_limit);
  impl->enable_fusion = options.enable_fusion;
  impl->cuda_graphs = options.cuda_graphs.value_or(Options::get().cuda_graphs);
  return CompiledModule(impl);
}

}  // namespace fusion_jit
