// GraphFunction: plans of graphs handed over as IR text (api.h).
#include <ATen/core/ivalue.h>

#include <chrono>
#include <mutex>
#include <unordered_map>

#include "driver/build_plan.h"
#include "support/error.h"
#include "torch/api.h"
#include "torch/executor.h"

namespace fusion_jit {

struct GraphFunction::Impl {
  std::string name;
  CompileOptions options;
  mutable std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<PlanInstance>> plans;

  static std::string signature(const std::vector<at::Tensor>& inputs, const std::string& key,
                               std::vector<c10::IValue>* boxed) {
    boxed->assign(inputs.begin(), inputs.end());
    return input_signature(*boxed) + '\1' + key;
  }
  std::shared_ptr<PlanInstance> find(const std::string& sig) const {
    std::lock_guard<std::mutex> g(mu);
    auto it = plans.find(sig);
    return it == plans.end() ? nullptr : it->second;
  }
};

GraphFunction::GraphFunction(std::string name, CompileOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->options = options;
}
GraphFunction::~GraphFunction() = default;

bool GraphFunction::run(const std::vector<at::Tensor>& inputs, const std::string& key, std::vector<at::Tensor>* outputs) {
  std::vector<c10::IValue> boxed;
  auto inst = impl_->find(Impl::signature(inputs, key, &boxed));
  if (!inst) return false;
  bool replayed = false;
  c10::IValue out = run_instance(*inst, boxed, impl_->options.cuda_graphs.value_or(false), impl_->name, &replayed);
  outputs->clear();
  for (const c10::IValue& v : out.toListRef()) outputs->push_back(v.toTensor());
  return true;
}

GraphPlanInfo GraphFunction::add(const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& ir,
                                 const std::vector<at::Tensor>& constants) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<c10::IValue> boxed;
  std::string sig = Impl::signature(inputs, key, &boxed);
  auto inst = std::make_shared<PlanInstance>();
  CapturedGraph& cap = inst->captured;
  cap.graph = parse_graph(ir);
  cap.output_kind = OutputKind::kList;
  const Graph& g = *cap.graph;
  FJ_CHECK(g.inputs().size() == inputs.size(), "{}: the graph takes {} inputs, {} were given", impl_->name,
           g.inputs().size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* in = g.inputs()[i];
    FJ_TYPE_CHECK(in->is_tensor(), "{}: graph input {} is a {}, not a tensor", impl_->name, i, in->type().str());
    FJ_TYPE_CHECK(inputs[i].defined(), "{}: input {} is an undefined tensor", impl_->name, i);
    TensorType t = tensor_type_of(inputs[i]);
    FJ_TYPE_CHECK(t == in->tensor_type(), "{}: input {} is {}, the graph's input is {}", impl_->name, i, t.str(),
                  in->tensor_type().str());
  }
  for (const Value* o : g.outputs())
    FJ_TYPE_CHECK(o->is_tensor(), "{}: graph output {} is a {}; outputs must be tensors", impl_->name, o->name(),
                  o->type().str());
  for (const at::Tensor& c : constants) cap.constants.emplace_back(c);
  for (const Node* n : g.nodes())
    if (n->is_constant())
      FJ_CHECK(n->constant_index() >= 0 && n->constant_index() < static_cast<int64_t>(constants.size()),
               "{}: fj::constant({}) is out of range: {} constants were given", impl_->name, n->constant_index(),
               constants.size());
  verify_graph(g);
  optimize_captured(cap);
  PlanTarget target;
  target.enable_fusion = impl_->options.enable_fusion;
  inst->plan = build_plan(std::move(cap.graph), target);
  const ExecutablePlan& p = *inst->plan;
  GraphPlanInfo info;
  info.kernels = static_cast<int>(p.kernels.size());
  info.fused_ops = p.fused_ops;
  for (const auto& [schema, count] : p.aten_ops) info.aten_ops += count;  // constants are not counted there
  info.from_plan_cache = p.from_plan_cache;
  info.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->plans[sig] = std::move(inst);
  return info;
}

std::string GraphFunction::explain(const std::vector<at::Tensor>& inputs, const std::string& key) const {
  std::vector<c10::IValue> boxed;
  auto inst = impl_->find(Impl::signature(inputs, key, &boxed));
  return inst ? inst->plan->explain() : "";
}

int GraphFunction::num_plans() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return static_cast<int>(impl_->plans.size());
}

void GraphFunction::clear() {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->plans.clear();
}

}  // namespace fusion_jit
