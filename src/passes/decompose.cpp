// decompose: the rule set "decompose" (passes/rewrite.h): composite ops rewritten into the reductions of the
// op table and elementwise ops, so that the fuser can put a softmax, a layer norm or an RMS norm into one
// kernel with its neighbours. Each rule can be turned off as FUSION_JIT_DISABLE=decompose.NAME.
//
// Note [Decompositions]
// - softmax (softmax.int, _softmax)  m = amax(x, d, keep); e = exp(x - m); y = e / sum(e, d, keep)
// - log_softmax (log_softmax.int, _log_softmax)  y = (x - m) - log(sum(exp(x - m), d, keep))
// - logsumexp(x, D, k)  m = amax(x, D, keep), zeroed where infinite (as eager); y = log(sum(exp(x - m), D, k)) + m
// - layer_norm, native_layer_norm: mean and var (correction 0) over the normalized dims;
//   y = (x - mean) * rsqrt(var + eps) [* weight] [+ bias]; native_layer_norm also returns mean and rstd
// - rms_norm: y = x * rsqrt(mean(x * x) + eps), rounded to x's dtype, then [* weight] (eager's order); eps
//   defaults to the machine epsilon of x's compute type; on CUDA, where eager's kernel is not its
//   vectorized one (float64, rows not a multiple of 4), a row holding an infinity is NaN, as eager makes it
// - group_norm (contiguous input): x viewed as [N, G, C/G, HW], reduced over the last two dims, weight and
//   bias viewed as [G, C/G, 1]; the result viewed back
// - std (std.correction, std.dim, std) = sqrt(var of the same arguments)
// - max_dim, min_dim: max.dim / min.dim whose indices are unused = amax / amin
// - max_pool2d, max_pool2d_indices: max_pool2d (with_indices, its indices unused) of a 4-d floating CPU
//   tensor = a maximum of strided slices per edge piece, the pieces cats (Note [Max pooling as loads])
// - batch_norm_inference: _native_batch_norm_legit_no_training whose saved statistics are unused =
//   batch_norm (inference)
// - embedding_range: embedding(w, idx) where idx is an ascending range (arange of step 1, plus literal
//   integers, under unsqueeze/view/reshape, which keep its order) within a contiguous w's rows, and only
//   pointwise ops read the result = rows c..c+n of w viewed as idx's shape + [D]: views made at plan
//   build that the consumer's kernel reads (GPT-2's position embedding). A range outside w's rows stays
//   an embedding (eager raises).
// float16 and bfloat16 inputs are cast to float32 first and the results cast back once, as eager computes
// these ops in float32 and rounds only their results. A node is left as it is (it runs through ATen) when
// an argument is computed at run time, a reduced extent is 0 (eager's own errors and empty results stay
// eager's), or a dtype is not floating. The patterns say what the arguments must be; the rewrite functions
// check the rest (literal kinds, dims, extents) and decline.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ir/op_table.h"
#include "passes/passes.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

// A tensor argument, nullptr for None or an absent one; nullopt for anything else.
std::optional<Value*> tensor_or_none(const Arg* a) {
  if (!a) return static_cast<Value*>(nullptr);
  if (a->is_value()) return a->value->is_tensor() ? std::optional<Value*>(a->value) : std::nullopt;
  return std::holds_alternative<None>(a->literal) ? std::optional<Value*>(nullptr) : std::nullopt;
}
std::optional<int64_t> as_dim(const std::optional<Literal>& l, int64_t rank) {
  if (!l || !std::holds_alternative<SymInt>(*l)) return std::nullopt;
  int64_t d = std::get<SymInt>(*l);
  if (d < 0) d += rank;
  if (d < 0 || d >= rank) return std::nullopt;
  return d;
}

// Whether every dim in `dims` of x has a non-zero extent and x is a floating tensor.
bool reducible(const Value* x, const std::vector<int64_t>& dims) {
  if (!x->is_tensor() || !is_floating(x->tensor_type().dtype) || dims.empty()) return false;
  for (int64_t d : dims)
    if (x->tensor_type().sizes[d] == 0) return false;
  return true;
}

