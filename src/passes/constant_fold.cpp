#include "passes/passes.h"

namespace fusion_jit {

bool constant_fold(Graph& g, const ConstantEvaluator& eval) {
  if (!eval) return false;
  bool changed = false;
  for (Node* n : g.nodes()) {
    if (n->is_constant() || n->side_effects() || n->outputs().empty()) continue;
    auto inputs = n->value_inputs();
    if (inputs.empty()) continue;  // nothing frozen to fold; literals alone are not worth a tensor
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
