// The attention rule (Note [Attention rule]).
//
// Note [Attention rule]
// attention.sdpa: softmax(q @ k^T * scale [+ mask]) @ v, written out as the TorchScript graph of a model's
// own attention has it:
//     %kt = aten::transpose.int(%k, -2, -1)          (or the two last dims by number)
//     %s  = aten::matmul(%q, %kt)
//     %s2 = aten::div.Scalar(%s, c) | aten::mul.Scalar(%s, c)      (optional: scale 1/c or c)
//     %s3 = aten::add.Tensor(%s2, %mask, 1)          (optional, either operand order: an additive mask)
//     %p  = aten::softmax.int(%s3, -1, None)
//     %o  = aten::matmul(%p, %v)
// becomes aten::scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale): one call, the fused CPU
// kernel (flash attention on CUDA), no [B, H, T, S] score tensor written three times. It fires only where
// the semantics are exactly SDPA's:
//   - q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv]: 4-d, same batch dims (no broadcasting among them),
//     one floating dtype; every intermediate used once (a returned score or probability tensor declines);
//   - the scale is applied to the scores before the mask (mask-then-scale would scale the mask too);
//   - the mask is a tensor of the scores' dtype (no promotion), broadcastable to [B, H, T, S];
//   - softmax over the last dim, in the scores' dtype (no dtype argument).
// Everything else is left alone (and runs as before: matmuls through ATen, the scale, mask and softmax our
// kernel). SDPA's result may be a transposed view (the CPU flash kernel writes [B, T, H, Dv]); an
// aten::contiguous after it gives the matmul's contiguous layout (free where it already is), which the
// plan's types promise. SDPA computes in another order than eager's three ops (q is scaled before the
// product, the softmax is online): a rounding difference within the tolerance rule, checked against the
// fp64 reference in tests/torch/attention_test.cpp.
#include "passes/passes.h"

