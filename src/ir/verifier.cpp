// The verifier: every value defined once before use, outputs defined, known ops with the arguments and
// output dtype their table entry demands, tensor types self-consistent.
#include <unordered_set>

#include "ir/graph.h"
#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

// A symbolic size or stride reads only the graph's symbols, and is its hint at their hints.
void verify_sym(const SymInt& x, const SymBindings& symbols, const std::string& what, const TensorType& tt) {
  if (!x.is_symbolic()) return;
  for (const std::string& s : x.expr()->symbols())
    FJ_INTERNAL_ASSERT(symbols.count(s), "{}: {} reads the symbol {}, which the graph does not name", what,
                       tt.str(), s);
  FJ_INTERNAL_ASSERT(x.expr()->evaluate(symbols) == x.hint(), "{}: {} in {} is {} at the symbols' hints, not {}",
                     what, x.str(), tt.str(), x.expr()->evaluate(symbols), x.hint());
}

void verify_type(const ValueType& t, const SymBindings& symbols, const std::string& what) {
  if (!t.is_tensor()) return;
  const TensorType& tt = *t.tensor;
  FJ_INTERNAL_ASSERT(tt.sizes.size() == tt.strides.size(), "{}: {} sizes but {} strides", what, tt.sizes.size(),
                     tt.strides.size());
  for (const SymInt& s : tt.sizes) {
    FJ_INTERNAL_ASSERT(s.hint() >= 0, "{}: negative size in {}", what, tt.str());
    verify_sym(s, symbols, what, tt);
  }
  for (const SymInt& s : tt.strides) verify_sym(s, symbols, what, tt);
}

}  // namespace

void verify_graph(const Graph& g) {
  std::unordered_set<const Value*> defined;
  for (const Value* v : g.inputs()) {
    FJ_INTERNAL_ASSERT(defined.insert(v).second, "graph input {} listed twice", v->name());
    verify_type(v->type(), g.symbols(), "input " + v->name());
  }
  for (const Node* n : g.nodes()) {
    std::string where = n->schema() + " defining " + (n->outputs().empty() ? "nothing" : n->output()->name());
    for (const Arg& a : n->args())
      if (a.is_value())
        FJ_INTERNAL_ASSERT(defined.count(a.value), "{}: argument {} is used before it is defined", where,
                           a.value->name());
    for (const Value* o : n->outputs()) {
      FJ_INTERNAL_ASSERT(o->producer() == n, "{}: output {} has another producer", where, o->name());
      FJ_INTERNAL_ASSERT(defined.insert(o).second, "{}: {} is defined twice", where, o->name());
      verify_type(o->type(), g.symbols(), where);
    }
    if (n->is_constant()) {
      FJ_INTERNAL_ASSERT(n->args().size() == 1 && !n->args()[0].is_value() &&
                             std::holds_alternative<SymInt>(n->args()[0].literal),
                         "{}: fj::constant takes one integer index", where);
      continue;
    }
    const OpInfo* op = n->op();
    if (!op) continue;
    FJ_INTERNAL_ASSERT(n->args().size() <= op->args.size(), "{}: {} arguments, the schema has {}", where,
                       n->args().size(), op->args.size());
    for (size_t i = 0; i < op->args.size(); ++i) {
      const ArgSpec& spec = op->args[i];
      if (i >= n->args().size()) {
        FJ_INTERNAL_ASSERT(spec.has_default, "{}: argument {} is missing and has no default", where, i);
        continue;
      }
      const Arg& a = n->args()[i];
      if (spec.kind == ArgKind::kTensor || spec.kind == ArgKind::kTensorNoPromote)
        FJ_INTERNAL_ASSERT(a.is_value() && a.value->is_tensor(), "{}: argument {} must be a tensor", where, i);
    }
    if (op->category == OpCategory::kElementwise || op->category == OpCategory::kReduction ||
        op->category == OpCategory::kGather) {
      FJ_INTERNAL_ASSERT(n->outputs().size() == 1 && n->output()->is_tensor(), "{}: one tensor output expected",
                         where);
      auto dt = infer_dtype(*op, n->args());
      if (dt)
        FJ_INTERNAL_ASSERT(*dt == n->output()->tensor_type().dtype, "{}: output dtype {} but the op's rule gives {}",
                           where, dtype_name(n->output()->tensor_type().dtype), dtype_name(*dt));
    }
  }
  for (const Value* o : g.outputs())
    FJ_INTERNAL_ASSERT(defined.count(o), "graph output {} is not defined", o->name());
}

}  // namespace fusion_jit
