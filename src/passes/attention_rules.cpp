// The attention rule (Note [Attention rule]).
//
// Note [Attention rule]
// attention.sdpa: softmax(q @ k^T * scale + masks) @ v, as models write it out, becomes
// aten::scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale): one call, the fused CPU kernel
// (flash attention on CUDA), no [B, H, T, S] score tensor written three times. Two spellings are known:
//   TorchScript            %s = aten::matmul(%q, aten::transpose.int(%k, -2, -1))      (4-d operands)
//                          ...  %o = aten::matmul(aten::softmax.int(...), %v)
//   torch.compile (FX)     each 4-d operand [B, H, X, Y] is made 3-d for aten::bmm: view/_unsafe_view to
//                          [B*H, X, Y] of an expand to its own sizes (and a clone, the copy the view needed);
//                          the scores are a view of the bmm back to [B, H, T, S]; aten::_softmax(s, -1, False)
// Between the product and the softmax, in this order (a mask under the scale declines):
//   scale   aten::mul.Scalar(s, c) | aten::div.Scalar(s, c)                                   (optional)
//   masks   any number of aten::add.Tensor(s, m, 1) (either operand order: the scores are the operand
//           computed from the product) and aten::masked_fill.Scalar(s, m, -inf) (m boolean)
// Between the softmax and the second product: dropout in inference (aten::dropout(x, p, False), or the
// clone it becomes in FX), and FX's expand/view. The masks become one additive mask: the sum of the added
// ones, plus where(m, -inf, 0) for each masked_fill (SDPA turns a boolean mask into the same). HF's BERT,
// GPT-2, Llama and T5 (relative position bias plus padding mask: two adds) with eager attention have
// these forms; Llama's grouped k and v arrive already repeated to H heads.
//
// It fires only where the semantics are SDPA's; otherwise the nodes stay (matmuls through ATen, the
// scale, masks and softmax our kernel) and `explain` says why ("declined: attention.sdpa at ..."):
//   - q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv]: same batch dims (no broadcasting among them), one
//     floating dtype and device; every intermediate from the product to the second product used once
//     (a returned score or probability tensor declines);
//   - the scale is a number applied to the scores before the masks;
//   - each added mask has the scores' dtype (no promotion) and broadcasts to [B, H, T, S];
//   - softmax over the last dim in the scores' dtype (no dtype argument, no half-to-float).
// Training graphs: the forward keeps the probabilities for softmax's backward, so the rule declines there
// ("the probabilities are also used elsewhere"). The torch.compile backend matches the same pattern on
// Dynamo's graph before AOT autograd instead, so that SDPA's backward is traced too (Note [Attention rule
// in training graphs], python/fusion_jit/_attention.py).
// What differs from eager's three ops, and how:
//   - Rows the masks remove entirely (every entry -inf): eager's softmax gives NaN, SDPA's kernels 0. The
//     rule computes those rows from the mask (amax over its last dim == -inf) and fills NaN there, so the
//     result is eager's. (A row whose scores are all -inf without the mask saying so needs infinite q or
//     k; eager's and SDPA's results then differ in that row, NaN against 0.)
//   - Where masked_fill replaces a NaN score, eager ignores the NaN; SDPA adds -inf to it (NaN). A NaN
//     score needs a NaN or infinite q or k.
//   - Rounding: SDPA scales q before the product and its softmax is online; the masks are summed before
//     they are added to the scores. Within the tolerance rule (tests/torch/attention_test.cpp and
//     tests/python/test_attention.py check against the fp64 reference).
// SDPA's result is typed with the layout ATen gives it (Note [The layout of SDPA's result]); an
// aten::contiguous after it gives the layout the matched product had (free where it already is).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "passes/passes.h"

namespace fusion_jit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The producer of `v` when it has one of `schemas` (and no side effects, one output); else nullptr.
Node* producer_in(const Value* v, std::initializer_list<const char*> schemas) {
  Node* n = v->producer();
  if (!n || n->side_effects() || n->outputs().size() != 1 || n->args().empty() || !n->args()[0].is_value())
    return nullptr;
  for (const char* s : schemas)
    if (n->schema() == s) return n;
  return nullptr;
}

