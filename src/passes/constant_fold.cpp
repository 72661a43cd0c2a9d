#include <set>

#include "ir/dtype.h"
#include "passes/passes.h"

namespace fusion_jit {
namespace {

// Factories whose result their literal arguments decide, folded where it is small: arange's positions and
// the scalar_tensor fills of a causal mask then make the whole mask a constant (llama_tiny: an ATen
// arange of 8 us and two kernels per call). A larger result would hold memory for the plan's life to
// save one fill per call. Random factories have side effects and are never folded.
constexpr int64_t kMaxFoldedFactoryBytes = 64 << 10;

bool small_factory(const Node& n) {
  static const std::set<std::string> kFactories = {
      "aten::arange", "aten::arange.start", "aten::arange.start_step", "aten::scalar_tensor",
      "aten::zeros",  "aten::ones",         "aten::full",              "aten::eye"};
  if (!kFactories.count(n.schema()) || n.outputs().size() != 1 || !n.output()->is_tensor()) return false;
  const TensorType& t = n.output()->tensor_type();
  return t.dtype != DType::kOther &&
         t.extent() * static_cast<int64_t>(dtype_size(t.dtype)) <= kMaxFoldedFactoryBytes;
}

// Whether a node's result depends on a shape class's sizes (arange(s0), a weight sliced to s0 rows): folded,
// it would be one size's (Note [Symbolic sizes]), so it stays a step of the class's plan.
bool reads_symbols(const Node& n) {
  for (const Value* o : n.outputs())
    if (o->is_tensor() && o->tensor_type().is_symbolic()) return true;
  for (const Arg& a : n.args()) {
    if (a.is_value()) continue;
    if (const auto* i = std::get_if<SymInt>(&a.literal); i && i->is_symbolic()) return true;
    if (const auto* l = std::get_if<SymSizes>(&a.literal); l && l->is_symbolic()) return true;
  }
  return false;
}

}  // namespace

bool is_prepack(const std::string& schema) {
  return schema == "mkldnn::_reorder_convolution_weight" || schema == "mkldnn::_reorder_linear_weight" ||
         schema == "mkl::_mkl_reorder_linear_weight";
}

bool constant_fold(Graph& g, const ConstantEvaluator& eval, bool fold_prepacked) {
  if (!eval) return false;
  bool changed = false;
  for (Node* n : g.nodes()) {
    if (n->is_constant() || n->side_effects() || n->outputs().empty()) continue;
    if (!fold_prepacked && is_prepack(n->schema())) continue;
    if (reads_symbols(*n)) continue;
    auto inputs = n->value_inputs();
    // Nothing frozen to fold: literals alone are not worth a tensor, but for small factories.
    if (inputs.empty() && !small_factory(*n)) continue;
    bool all_constant = true;
    for (const Value* v : inputs) all_constant &= v->producer() && v->producer()->is_constant();
    if (!all_constant) continue;
    for (const Value* o : n->outputs()) all_constant &= o->is_tensor();
    if (!all_constant) continue;
    auto indices = eval(*n);
    if (!indices) continue;
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      Node* c = g.insert(n, "fj::constant", {Arg::lit(indices->at(i))}, {n->output(i)->type()});
      g.replace_all_uses(n->output(i), c->output());
    }
    g.erase(n);
    changed = true;
  }
  return changed;
}

}  // namespace fusion_jit