// The dims a normalization over `shape` (the trailing sizes of x) reduces; empty when the literal is not
// such a shape or a dim is empty.
std::vector<int64_t> normalized_dims(const Value* x, const std::optional<Literal>& shape) {
  if (!x->is_tensor() || !shape || !std::holds_alternative<SymSizes>(*shape)) return {};
  const auto& ns = std::get<SymSizes>(*shape);
  const int64_t rank = x->tensor_type().dim(), k = static_cast<int64_t>(ns.size());
  if (k == 0 || k > rank) return {};
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < k; ++i) {
    if (x->tensor_type().sizes[rank - k + i] != ns[i]) return {};
    dims.push_back(rank - k + i);
  }
  return reducible(x, dims) ? dims : std::vector<int64_t>{};
}

bool single_tensor_output(const Node& n) { return n.outputs().size() == 1 && n.output()->is_tensor(); }

// Each rewrite returns the values replacing the matched node's outputs, or nothing to leave it alone.
// _softmax's half_to_float (a float32 result of a float16 input) is the output's dtype, honoured by the
// final cast.
Replacement softmax(const Match& m, Builder& r, bool log) {
  Node* n = m.root;
  Value* x = m.value("x");
  if (!single_tensor_output(*n)) return {};
  auto d = as_dim(literal_arg(m.arg("dim")), std::max<int64_t>(x->tensor_type().dim(), 1));
  if (!d || x->tensor_type().dim() == 0 || !reducible(x, {*d})) return {};
  DType out = n->output()->tensor_type().dtype;
  Value* xf = r.cast(x, compute_dtype(out));
  Value* mx = r.reduce("aten::amax", xf, {*d}, true);
  Value* shifted = r.sub(xf, mx);
  Value* e = r.unary("aten::exp", shifted);
  Value* s = r.reduce("aten::sum.dim_IntList", e, {*d}, true);
  Value* y = log ? r.sub(shifted, r.unary("aten::log", s)) : r.div(e, s);
  return {r.cast(y, out)};
}