bool used_once(const Builder& r, const Value* v) { return r.users(v).size() == 1 && !r.returned(v); }

bool is_last(int64_t d, int64_t rank) { return d == -1 || d == rank - 1; }

// Note [The layout of SDPA's result]
// A library step's result is typed with the strides the library gives it, so that a plan's types hold at
// run time (run_plan's check_layouts; a shape class is built only where they do) and a kernel reading the
// result reads it as it is. On the CPU, ATen runs its flash kernel where the query, key and value have
// one head size and a dtype it takes (float, double, bfloat16, half), and its result is laid out like the
// query (empty_like: dense, the query's dims in the order of its strides; a query that is a transposed
// view of [B, T, H, D] gives a [B, H, T, D] result strided as [B, T, H, D]); its math kernel, taken
// otherwise, returns a contiguous product. On a GPU the kernel chosen depends on the card: the type says
// contiguous. The ATen step makes its result the layout of its type where the library chose another
// (AtenCall::conform in torch/executor.cpp, a copy), so a wrong guess costs a copy, never a wrong read.
SymSizes sdpa_result_strides(const TensorType& q, const TensorType& k, const TensorType& v, const SymSizes& out) {
  const bool flash = q.device == Device::kCPU && q.sizes.size() == 4 && k.sizes.size() == 4 &&
                     v.sizes.size() == 4 && q.sizes[3].same(k.sizes[3]) && q.sizes[3].same(v.sizes[3]) &&
                     (q.dtype == DType::kFloat32 || q.dtype == DType::kFloat64 || q.dtype == DType::kBFloat16 ||
                      q.dtype == DType::kFloat16);
  if (!flash) return contiguous_strides(out);
  // Dims from the innermost (smallest stride) out, as empty_like orders a non-dense tensor's; ties and
  // size-1 dims keep the contiguous order. The ordering reads the strides' hints: where it would differ
  // at another size, the step's copy makes the result the typed layout.
  std::vector<int> order = {3, 2, 1, 0};
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool a1 = q.sizes[a].hint() == 1, b1 = q.sizes[b].hint() == 1;
    if (a1 || b1) return false;
    return q.strides[a].hint() < q.strides[b].hint();
  });
  SymSizes strides(out.size(), SymInt(1));
  SymInt step(1);
  for (int d : order) {
    strides[d] = step;
    step = step * out[d];
  }
  return strides;
}

// The 4-d [B, H, X, Y] value a 3-d bmm operand [B*H, X, Y] is a view of (FX's spelling), looking through
// a clone or contiguous and an expand to its own sizes (each leaves the values as they are); else nullptr.
// `through`, when given, gets the values passed on the way (the view's input, then each one looked through).
Value* unbatch(Value* x3, std::vector<Value*>* through = nullptr) {
  Node* view = producer_in(x3, {"aten::view", "aten::_unsafe_view", "aten::reshape"});
  if (!view || !x3->is_tensor()) return nullptr;
  Value* y = view->args()[0].value;
  if (through) through->push_back(y);
  while (Node* p = producer_in(y, {"aten::clone", "aten::contiguous", "aten::expand"})) {
    Value* in = p->args()[0].value;
    if (!in->is_tensor() || !y->is_tensor() || in->tensor_type().sizes != y->tensor_type().sizes) break;
    y = in;
    if (through) through->push_back(y);
  }
  if (!y->is_tensor() || y->tensor_type().dim() != 4) return nullptr;
  const auto &s4 = y->tensor_type().sizes, &s3 = x3->tensor_type().sizes;
  if (s3.size() != 3 || s4[0] * s4[1] != s3[0] || s4[2] != s3[1] || s4[3] != s3[2]) return nullptr;
  return y;
}

// Whether the scores' side of an add: a value computed from the product q @ k^T (through the scale, other
// masks, FX's view).
bool from_product(const Value* v, int depth = 0) {
  Node* n = v->producer();
  if (!n || depth > 8) return false;
  const std::string& s = n->schema();
  if (s == "aten::matmul" || s == "aten::bmm") return true;
  if (s == "aten::add.Tensor")
    return (n->args()[0].is_value() && from_product(n->args()[0].value, depth + 1)) ||
           (n->args().size() > 1 && n->args()[1].is_value() && from_product(n->args()[1].value, depth + 1));
  if (s == "aten::view" || s == "aten::_unsafe_view" || s == "aten::mul.Scalar" || s == "aten::div.Scalar" ||
      s == "aten::masked_fill.Scalar")
    return n->args()[0].is_value() && from_product(n->args()[0].value, depth + 1);
  return false;
}

