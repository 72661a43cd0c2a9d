// The rule set "views" (Note [Views through pointwise ops]).
//
// Note [Views through pointwise ops]
// A view between two fusible ops ends a kernel: add -> transpose -> mul runs as two kernels, the first
// writing its whole result for the second to read through the view. views.through_pointwise moves the
// view to the pointwise op's inputs instead: view(f(a, b)) becomes f(view(a'), view(b')), where a' is a
// broadcast to f's result shape (an expand, left out where a has that shape). Each input's view is the
// index map the consuming kernel reads it through: its sizes and strides are composed here, from the
// input's type, and made at plan build without the dispatcher (Note [Views made at plan build]); the
// kernel then computes f at the view's positions, and f and the ops after the view are one group.
// Repeated to a fixed point, a chain of pointwise ops takes the view to its first inputs.
// views.full_slice first drops slices that cover their whole dim with step 1 (x[:, :, None] writes two),
// which would otherwise stand between the ops as views of their own; views.identity drops ops that return
// their input itself (eval-mode dropout, type_as and to.dtype to the input's type): a step, or a copy in
// a kernel, where eager makes nothing.
// views.slice_through_pointwise moves a slice (literal bounds, step 1) the same way, where f is read by
// slices only (at most kMaxSlices, each taking its own copy of f over its part); the input's slice is
// made at plan build at its start's offset. views.pointwise_of_cat moves a cat of items of one shape
// that only a pointwise op f reads (f's result of the cat's shape) after f:
//   f(cat([x1..xk], d), y) = cat([f(x1, y1)..f(xk, yk)], d),
// yi the part of y (broadcast to f's shape) over xi's rows. Repeated, a chain of pointwise ops after
// a cat (rotary embeddings: q * cos + cat(-q2, q1) * sin) becomes pointwise ops of slices of the inputs
// whose results one cat stores: one kernel (Note [Concatenation in kernels]) instead of a cat kernel and
// a kernel reading its result.
//
// It fires where all of these hold:
// - the view is one of view, _unsafe_view, reshape, flatten.using_ints, t, transpose.int, permute,
//   expand, unsqueeze, squeeze.dim, alias (views whose result type says all: no storage offset);
// - f is a pointwise op of the table (category elementwise, no per-channel argument, every tensor
//   argument broadcasting to its result, literals elsewhere, one tensor result), used by the view only,
//   not returned, and no node with side effects runs between f and the view (f's inputs are read where
//   the view was);
// - the view's result is not returned, and every op reading it (through further views of the same
//   kinds) is pointwise: only there does the move let two kernels become one; before a matmul or another
//   ATen op it would change the layout the op reads and save nothing;
// - a reshape-like view of each input is a view for the input's strides (ATen's rule for view), else
//   it declines: a copy would cost more than the kernel boundary it removes;
// - an expand makes at most kMaxExpand times as many elements: f is computed again at every broadcast
//   position, which is cheap for a few copies (repeat_kv's) and not for many.
// f's new result has the view's sizes and strides, the layout eager gives the view, so whatever reads it
// sees the same type; where those strides overlap (an expand's), contiguous ones (rewrite.h).
// Aliasing is unchanged: the moved view's result was an intermediate, and the views made of the inputs
// are intermediates that nothing returns. FUSION_JIT_DISABLE=views turns the set off.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "fusion/fusion.h"
#include "ir/op_table.h"
#include "passes/passes.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

constexpr int64_t kMaxExpand = 8;
constexpr size_t kMaxSlices = 4;

const std::vector<std::string>& view_schemas() {
  static const std::vector<std::string> s = {
      "aten::view",      "aten::_unsafe_view",  "aten::reshape", "aten::flatten.using_ints", "aten::t",
      "aten::transpose.int", "aten::permute",   "aten::expand",  "aten::unsqueeze",          "aten::squeeze.dim",
      "aten::alias"};
  return s;
}

bool is_view(const Node* n) {
  const auto& s = view_schemas();
  return std::find(s.begin(), s.end(), n->schema()) != s.end();
}

// Views that only regroup dims (their result's sizes say all; strides from ATen's view rule).
bool reshapes(const std::string& s) {
  return s == "aten::view" || s == "aten::_unsafe_view" || s == "aten::reshape" || s == "aten::flatten.using_ints" ||
         s == "aten::unsqueeze" || s == "aten::squeeze.dim" || s == "aten::alias";
}

