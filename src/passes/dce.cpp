#include <vector>

#include "passes/passes.h"

namespace fusion_jit {

bool dce(Graph& g) {
  // Walk backwards: a node is live if it has side effects or any output is used by a live node or the
  // graph's outputs.
  std::vector<bool> live(g.num_value_ids(), false);
  for (const Value* o : g.outputs()) live[o->id()] = true;
  bool changed = false;
  auto nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool used = n->side_effects();
    for (const Value* o : n->outputs()) used |= live[o->id()];
    if (!used) {
      g.erase(n);
      changed = true;
      continue;
    }
    for (const Arg& a : n->args())
      if (a.is_value()) live[a.value->id()] = true;
  }
  return changed;
}

}  // namespace fusion_jit
