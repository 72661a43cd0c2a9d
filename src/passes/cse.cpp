#include <map>
#include <set>
#include <string>

#include "passes/passes.h"

namespace fusion_jit {

bool cse(Graph& g) {
  // Key: schema, arguments (value ids or literal text) and output types. Constants are keyed by their
  // index, so two loads of one frozen tensor merge too.
  std::map<std::string, Node*> seen;
  const std::set<const Value*> returned(g.outputs().begin(), g.outputs().end());
  bool changed = false;
  for (Node* n : g.nodes()) {
    if (n->side_effects() || n->outputs().empty()) continue;
    std::string key = n->schema() + "(";
    for (const Arg& a : n->args()) key += (a.is_value() ? a.value->name() : "#" + literal_str(a.literal)) + ",";
    key += ")";
    for (const Value* o : n->outputs()) key += o->type().str() + ";";
    auto [it, inserted] = seen.emplace(key, n);
    if (inserted) continue;
    // Two results the graph returns stay two: eager returns distinct tensors, which must not become one
    // (writing into one would change the other).
    bool both_returned = false;
    for (size_t i = 0; i < n->outputs().size(); ++i)
      both_returned |= returned.count(n->output(i)) && returned.count(it->second->output(i));
    if (both_returned) continue;
    for (size_t i = 0; i < n->outputs().size(); ++i) g.replace_all_uses(n->output(i), it->second->output(i));
    g.erase(n);
    changed = true;
  }
  return changed;
}

}  // namespace fusion_jit