Replacement logsumexp(const Match& m, Builder& r) {
  Node* n = m.root;
  Value* x = m.value("x");
  auto dl = literal_arg(m.arg("dim"));
  auto keep = literal_arg(m.arg("keepdim"), false);
  if (!single_tensor_output(*n) || !dl || !keep || !std::holds_alternative<bool>(*keep)) return {};
  const int64_t rank = x->tensor_type().dim();
  std::vector<int64_t> dims;
  if (std::holds_alternative<SymInt>(*dl)) dims = {std::get<SymInt>(*dl)};
  else if (std::holds_alternative<SymSizes>(*dl)) dims = std::get<SymSizes>(*dl);
  else return {};
  for (auto& d : dims) {
    auto nd = as_dim(Literal(d), rank);
    if (!nd) return {};
    d = *nd;
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  if (!reducible(x, dims)) return {};
  bool keepdim = std::get<bool>(*keep);
  DType out = n->output()->tensor_type().dtype;
  Value* xf = r.cast(x, compute_dtype(out));
  auto finite_max = [&](bool kd) {
    Value* mx = r.reduce("aten::amax", xf, dims, kd);
    Value* inf = r.op("aten::eq.Scalar", {Arg::of(r.unary("aten::abs", mx)), Arg::lit(INFINITY)}, DType::kBool,
                      Builder::sizes(mx));
    return r.op("aten::masked_fill.Scalar", {Arg::of(mx), Arg::of(inf), Arg::lit(0.0)}, Builder::dt(mx),
                Builder::sizes(mx));
  };
  Value* mx = finite_max(true);
  Value* s = r.reduce("aten::sum.dim_IntList", r.unary("aten::exp", r.sub(xf, mx)), dims, keepdim);
  Value* y = r.add(r.unary("aten::log", s), keepdim ? mx : finite_max(false));
  return {r.cast(y, out)};
}

// layer_norm (outputs: y) and native_layer_norm (y, mean, rstd).
Replacement layer_norm(const Match& m, Builder& r, bool native) {
  Node* n = m.root;
  Value* x = m.value("x");
  auto w = tensor_or_none(m.arg("weight")), b = tensor_or_none(m.arg("bias"));
  auto eps = as_double(literal_arg(m.arg("eps"), 1e-5));
  std::vector<int64_t> dims = normalized_dims(x, literal_arg(m.arg("shape")));
  if (dims.empty() || !w || !b || !eps) return {};
  DType out = n->output()->tensor_type().dtype;
  DType ct = compute_dtype(out);
  Value* xf = r.cast(x, ct);
  Value* mean = r.reduce("aten::mean.dim", xf, dims, true);
  Value* var = r.reduce("aten::var.correction", xf, dims, true, 0.0);
  Value* rstd = r.unary("aten::rsqrt", r.add_scalar(var, *eps));
  Value* y = r.mul(r.sub(xf, mean), rstd);
  if (*w) y = r.mul(y, r.cast(*w, ct));
  if (*b) y = r.add(y, r.cast(*b, ct));
  Replacement outs = {r.cast(y, out)};
  if (native) {
    outs.push_back(r.cast(mean, n->output(1)->tensor_type().dtype));
    outs.push_back(r.cast(rstd, n->output(2)->tensor_type().dtype));
  }
  return outs;
}

Replacement rms_norm(const Match& m, Builder& r) {
  Node* n = m.root;
  Value* x = m.value("x");
  auto w = tensor_or_none(m.arg("weight"));
  auto eps_lit = literal_arg(m.arg("eps"));
  std::vector<int64_t> dims = normalized_dims(x, literal_arg(m.arg("shape")));
  if (dims.empty() || !single_tensor_output(*n) || !w || !eps_lit) return {};
  DType xt = x->tensor_type().dtype, ct = compute_dtype(xt);
  double eps = ct == DType::kFloat64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
  if (!std::holds_alternative<None>(*eps_lit)) {
    auto e = as_double(eps_lit);
    if (!e) return {};
    eps = *e;
  }
  Value* xf = r.cast(x, ct);
  Value* ms = r.reduce("aten::mean.dim", r.mul(xf, xf), dims, true);
  Value* rstd = r.unary("aten::rsqrt", r.add_scalar(ms, eps));
  // Eager's CUDA kernel has two paths (measured on an H200 with torch 2.11, tests/gpu): the vectorized one
  // (float32/float16/bfloat16 rows of a multiple of 4 elements) sums squares as the CPU does, the other
  // keeps Welford's online moments, where an infinite element (inf - inf) makes the whole row NaN.
  // sum(x - x) over the row is 0, or NaN where the row holds an infinity (or a NaN, NaN already).
  // (The row's length as an expression: a shape class's symbolic row takes a divisibility guard, and only
  // on CUDA, not its size.)
  if (x->tensor_type().device == Device::kCUDA) {
    SymInt row = 1;
    for (int64_t d : dims) row = row * x->tensor_type().sizes[static_cast<size_t>(d)];
    if (ct == DType::kFloat64 || mod(row, 4) != 0)
      rstd = r.add(rstd, r.reduce("aten::sum.dim_IntList", r.sub(xf, xf), dims, true));
  }
  Value* y = r.cast(r.mul(xf, rstd), xt);
  if (*w) y = r.mul(y, *w);
  return {r.cast(y, n->output()->tensor_type().dtype)};
}

Replacement group_norm(const Match& m, Builder& r) {
  Node* n = m.root;
  Value* x = m.value("x");
  auto groups = literal_arg(m.arg("groups"));
  auto w = tensor_or_none(m.arg("weight")), b = tensor_or_none(m.arg("bias"));
  auto eps = as_double(literal_arg(m.arg("eps"), 1e-5));
  if (!single_tensor_output(*n) || !groups || !std::holds_alternative<SymInt>(*groups) || !w || !b || !eps)
    return {};
  const TensorType& xt = x->tensor_type();
  const TensorType& ot = n->output()->tensor_type();
  if (xt.dim() < 2 || !xt.is_contiguous() || !ot.is_contiguous() || ot.sizes != xt.sizes) return {};
  const int64_t N = xt.sizes[0], C = xt.sizes[1], G = std::get<SymInt>(*groups);
  if (G <= 0 || C % G != 0 || N == 0) return {};
  int64_t hw = 1;
  for (int64_t d = 2; d < xt.dim(); ++d) hw *= xt.sizes[d];
  for (auto p : {*w, *b})
    if (p && (p->tensor_type().sizes != std::vector<int64_t>{C} || !p->tensor_type().is_contiguous())) return {};
  std::vector<int64_t> view = {N, G, C / G, hw};
  // The reduced dims are the view's [C/G, HW], not x's dims 2 and 3 (x may have rank 2 or 3).
  if (!is_floating(xt.dtype) || C / G * hw == 0) return {};
  DType ct = compute_dtype(ot.dtype);
  Value* xf = r.cast(r.reshape(x, view), ct);
  Value* mean = r.reduce("aten::mean.dim", xf, {2, 3}, true);
  Value* var = r.reduce("aten::var.correction", xf, {2, 3}, true, 0.0);
  Value* y = r.mul(r.sub(xf, mean), r.unary("aten::rsqrt", r.add_scalar(var, *eps)));
  if (*w) y = r.mul(y, r.cast(r.reshape(*w, {G, C / G, 1}), ct));
  if (*b) y = r.add(y, r.cast(r.reshape(*b, {G, C / G, 1}), ct));
  return {r.reshape(r.cast(y, ot.dtype), xt.sizes)};
}

// std over the same arguments as the var of the same overload.
Replacement std_dev(const Match& m, Builder& r) {
  Node* n = m.root;
  Value* x = m.value("x");
  if (!single_tensor_output(*n)) return {};
  for (const Arg& a : n->args())
    if (a.is_value() && a.value != x) return {};
  const std::string var_schema = n->schema() == "aten::std.correction" ? "aten::var.correction"
                                 : n->schema() == "aten::std.dim"       ? "aten::var.dim"
                                                                        : "aten::var";
  DType out = n->output()->tensor_type().dtype;
  Value* xf = r.cast(x, compute_dtype(out));
  std::vector<Arg> args = n->args();
  args[0] = Arg::of(xf);
  Value* var = r.op(var_schema, std::move(args), Builder::dt(xf), n->output()->tensor_type().sizes);
  auto info = reduction_info(*var->producer());
  if (!info) return {};
  for (int64_t d : info->dims)
    if (x->tensor_type().sizes[d] == 0) return {};
  return {r.cast(r.unary("aten::sqrt", var), out)};
}

// max.dim / min.dim whose indices nobody uses (the pattern says so).
Replacement max_values(const Match& m, Builder& r, bool is_max) {
  Value* x = m.value("x");
  auto d = as_dim(literal_arg(m.arg("dim")), std::max<int64_t>(x->tensor_type().dim(), 1));
  auto keep = literal_arg(m.arg("keepdim"), false);
  if (x->tensor_type().dim() == 0 || !d || !keep || !std::holds_alternative<bool>(*keep) ||
      x->tensor_type().sizes[*d] == 0 || x->tensor_type().dtype == DType::kBool)
    return {};
  return {r.reduce(is_max ? "aten::amax" : "aten::amin", x, {*d}, std::get<bool>(*keep)), nullptr};
}

// Note [Max pooling as loads]: max_pool2d(x, k, s, p, d, ceil_mode) (and max_pool2d_with_indices whose
// indices nobody uses) of a 4-d floating CPU tensor, at most kMaxPoolTaps window elements, becomes the
// maximum of strided slices of x, one slice per window element (tap): output row o reads input row
// o*s - p + i*d for tap i. Near the edges some taps fall in the padding, which eager skips (its -inf);
// so along each spatial dim the output rows are grouped into runs whose valid taps are the same, each
// run of H by each run of W is a piece computing the maximum of its own taps, and the pieces are cats
// along W, then along H. The slices are views that kernels read where they lie (no copy, Note [Views
// folded into kernel loads]), and the cats of unequal items make one kernel of it all (Note [Cats of
// unequal items]): one read of each tap, one write of the result, where ATen's CPU kernel also computes
// and writes the indices (and its NCHW loop is slower still). The taps are combined in window order as
// maximum(tap, acc): a NaN propagates and, of equal values, the earlier stays, as in eager's loop.
// Left to ATen: other dims and dtypes, CUDA (eager's kernel is one already), a window of one element
// (its slice would alias x), a window of more than kMaxPoolTaps elements, empty results or inputs,
// arguments eager would reject.
constexpr int64_t kMaxPoolTaps = 25;

// `n` ints from an int or an int list literal (one value repeated); nullopt otherwise.
std::optional<std::vector<int64_t>> pair_arg(const std::optional<Literal>& l, size_t n = 2) {
  if (!l) return std::nullopt;
  if (std::holds_alternative<SymInt>(*l)) return std::vector<int64_t>(n, std::get<SymInt>(*l));
  if (!std::holds_alternative<SymSizes>(*l)) return std::nullopt;
  const auto& v = std::get<SymSizes>(*l);
  if (v.size() == 1) return std::vector<int64_t>(n, v[0]);
  if (v.size() != n) return std::nullopt;
  return v;
}

Replacement max_pool(const Match& m, Builder& b, bool with_indices) {
  const Node& n = *m.root;
  Value* x = m.value("x");
  const TensorType& xt = x->tensor_type();
  const TensorType& ot = n.output(0)->tensor_type();
  if (xt.dim() != 4 || ot.dim() != 4 || !is_floating(xt.dtype) || xt.device != Device::kCPU || xt.numel() == 0 ||
      ot.numel() == 0 || ot.dtype != xt.dtype || ot.sizes[0] != xt.sizes[0] || ot.sizes[1] != xt.sizes[1])
    return {};
  auto k = pair_arg(literal_arg(m.arg("k")));
  const auto sl = literal_arg(m.arg("s"), std::vector<int64_t>{});
  const bool no_stride = sl && sl == Literal{std::vector<int64_t>{}};  // stride []: the window's size
  auto s = no_stride ? k : pair_arg(sl);
  auto p = pair_arg(literal_arg(m.arg("p"), int64_t{0}));
  auto d = pair_arg(literal_arg(m.arg("d"), int64_t{1}));
  auto ceil = literal_arg(m.arg("ceil"), false);
  if (!k || !s || !p || !d || !ceil || !std::holds_alternative<bool>(*ceil)) return {};
  for (int i = 0; i < 2; ++i)
    if ((*k)[i] < 1 || (*s)[i] < 1 || (*p)[i] < 0 || (*d)[i] < 1 || 2 * (*p)[i] > (*k)[i]) return {};
  if ((*k)[0] * (*k)[1] == 1) return {};
  if ((*k)[0] * (*k)[1] > kMaxPoolTaps)
    return b.decline(fmt::format("a {}x{} window is more than {} loads per element", (*k)[0], (*k)[1], kMaxPoolTaps));
  // Runs of output rows along spatial dim `dim` (2 or 3) whose valid taps are the same: [first, end), taps.
  struct Run {
    int64_t first, end;
    std::vector<int64_t> taps;
  };
  auto runs = [&](int dim) {
    const int i = dim - 2;
    std::vector<Run> out;
    for (int64_t o = 0; o < ot.sizes[dim]; ++o) {
      std::vector<int64_t> taps;
      for (int64_t t = 0; t < (*k)[i]; ++t) {
        const int64_t at = o * (*s)[i] - (*p)[i] + t * (*d)[i];
        if (at >= 0 && at < xt.sizes[dim]) taps.push_back(t);
      }
      if (taps.empty()) return std::vector<Run>{};  // a window wholly in the padding: eager's to judge
      if (!out.empty() && out.back().taps == taps) out.back().end = o + 1;
      else out.push_back({o, o + 1, taps});
    }
    return out;
  };
  const std::vector<Run> rows = runs(2), cols = runs(3);
  if (rows.empty() || cols.empty()) return {};
  // Values laid out as the result is (channels-last or contiguous), as eager lays out each part.
  const bool cl = ot.strides == channels_last_strides(ot.sizes) && ot.strides != contiguous_strides(ot.sizes);
  auto typed = [&](std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    TensorType t = xt;
    t.sizes = std::move(sizes);
    t.strides = std::move(strides);
    return ValueType{t, ""};
  };
  auto dense = [&](const std::vector<int64_t>& sizes) {
    return typed(sizes, cl ? channels_last_strides(sizes) : contiguous_strides(sizes));
  };
  // x[:, :, rows of run r at tap i, cols of run c at tap j]
  auto tap = [&](const Run& r, int64_t i, const Run& c, int64_t j) {
    Value* v = x;
    const Run* run[2] = {&r, &c};
    const int64_t t[2] = {i, j};
    for (int q = 0; q < 2; ++q) {
      const int dim = 2 + q;
      const TensorType& vt = v->tensor_type();
      const int64_t first = run[q]->first * (*s)[q] - (*p)[q] + t[q] * (*d)[q];
      const int64_t len = run[q]->end - run[q]->first;
      std::vector<int64_t> sizes = vt.sizes, strides = vt.strides;
      sizes[dim] = len;
      strides[dim] *= (*s)[q];
      v = b.node("aten::slice.Tensor",
                 {Arg::of(v), Arg::lit(int64_t{dim}), Arg::lit(first), Arg::lit(first + (len - 1) * (*s)[q] + 1),
                  Arg::lit((*s)[q])},
                 {typed(sizes, strides)})
              ->output();
    }
    return v;
  };
  auto cat = [&](std::vector<Value*> items, int64_t dim, const ValueType& type) {
    std::vector<Arg> args;
    for (Value* v : items) args.push_back(Arg::of(v));
    Value* l = b.node("prim::ListConstruct", std::move(args), {ValueType{std::nullopt, "Tensor[]"}})->output();
    return b.node("aten::cat", {Arg::of(l), Arg::lit(dim)}, {type})->output();
  };
  std::vector<Value*> bands;
  for (const Run& r : rows) {
    std::vector<Value*> pieces;
    for (const Run& c : cols) {
      const std::vector<int64_t> sizes = {ot.sizes[0], ot.sizes[1], r.end - r.first, c.end - c.first};
      Value* acc = nullptr;
      for (int64_t i : r.taps)
        for (int64_t j : c.taps) {
          Value* t = tap(r, i, c, j);
          acc = acc ? b.node("aten::maximum", {Arg::of(t), Arg::of(acc)}, {dense(sizes)})->output() : t;
        }
      pieces.push_back(acc);
    }
    std::vector<int64_t> sizes = ot.sizes;
    sizes[2] = r.end - r.first;
    bands.push_back(pieces.size() == 1 ? pieces[0] : cat(pieces, 3, dense(sizes)));
  }
  Value* y = bands.size() == 1 ? bands[0] : cat(bands, 2, ValueType{ot, ""});
  // A single piece of one tap would be a view of x: eager's result is a tensor of its own.
  if (y->producer()->schema() == "aten::slice.Tensor") return {};
  if (with_indices) return {y, nullptr};
  return {y};
}

// _native_batch_norm_legit_no_training (what AOT autograd makes of an inference batch_norm) whose saved
// mean and rstd nobody uses (the pattern says so): batch_norm in inference mode, an op of the table.
Replacement batch_norm_inference(const Match& m, Builder& r) {
  Node* n = m.root;
  if (n->args().size() != 7) return {};
  const auto& a = n->args();
  std::vector<Arg> args = {a[0], a[1], a[2], a[3], a[4], Arg::lit(false), a[5], a[6], Arg::lit(true)};
  return {r.node("aten::batch_norm", std::move(args), {n->output(0)->type()})->output(), nullptr, nullptr};
}

Replacement embedding_range(const Match& m, Builder& b) {
  const Node& n = *m.root;
  Value* w = m.value("w");
  Value* idx = m.value("idx");
  const TensorType& wt = w->tensor_type();
  if (wt.dim() != 2 || !wt.is_contiguous() || !is_integral(idx->tensor_type().dtype, false) || b.returned(n.output()))
    return {};
  for (const Node* u : b.users(n.output()))
    if (!u->op() || u->op()->category != OpCategory::kElementwise || u->side_effects()) return {};
  // Walk idx back to an arange through order-keeping views and literal shifts (a shape class's sizes stay
  // symbolic: GPT-2's positions are arange(s0)).
  SymInt shift = 0;
  const Value* v = idx;
  std::optional<SymInt> start;
  while (const Node* p = v->producer()) {
    const std::string& s = p->schema();
    const auto& a = p->args();
    if (s == "aten::arange" || s == "aten::arange.start" || s == "aten::arange.start_step") {
      const bool from_0 = s == "aten::arange";
      if (a.empty() || a[0].is_value() || (!from_0 && (a.size() < 2 || a[1].is_value()))) return {};
      if (!from_0 && !std::holds_alternative<SymInt>(a[0].literal)) return {};
      start = from_0 ? SymInt(0) : std::get<SymInt>(a[0].literal);
      if (s == "aten::arange.start_step" && (a.size() < 3 || as_int(literal_arg(&a[2])) != int64_t{1})) return {};
      break;
    }
    if (a.empty() || !a[0].is_value()) return {};
    if (s == "aten::unsqueeze" || s == "aten::view" || s == "aten::reshape" || s == "aten::_unsafe_view") {
      v = a[0].value;
    } else if (s == "aten::add.Scalar" && a.size() == 3 && std::holds_alternative<SymInt>(a[1].literal)) {
      auto alpha = as_int(literal_arg(&a[2]));
      if (!alpha) return {};
      shift += std::get<SymInt>(a[1].literal) * SymInt(*alpha);
      v = a[0].value;
    } else {
      return {};
    }
  }
  if (!start || v->tensor_type().dim() != 1) return {};
  const SymInt rows = idx->tensor_type().sym_numel(), first = *start + shift;
  if (v->tensor_type().sym_numel() != rows) return {};
  if (first < 0 || first + rows > wt.sizes[0])
    return b.decline(fmt::format("the range {}..{} is outside the weight's {} rows", first.str(), (first + rows).str(),
                                 wt.sizes[0].str()));
  Value* slice = b.op("aten::slice.Tensor", {Arg::of(w), Arg::lit(int64_t{0}), Arg::lit(first), Arg::lit(first + rows),
                                             Arg::lit(int64_t{1})},
                      wt.dtype, {rows, wt.sizes[1]});
  const auto& sizes = n.output()->tensor_type().sizes;  // the rows are contiguous (w is): a view
  return {b.op("aten::view", {Arg::of(slice), Arg::lit(sizes)}, wt.dtype, sizes)};
}

Pattern any(const char* name) { return Pattern::any().bind(name); }

RuleSet make_decompositions() {
  using P = Pattern;
  const P x = P::value().bind("x");
  const P t = P::tensor().bind("x");
  const P ft = P::tensor().where(is_floating_tensor).bind("x");
  auto op = [](std::vector<std::string> schemas, std::vector<P> args) { return P::op(std::move(schemas), std::move(args)); };
  return RuleSet{
      "decompose",
      {
          {"softmax", op({"aten::softmax.int", "aten::_softmax"}, {ft, P::literal().bind("dim")}).outputs(1),
           [](const Match& m, Builder& b) { return softmax(m, b, false); }},
          {"log_softmax", op({"aten::log_softmax.int", "aten::_log_softmax"}, {ft, P::literal().bind("dim")}).outputs(1),
           [](const Match& m, Builder& b) { return softmax(m, b, true); }},
          {"logsumexp", op({"aten::logsumexp"}, {t, any("dim"), any("keepdim")}), logsumexp},
          {"layer_norm", op({"aten::layer_norm"}, {x, any("shape"), any("weight"), any("bias"), any("eps")}).outputs(1),
           [](const Match& m, Builder& b) { return layer_norm(m, b, false); }},
          {"native_layer_norm",
           op({"aten::native_layer_norm"}, {x, any("shape"), any("weight"), any("bias"), any("eps")}).outputs(3),
           [](const Match& m, Builder& b) { return layer_norm(m, b, true); }},
          {"rms_norm", op({"aten::rms_norm"}, {x, any("shape"), any("weight"), any("eps")}), rms_norm},
          {"group_norm", op({"aten::group_norm"}, {t, any("groups"), any("weight"), any("bias"), any("eps")}),
           group_norm},
          {"std", op({"aten::std.correction", "aten::std.dim", "aten::std"}, {ft}), std_dev},
          {"max_dim", op({"aten::max.dim"}, {t, any("dim"), any("keepdim")}).outputs(2).unused(1),
           [](const Match& m, Builder& b) { return max_values(m, b, true); }},
          {"min_dim", op({"aten::min.dim"}, {t, any("dim"), any("keepdim")}).outputs(2).unused(1),
           [](const Match& m, Builder& b) { return max_values(m, b, false); }},
          {"embedding_range", op({"aten::embedding"}, {P::tensor().bind("w"), P::tensor().bind("idx")}),
           embedding_range},
          {"max_pool2d",
           op({"aten::max_pool2d"}, {t, any("k"), any("s"), any("p"), any("d"), any("ceil")}).outputs(1),
           [](const Match& m, Builder& b) { return max_pool(m, b, false); }},
          {"max_pool2d_indices",
           op({"aten::max_pool2d_with_indices"}, {t, any("k"), any("s"), any("p"), any("d"), any("ceil")})
               .outputs(2)
               .unused(1),
           [](const Match& m, Builder& b) { return max_pool(m, b, true); }},
          {"batch_norm_inference", op({"aten::_native_batch_norm_legit_no_training"}, {x}).outputs(3).unused(1).unused(2),
           batch_norm_inference},
      }};
}

}  // namespace

const RuleSet& decompositions() {
  static const RuleSet set = make_decompositions();
  return set;
}

bool decompose(Graph& g) { return run_rules(g, decompositions()); }

}  // namespace fusion_jit