SymInt numel(const SymSizes& s) {
  SymInt n = 1;
  for (const SymInt& x : s) n *= x;
  return n;
}

// The strides of `x` expanded to `to` (which its sizes broadcast to): 0 for new and stretched dims.
SymSizes expanded_strides(const TensorType& x, const SymSizes& to) {
  SymSizes o(to.size(), SymInt(0));
  for (size_t i = 0; i < x.sizes.size(); ++i) {
    const size_t j = to.size() - x.sizes.size() + i;
    o[j] = x.sizes[i] == to[j] ? x.strides[i] : SymInt(0);
  }
  return o;
}

int64_t norm_dim(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }

// The strides of a tensor of sizes `from` and strides `stride` viewed as `to`, where it is a view (ATen's
// computeStride: each run of dims that is contiguous in memory may be split or merged); nullopt otherwise.
std::optional<SymSizes> view_strides(const SymSizes& from, const SymSizes& stride, const SymSizes& to) {
  SymSizes out(to.size(), SymInt(1));
  const SymInt n = numel(from);
  if (n == 0 || numel(to) != n) return std::nullopt;
  if (from.empty()) return out;
  int64_t view_d = static_cast<int64_t>(to.size()) - 1;
  SymInt base = stride.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(from.size()) - 1; d >= 0; --d) {
    tensor_numel *= from[d];
    if (d == 0 || (from[d - 1] != 1 && stride[d - 1] != tensor_numel * base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[view_d] == 1)) {
        out[view_d] = view_numel * base;
        view_numel *= to[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        base = stride[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// The strides `x` (of the view's input sizes) has after the view `v`; nullopt where it is no view.
std::optional<SymSizes> strides_after(const Node& v, const TensorType& x, const TensorType& out) {
  const std::string& s = v.schema();
  if (reshapes(s)) return view_strides(x.sizes, x.strides, out.sizes);
  SymSizes st = x.strides;
  const size_t r = st.size();
  if (s == "aten::t") {
    if (r == 2) std::swap(st[0], st[1]);
    return st;
  }
  if (s == "aten::transpose.int") {
    auto d0 = as_int(literal_arg(&v.args()[1])), d1 = as_int(literal_arg(&v.args()[2]));
    if (!d0 || !d1 || r == 0) return std::nullopt;
    std::swap(st.at(norm_dim(*d0, r)), st.at(norm_dim(*d1, r)));
    return st;
  }
  if (s == "aten::permute") {
    auto dims = literal_arg(&v.args()[1]);
    if (!dims || !std::holds_alternative<SymSizes>(*dims)) return std::nullopt;
    const auto& p = std::get<SymSizes>(*dims);
    if (p.size() != r) return std::nullopt;
    SymSizes o;
    for (int64_t d : p) o.push_back(st.at(norm_dim(d, r)));
    return o;
  }
  if (s == "aten::expand") return expanded_strides(x, out.sizes);
  if (s == "aten::slice.Tensor") return x.strides;
  return std::nullopt;
}

// Whether `v` is a slice with literal arguments, step 1, within its input.
bool plain_slice(const Node& v) {
  if (v.schema() != "aten::slice.Tensor" || v.args().size() != 5 || !v.args()[0].is_value()) return false;
  const TensorType& in = v.args()[0].value->tensor_type();
  auto dim = as_int(literal_arg(&v.args()[1]));
  auto start = as_sym(literal_arg(&v.args()[2]));
  auto end = as_sym(literal_arg(&v.args()[3]));
  auto step = as_int(literal_arg(&v.args()[4]));
  if (!dim || !start || !end || step != int64_t{1}) return false;
  const int64_t d = norm_dim(*dim, in.sizes.size());
  return d >= 0 && d < in.dim() && *start >= 0 && *end <= in.sizes[d] && *start <= *end;
}

// Whether everything that reads `v` (through further views) is a pointwise op, and nothing returns it.
bool feeds_pointwise(const Value* v, const Builder& b) {
  if (b.returned(v)) return false;
  const auto users = b.users(v);
  if (users.empty()) return false;
  for (const Node* u : users) {
    if (is_view(u)) {
      if (!feeds_pointwise(u->output(), b)) return false;
    } else if (!u->op() || u->op()->category != OpCategory::kElementwise || u->side_effects()) {
      return false;
    } else if (u->schema() == "aten::batch_norm" && !u->args().empty() && u->args()[0].is_value() &&
               u->args()[0].value == v) {
      // Eager picks batch_norm's formula by its input's layout (Note [batch_norm's formulas]): a view
      // moved above it would hand it a dense value where eager's input is the view, and the other formula
      // (an expanded input of 1e30s: 0 in eager, -inf by scale and shift; fuzz seed 11714164807101688249).
      return false;
    }
  }
  return true;
}

// Whether `f` is a pointwise op whose tensor arguments all broadcast to its result, and one a kernel can
// compute: the rules give the ops they make the layouts a kernel writes, which ATen need not (an integer
// fmod by a tensor of a transposed item came back transposed where the plan typed it contiguous: fuzz seed
// 11769533686713223909); nor would moving a view through an ATen step save anything.
bool pointwise(const Node& f) {
  const OpInfo* op = f.op();
  if (!op || op->category != OpCategory::kElementwise || f.side_effects() || f.outputs().size() != 1 ||
      !f.output()->is_tensor() || !can_fuse_node(f, nullptr))
    return false;
  const TensorType& out = f.output()->tensor_type();
  for (size_t i = 0; i < f.args().size(); ++i) {
    const Arg& a = f.args()[i];
    const bool tensor_arg = i < op->args.size() && op->args[i].is_tensor();
    if (i < op->args.size() && op->args[i].kind == ArgKind::kChannel) {
      if (a.is_value()) return false;  // indexed by dim 1, not broadcast
      continue;
    }
    if (!a.is_value()) {
      if (tensor_arg) return false;
      continue;
    }
    if (!tensor_arg || !a.value->is_tensor()) return false;
    const TensorType& t = a.value->tensor_type();
    if (t.device != out.device || t.device_index != out.device_index || !broadcasts_to(t.sizes, out.sizes)) return false;
  }
  return true;
}

Replacement through_pointwise(const Match& m, Builder& b) {
  const Node& v = *m.root;
  Value* fv = m.value("f");
  const Node* f = fv->producer();
  if (!f || !pointwise(*f) || v.outputs().size() != 1 || !v.output()->is_tensor()) return {};
  if (v.schema() == "aten::slice.Tensor") {
    // f read by slices only (at most kMaxSlices): each takes its own copy of f, over its part.
    const auto users = b.users(fv);
    if (!plain_slice(v) || b.returned(fv) || users.size() > kMaxSlices) return {};
    for (const Node* u : users)
      if (u->schema() != "aten::slice.Tensor") return {};
  } else if (b.users(fv).size() != 1) {
    return {};
  }
  if (!feeds_pointwise(v.output(), b)) return {};
  const TensorType& mid = fv->tensor_type();
  const TensorType& out = v.output()->tensor_type();
  if (v.schema() == "aten::expand" && numel(out.sizes) > kMaxExpand * sym_max(numel(mid.sizes), 1)) return {};
  if (b.side_effects_between(f, &v)) return {};
  // Each tensor argument broadcast to f's result shape, then viewed as v views f's result.
  std::vector<Arg> args = f->args();
  for (Arg& a : args) {
    if (!a.is_value()) continue;
    Value* x = a.value;
    const TensorType& t = x->tensor_type();
    // A 0-d operand is the same at every position of any view: kept 0-d, so that it keeps its part in
    // type promotion (expanded, maximum(i32[1], i64[]) became maximum(i32[1], i64[1]), an i64 result
    // where eager's is i32, and a comparison would compute in i64: fuzz seed 3803078624763686185).
    if (t.dim() == 0) continue;
    TensorType wide = t;
    if (t.sizes != mid.sizes) {
      wide.sizes = mid.sizes;
      wide.strides = expanded_strides(t, mid.sizes);
    }
    TensorType viewed = out;
    viewed.dtype = t.dtype;
    if (v.schema() == "aten::expand") {
      // expand(expand(x, mid), out) is expand(x, out): one view.
      auto st = strides_after(v, t, out);
      if (!st) return {};
      viewed.strides = *st;
      a.value = b.node("aten::expand", {Arg::of(x), Arg::lit(out.sizes)}, {ValueType{viewed, ""}})->output();
      continue;
    }
    auto st = strides_after(v, wide, out);
    if (!st) return b.decline(fmt::format("{} of {}: not a view for its strides [{}]", v.schema(), x->name(),
                                          wide.strides.str()));
    viewed.strides = *st;
    if (t.sizes != mid.sizes)
      x = b.node("aten::expand", {Arg::of(x), Arg::lit(mid.sizes)}, {ValueType{wide, ""}})->output();
    std::vector<Arg> vargs = v.args();
    vargs[0] = Arg::of(x);
    if (reshapes(v.schema())) vargs = {Arg::of(x), Arg::lit(out.sizes)};
    a.value = b.node(reshapes(v.schema()) ? "aten::view" : v.schema(), vargs, {ValueType{viewed, ""}})->output();
  }
  return {b.node(f->schema(), args, {ValueType{out, ""}})->output()};
}

// f(cat([x1, ..., xk], d), y) = cat([f(x1, y1), ..., f(xk, yk)], d), yi the part of y (broadcast to
// f's shape) over xi's rows along d: a cat read by a pointwise op moves after it, so the op's kernel
// computes each item's part and stores it into the final buffer (Note [Concatenation in kernels]).
Replacement pointwise_of_cat(const Match& m, Builder& b) {
  const Node& f = *m.root;
  if (!pointwise(f)) return {};
  const TensorType& out = f.output()->tensor_type();
  int which = -1;
  for (size_t i = 0; i < f.args().size(); ++i) {
    const Arg& a = f.args()[i];
    if (!a.is_value() || !a.value->producer() || a.value->producer()->schema() != "aten::cat") continue;
    if (which >= 0) return {};  // two cats: left as they are
    which = static_cast<int>(i);
  }
  if (which < 0) return {};
  Value* cv = f.args()[which].value;
  const Node& cat = *cv->producer();
  const TensorType& ct = cv->tensor_type();
  if (ct.sizes != out.sizes || b.returned(cv) || b.users(cv).size() != 1 || cat.args().size() != 2 ||
      !cat.args()[0].is_value() || cat.args()[1].is_value() || b.side_effects_between(&cat, &f))
    return {};
  const Node* list = cat.args()[0].value->producer();
  if (!list || list->schema() != "prim::ListConstruct" || b.users(cat.args()[0].value).size() != 1) return {};
  auto dim = as_int(literal_arg(&cat.args()[1]));
  if (!dim) return {};
  const int64_t d = norm_dim(*dim, out.sizes.size());
  if (d < 0 || d >= out.dim()) return {};
  std::vector<Value*> items;
  for (const Arg& a : list->args()) {
    if (!a.is_value() || !a.value->is_tensor()) return {};
    const TensorType& t = a.value->tensor_type();
    if (t.dtype != ct.dtype || t.dim() != out.dim()) return {};
    for (int64_t j = 0; j < out.dim(); ++j)
      if (j != d && t.sizes[j] != out.sizes[j]) return {};
    if (t.sizes[d] > 0) items.push_back(a.value);
  }
  if (items.size() < 2) return {};
  // Items of one shape only: such a cat is stored by its items' kernel; of other shapes it stays an ATen
  // step, and f per item would be a kernel per item instead of one.
  for (const Value* item : items)
    if (item->tensor_type().sizes != items[0]->tensor_type().sizes) return {};
  std::vector<Arg> parts;
  SymInt at = 0;
  for (Value* item : items) {
    const SymInt len = item->tensor_type().sizes[d];
    SymSizes sizes = out.sizes;
    sizes[d] = len;
    std::vector<Arg> args = f.args();
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].is_value()) continue;
      if (static_cast<int>(i) == which) {
        args[i] = Arg::of(item);
        continue;
      }
      Value* y = args[i].value;
      const TensorType& t = y->tensor_type();
      // An operand constant along d broadcasts over each item as over the cat: kept as it is, so that a
      // 0-d operand stays 0-d (made a [.., len, ..] slice it would take part in type promotion as a
      // dimensioned tensor: bf16 - f16[] is bf16, bf16 - f16[33] f32).
      const int64_t k = d - (out.dim() - t.dim());
      if (k < 0 || t.sizes[k] == 1) continue;
      TensorType wide = t;
      if (t.sizes != out.sizes) {
        wide.sizes = out.sizes;
        wide.strides = expanded_strides(t, out.sizes);
        y = b.node("aten::expand", {Arg::of(y), Arg::lit(out.sizes)}, {ValueType{wide, ""}})->output();
      }
      TensorType part = wide;
      part.sizes = sizes;
      args[i] = Arg::of(b.node("aten::slice.Tensor",
                               {Arg::of(y), Arg::lit(d), Arg::lit(static_cast<int64_t>(at)),
                                Arg::lit(static_cast<int64_t>(at + len)), Arg::lit(int64_t{1})},
                               {ValueType{part, ""}})
                            ->output());
    }
    TensorType pt = out;
    pt.sizes = sizes;
    pt.strides = contiguous_strides(sizes);
    parts.push_back(Arg::of(b.node(f.schema(), args, {ValueType{pt, ""}})->output()));
    at += len;
  }
  Value* l = b.node("prim::ListConstruct", parts, {list->output()->type()})->output();
  return {b.node("aten::cat", {Arg::of(l), Arg::lit(d)}, {ValueType{out, ""}})->output()};
}

// slice(x, dim, start, end, 1) covering the whole dim (what indexing with ':' writes) is x itself where
// nothing returns it (a returned slice is a tensor of its own, aliasing x, as eager's).
Replacement full_slice(const Match& m, Builder& b) {
  const Node& n = *m.root;
  Value* x = m.value("x");
  if (b.returned(n.output()) || n.args().size() < 2) return {};
  const auto& sizes = x->tensor_type().sizes;
  const size_t r = sizes.size();
  auto dim = as_int(literal_arg(n.args().size() > 1 ? &n.args()[1] : nullptr, int64_t{0}));
  auto start = literal_arg(n.args().size() > 2 ? &n.args()[2] : nullptr);
  auto end = literal_arg(n.args().size() > 3 ? &n.args()[3] : nullptr);
  auto step = as_int(literal_arg(n.args().size() > 4 ? &n.args()[4] : nullptr, int64_t{1}));
  if (!dim || !start || !end || !step || *step != 1 || r == 0) return {};
  const int64_t d = norm_dim(*dim, r);
  if (d < 0 || d >= static_cast<int64_t>(r)) return {};
  const bool from_0 = std::holds_alternative<None>(*start) || as_sym(start) == int64_t{0};
  const bool to_end = std::holds_alternative<None>(*end) || (as_sym(end) && *as_sym(end) >= sizes[d]);
  if (!from_0 || !to_end) return {};
  return {x};
}

// Ops whose schema promises a new tensor but that return their input itself where nothing changes:
// dropout (and its feature and alpha forms) with a literal train=False; type_as to the input's own dtype
// and device; to.dtype to the input's own dtype with copy=False and no memory format. Eager's result is the
// input tensor, so the op is its input here too: where the result is changed in place, the input changes
// with it, as eager's does (a kernel or a new arena place would leave the input as it was).
Replacement identity(const Match& m, Builder&) {
  const Node& n = *m.root;
  Value* x = m.value("x");
  const std::string& s = n.schema();
  const auto& args = n.args();
  auto literal_is = [&](size_t i, Literal want) {
    auto l = literal_arg(i < args.size() ? &args[i] : nullptr);
    return l && *l == want;
  };
  if (!n.output()->is_tensor() || n.output()->tensor_type() != x->tensor_type()) return {};
  if (s == "aten::type_as") return args.size() == 2 && args[1].is_value() ? Replacement{x} : Replacement{};
  if (s == "aten::to.dtype") {
    auto d = as_int(literal_arg(args.size() > 1 ? &args[1] : nullptr));
    if (!d || dtype_from_torch_code(static_cast<int>(*d)) != x->tensor_type().dtype) return {};
    return literal_is(3, Literal{false}) && literal_is(4, Literal{None{}}) ? Replacement{x} : Replacement{};
  }
  return literal_is(2, Literal{false}) ? Replacement{x} : Replacement{};  // the dropouts' train
}

RuleSet make_view_rules() {
  return RuleSet{"views",
                 {{"identity",
                   Pattern::op({"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                                "aten::feature_alpha_dropout", "aten::type_as", "aten::to.dtype"},
                               {Pattern::tensor().bind("x")}),
                   identity},
                  {"full_slice", Pattern::op({"aten::slice.Tensor"}, {Pattern::tensor().bind("x")}), full_slice},
                  {"through_pointwise", Pattern::op(view_schemas(), {Pattern::op({}).single_use().bind("f")}),
                   through_pointwise},
                  {"slice_through_pointwise", Pattern::op({"aten::slice.Tensor"}, {Pattern::op({}).bind("f")}),
                   through_pointwise},
                  {"pointwise_of_cat", Pattern::op({}), pointwise_of_cat}}};
}

}  // namespace

const RuleSet& view_rules() {
  static const RuleSet set = make_view_rules();
  return set;
}

}  // namespace fusion_jit