namespace fusion_jit {
namespace {

// The producer of `v` when it has schema `schema` and `v` has no other user (and is not returned).
Node* sole_producer(Builder& r, Value* v, const char* schema) {
  Node* n = v->producer();
  if (!n || n->schema() != schema || n->side_effects() || n->outputs().size() != 1) return nullptr;
  if (r.users(v).size() != 1 || r.returned(v)) return nullptr;
  return n;
}

// Whether a mask of type `m` broadcasts to `scores` (right-aligned, each dim 1 or equal).
bool broadcasts_to(const TensorType& m, const TensorType& scores) {
  if (m.dim() > scores.dim()) return false;
  for (int64_t i = 1; i <= m.dim(); ++i) {
    const int64_t a = m.sizes[m.dim() - i], b = scores.sizes[scores.dim() - i];
    if (a != 1 && a != b) return false;
  }
  return true;
}

bool is_last_two(int64_t a, int64_t b) {
  auto norm = [](int64_t d) { return d < 0 ? d + 4 : d; };
  const int64_t x = norm(a), y = norm(b);
  return (x == 2 && y == 3) || (x == 3 && y == 2);
}

Replacement sdpa(const Match& m, Builder& r) {
  Node* out = m.root;
  Value* v = m.value("v");
  Value* p = m.value("p");
  Node* softmax = p->producer();
  const auto& sa = softmax->args();
  // softmax(x, dim = -1 | 3, dtype = None)
  if (sa.size() < 2) return {};
  auto dim = as_int(literal_arg(&sa[1]));
  if (!dim || (*dim != -1 && *dim != 3)) return {};
  if (sa.size() > 2 && !(!sa[2].is_value() && std::holds_alternative<None>(sa[2].literal))) return {};
  if (!sa[0].is_value()) return {};
  Value* s = sa[0].value;
  // [+ mask]
  Value* mask = nullptr;
  if (Node* add = sole_producer(r, s, "aten::add.Tensor")) {
    const auto& aa = add->args();
    if (aa.size() < 2 || !aa[0].is_value() || !aa[1].is_value()) return {};
    if (aa.size() > 2) {
      auto alpha = as_double(literal_arg(&aa[2]));
      if (!alpha || *alpha != 1.0) return {};
    }
    // The scores are the operand computed from a matmul (through an optional scale); the other is the mask.
    auto from_scores = [&](Value* x) {
      Node* n = x->producer();
      return n && (n->schema() == "aten::matmul" || n->schema() == "aten::div.Scalar" ||
                   n->schema() == "aten::mul.Scalar");
    };
    const int which = from_scores(aa[0].value) ? 0 : from_scores(aa[1].value) ? 1 : -1;
    if (which < 0) return {};
    mask = aa[1 - which].value;
    s = aa[which].value;
    if (!mask->is_tensor()) return {};
  }
  // [* c | / c]
  double scale = 1.0;
  Node* scaled = sole_producer(r, s, "aten::div.Scalar");
  if (!scaled) scaled = sole_producer(r, s, "aten::mul.Scalar");
  if (scaled) {
    auto c = as_double(literal_arg(&scaled->args().at(1)));
    if (!c || *c == 0.0 || !scaled->args()[0].is_value()) return {};
    scale = scaled->schema() == "aten::div.Scalar" ? 1.0 / *c : *c;
    s = scaled->args()[0].value;
  }
  // q @ transpose(k, -2, -1)
  Node* qk = sole_producer(r, s, "aten::matmul");
  if (!qk || !qk->args()[0].is_value() || !qk->args()[1].is_value()) return {};
  Value* q = qk->args()[0].value;
  Node* kt = sole_producer(r, qk->args()[1].value, "aten::transpose.int");
  if (!kt || !kt->args()[0].is_value()) return {};
  auto d0 = as_int(literal_arg(&kt->args().at(1))), d1 = as_int(literal_arg(&kt->args().at(2)));
  if (!d0 || !d1 || !is_last_two(*d0, *d1)) return {};
  Value* k = kt->args()[0].value;
  // Shapes and dtypes.
  for (const Value* t : {q, k, v, s})
    if (!t->is_tensor() || t->tensor_type().dim() != 4) return {};
  const TensorType &tq = q->tensor_type(), &tk = k->tensor_type(), &tv = v->tensor_type();
  const TensorType& ts = softmax->output()->tensor_type();
  const DType dt = tq.dtype;
  if (!is_floating(dt) || tk.dtype != dt || tv.dtype != dt || ts.dtype != dt) return {};
  if (out->output()->tensor_type().dtype != dt) return {};
  if (tq.device != tk.device || tq.device != tv.device) return {};
  for (int i = 0; i < 2; ++i)
    if (tq.sizes[i] != tk.sizes[i] || tq.sizes[i] != tv.sizes[i]) return {};
  if (tq.sizes[3] != tk.sizes[3] || tk.sizes[2] != tv.sizes[2]) return {};
  if (ts.sizes != std::vector<int64_t>{tq.sizes[0], tq.sizes[1], tq.sizes[2], tk.sizes[2]}) return {};
  if (mask) {
    const TensorType& tm = mask->tensor_type();
    if (tm.dtype != dt || tm.device != tq.device || !broadcasts_to(tm, ts)) return {};
  }
  const TensorType& to = out->output()->tensor_type();
  Value* y = r.op("aten::scaled_dot_product_attention",
                  {Arg::of(q), Arg::of(k), Arg::of(v), mask ? Arg::of(mask) : Arg::lit(None{}), Arg::lit(0.0),
                   Arg::lit(false), Arg::lit(scale), Arg::lit(false)},
                  dt, to.sizes);
  return {r.op("aten::contiguous", {Arg::of(y), Arg::lit(int64_t{0})}, dt, to.sizes)};
}

RuleSet make_attention_rules() {
  RuleSet set{"attention", {}};
  set.rules.push_back({"sdpa",
                       Pattern::op({"aten::matmul"}, {Pattern::op({"aten::softmax.int"}).single_use().bind("p"),
                                                      Pattern::tensor().bind("v")})
                           .outputs(1),
                       sdpa});
  return set;
}

}  // namespace

const RuleSet& attention_rules() {
  static const RuleSet set = make_attention_rules();
  return set;
}

}  // namespace fusion_jit