Replacement sdpa(const Match& m, Builder& r) {
  Node* out = m.root;
  const bool fx = out->schema() == "aten::bmm";
  Value* p = m.value("p");
  Value* v = fx ? unbatch(m.value("v")) : m.value("v");
  // The probabilities: softmax, then dropout in inference (FX: its clone), then FX's expand and view.
  std::vector<Value*> chain = {p};  // the values from the root's operand back to the softmax's output
  Value* probs = fx ? unbatch(p, &chain) : p;
  if (!probs) return {};
  while (Node* d = producer_in(probs, {"aten::clone", "aten::dropout", "aten::contiguous"})) {
    if (d->schema() == "aten::dropout") {
      const auto train = literal_arg(d->args().size() > 2 ? &d->args()[2] : nullptr);
      if (!train || !std::holds_alternative<bool>(*train) || std::get<bool>(*train)) return {};
    }
    probs = d->args()[0].value;
    chain.push_back(probs);
  }
  Node* softmax = producer_in(probs, {"aten::softmax.int", "aten::_softmax"});
  if (!softmax) return {};  // not attention
  // From here the match is attention: a decline says why.
  for (const Value* c : chain)
    if (!used_once(r, c)) return r.decline("the probabilities are also used elsewhere");
  const auto& sa = softmax->args();
  Value* s = sa[0].value;
  if (!s->is_tensor() || s->tensor_type().dim() != 4) return r.decline("the scores are not 4-d [B, H, T, S]");
  auto dim = as_int(literal_arg(sa.size() > 1 ? &sa[1] : nullptr));
  if (!dim || !is_last(*dim, 4)) return r.decline("the softmax is not over the last dim");
  if (softmax->schema() == "aten::softmax.int") {
    if (sa.size() > 2 && !(!sa[2].is_value() && std::holds_alternative<None>(sa[2].literal)))
      return r.decline("the softmax has a dtype argument");
  } else {
    auto half_to_float = literal_arg(sa.size() > 2 ? &sa[2] : nullptr);
    if (!half_to_float || !std::holds_alternative<bool>(*half_to_float) || std::get<bool>(*half_to_float))
      return r.decline("the softmax computes half in float");
  }
  const TensorType ts = s->tensor_type();
  const DType dt = ts.dtype;
  // Masks, from the softmax back to the scale or the product.
  std::vector<Value*> added, filled;
  for (;;) {
    Node* add = producer_in(s, {"aten::add.Tensor"});
    Node* fill = producer_in(s, {"aten::masked_fill.Scalar"});
    if (!add && !fill) break;
    if (!used_once(r, s)) return r.decline("the scores are also used elsewhere");
    if (add) {
      const auto& aa = add->args();
      if (aa.size() < 2 || !aa[1].is_value()) return r.decline("a mask added as a number");
      if (aa.size() > 2) {
        auto alpha = as_double(literal_arg(&aa[2]));
        if (!alpha || *alpha != 1.0) return r.decline("a mask added with alpha other than 1");
      }
      const bool a0 = from_product(aa[0].value), a1 = from_product(aa[1].value);
      if (a0 == a1) return r.decline("an add whose operands are both (or neither) computed from q @ k^T");
      added.push_back(aa[a0 ? 1 : 0].value);
      s = aa[a0 ? 0 : 1].value;
    } else {
      const auto& fa = fill->args();
      auto value = as_double(literal_arg(fa.size() > 2 ? &fa[2] : nullptr));
      if (!fa[1].is_value() || !value || *value != -kInf)
        return r.decline("a masked_fill with a value other than -inf (SDPA's boolean mask removes the entries)");
      filled.push_back(fa[1].value);
      s = fa[0].value;
    }
  }
  // [* c | / c]
  double scale = 1.0;
  if (Node* scaled = producer_in(s, {"aten::mul.Scalar", "aten::div.Scalar"})) {
    if (!used_once(r, s)) return r.decline("the scores are also used elsewhere");
    auto c = as_double(literal_arg(&scaled->args().at(1)));
    if (!c || *c == 0.0 || !std::isfinite(*c)) return r.decline("the scale is not a finite non-zero number");
    scale = scaled->schema() == "aten::div.Scalar" ? 1.0 / *c : *c;
    s = scaled->args()[0].value;
  }
  if (producer_in(s, {"aten::add.Tensor", "aten::masked_fill.Scalar"}))
    return r.decline("a mask is applied before the scale (SDPA scales the scores, then adds the mask)");
  if (!used_once(r, s)) return r.decline("the scores are also used elsewhere");
  // q @ k^T
  Value *q = nullptr, *kt = nullptr;
  if (Node* mm = producer_in(s, {"aten::matmul"}); mm && !fx) {
    if (!mm->args()[1].is_value()) return {};
    q = mm->args()[0].value;
    kt = mm->args()[1].value;
  } else if (Node* view = producer_in(s, {"aten::view", "aten::_unsafe_view"}); view && fx) {
    Node* bmm = producer_in(view->args()[0].value, {"aten::bmm"});
    if (!bmm || !bmm->args()[1].is_value()) return r.decline("the scores are not computed by q @ k^T");
    if (!used_once(r, view->args()[0].value)) return r.decline("the scores are also used elsewhere");
    q = unbatch(bmm->args()[0].value);
    kt = unbatch(bmm->args()[1].value);
    if (!q || !kt) return r.decline("q or k^T of the bmm is not a [B, H, ., .] tensor viewed as 3-d");
  } else {
    return r.decline(fmt::format("the scores come from {}, not from q @ k^T with an optional scale",
                                 s->producer() ? s->producer()->schema() : std::string("an input")));
  }
  Node* transpose = producer_in(kt, {"aten::transpose.int", "aten::permute"});
  if (!transpose) return r.decline("k^T is not a transpose of k's last two dims");
  if (transpose->schema() == "aten::transpose.int") {
    auto d0 = as_int(literal_arg(&transpose->args().at(1))), d1 = as_int(literal_arg(&transpose->args().at(2)));
    auto norm = [](int64_t d) { return d < 0 ? d + 4 : d; };
    if (!d0 || !d1 || norm(*d0) + norm(*d1) != 5 || norm(*d0) * norm(*d1) != 6)
      return r.decline("k^T is not a transpose of k's last two dims");
  } else {
    auto perm = literal_arg(&transpose->args().at(1));
    const std::vector<int64_t> want = {0, 1, 3, 2}, want_neg = {0, 1, -1, -2};
    if (!perm || !std::holds_alternative<SymSizes>(*perm) ||
        (std::get<SymSizes>(*perm) != want && std::get<SymSizes>(*perm) != want_neg))
      return r.decline("k^T is not a transpose of k's last two dims");
  }
  Value* k = transpose->args()[0].value;
  // Shapes, dtypes, devices.
  if (!v) return r.decline("v of the bmm is not a [B, H, S, Dv] tensor viewed as 3-d");
  for (const Value* t : {q, k, v})
    if (!t->is_tensor() || t->tensor_type().dim() != 4) return r.decline("q, k or v is not 4-d");
  const TensorType &tq = q->tensor_type(), &tk = k->tensor_type(), &tv = v->tensor_type();
  if (!is_floating(dt) || tq.dtype != dt || tk.dtype != dt || tv.dtype != dt ||
      softmax->output()->tensor_type().dtype != dt || out->output()->tensor_type().dtype != dt)
    return r.decline(fmt::format("q, k, v and the scores do not share one floating dtype ({}, {}, {}, {})",
                                 dtype_name(tq.dtype), dtype_name(tk.dtype), dtype_name(tv.dtype), dtype_name(dt)));
  if (tq.device != tk.device || tq.device != tv.device || tq.device_index != tk.device_index ||
      tq.device_index != tv.device_index)
    return r.decline("q, k and v are on different devices");
  for (int i = 0; i < 2; ++i)
    if (tq.sizes[i] != tk.sizes[i] || tq.sizes[i] != tv.sizes[i])
      return r.decline("q, k and v differ in their batch or head dims (SDPA does not broadcast them here)");
  if (tq.sizes[3] != tk.sizes[3] || tk.sizes[2] != tv.sizes[2])
    return r.decline("k does not match q's head size or v's sequence length");
  if (ts.sizes != SymSizes{tq.sizes[0], tq.sizes[1], tq.sizes[2], tk.sizes[2]})
    return r.decline("the scores are not [B, H, T, S] of q and k");
  for (const Value* a : added) {
    if (!a->is_tensor()) return r.decline("a mask is not a tensor");
    const TensorType& tm = a->tensor_type();
    if (tm.dtype != dt)
      return r.decline(fmt::format("an added mask is {} where the scores are {} (the add would promote)",
                                   dtype_name(tm.dtype), dtype_name(dt)));
    if (tm.device != tq.device) return r.decline("a mask is on another device");
    if (!broadcasts_to(tm.sizes, ts.sizes)) return r.decline("a mask does not broadcast to the scores [B, H, T, S]");
  }
  for (const Value* f : filled) {
    if (!f->is_tensor() || f->tensor_type().dtype != DType::kBool) return r.decline("a masked_fill mask is not bool");
    if (f->tensor_type().device != tq.device) return r.decline("a mask is on another device");
    if (!broadcasts_to(f->tensor_type().sizes, ts.sizes))
      return r.decline("a mask does not broadcast to the scores [B, H, T, S]");
  }
  // One additive mask.
  Value* mask = nullptr;
  auto plus = [&](Value* term) { mask = mask ? r.add(mask, term) : term; };
  for (auto it = added.rbegin(); it != added.rend(); ++it) plus(*it);
  for (Value* f : filled)
    plus(r.cast(r.op("aten::where.Scalar", {Arg::of(f), Arg::lit(-kInf), Arg::lit(0.0)}, DType::kFloat32,
                     Builder::sizes(f)),
                dt));
  if (mask && Builder::sizes(mask).size() < 2) {  // SDPA takes a mask of at least 2 dims
    const auto ms = Builder::sizes(mask);
    if (!mask->tensor_type().is_contiguous())  // the view below is typed contiguous
      mask = r.op("aten::contiguous", {Arg::of(mask), Arg::lit(int64_t{0})}, dt, ms);
    mask = r.reshape(mask, SymSizes{1, ms.empty() ? SymInt(1) : ms[0]});
  }
  const SymSizes o4 = {tq.sizes[0], tq.sizes[1], tq.sizes[2], tv.sizes[3]};
  ValueType yt;
  yt.tensor = TensorType{dt, o4, sdpa_result_strides(tq, tk, tv, o4), tq.device, tq.device_index};
  Value* y = r.node("aten::scaled_dot_product_attention",
                    {Arg::of(q), Arg::of(k), Arg::of(v), mask ? Arg::of(mask) : Arg::lit(None{}), Arg::lit(0.0),
                     Arg::lit(false), Arg::lit(scale), Arg::lit(false)},
                    {yt})
                 ->output();
  y = r.op("aten::contiguous", {Arg::of(y), Arg::lit(int64_t{0})}, dt, o4);
  if (mask) {  // rows the mask removes entirely: eager's NaN
    const auto& ms = Builder::sizes(mask);
    Value* top = ms.empty() ? mask : r.reduce("aten::amax", mask, {static_cast<int64_t>(ms.size()) - 1}, true);
    Value* dead = r.op("aten::eq.Scalar", {Arg::of(top), Arg::lit(-kInf)}, DType::kBool, Builder::sizes(top));
    y = r.op("aten::masked_fill.Scalar", {Arg::of(y), Arg::of(dead), Arg::lit(std::nan(""))}, dt, o4);
  }
  if (fx) y = r.reshape(y, out->output()->tensor_type().sizes);
  return {y};
}

RuleSet make_attention_rules() {
  RuleSet set{"attention", {}};
  set.rules.push_back({"sdpa",
                       Pattern::op({"aten::matmul", "aten::bmm"}, {Pattern::tensor().bind("p"),
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
