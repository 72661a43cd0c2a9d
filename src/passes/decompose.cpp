// decompose: composite ops rewritten into the reductions of the op table and elementwise ops, so that the
// fuser can put a softmax, a layer norm or an RMS norm into one kernel with its neighbours.
//
// Note [Decompositions]
// - softmax(x, d)      m = amax(x, d, keep); e = exp(x - m); y = e / sum(e, d, keep)
// - log_softmax(x, d)  y = (x - m) - log(sum(exp(x - m), d, keep))
// - logsumexp(x, D, k) m = amax(x, D, keep), zeroed where infinite (as eager); y = log(sum(exp(x - m), D, k)) + m
// - layer_norm, native_layer_norm: mean and var (correction 0) over the normalized dims;
//   y = (x - mean) * rsqrt(var + eps) [* weight] [+ bias]; native_layer_norm also returns mean and rstd
// - rms_norm: y = x * rsqrt(mean(x * x) + eps), rounded to x's dtype, then [* weight] (eager's order); eps
//   defaults to the machine epsilon of x's compute type
// - group_norm (contiguous input): x viewed as [N, G, C/G, HW], reduced over the last two dims, weight and
//   bias viewed as [G, C/G, 1]; the result viewed back
// - std = sqrt(var); max.dim / min.dim whose indices are unused = amax / amin
// - _native_batch_norm_legit_no_training whose saved statistics are unused = batch_norm (inference)
// float16 and bfloat16 inputs are cast to float32 first and the results cast back once, as eager computes
// these ops in float32 and rounds only their results. A node is left as it is (it runs through ATen) when
// an argument is computed at run time, a reduced extent is 0 (eager's own errors and empty results stay
// eager's), or a dtype is not floating.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ir/op_table.h"
#include "passes/passes.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

class Rewriter {
 public:
  Rewriter(Graph& g, Node* at) : g_(g), at_(at) {}

  // A new node before the one being rewritten, with one output of the given dtype and sizes (contiguous).
  Value* op(const std::string& schema, std::vector<Arg> args, DType dtype, const std::vector<int64_t>& sizes) {
    TensorType t;
    t.dtype = dtype;
    t.sizes = sizes;
    t.strides = contiguous_strides(sizes);
    const TensorType& like = first_tensor(args);
    t.device = like.device;
    t.device_index = like.device_index;
    ValueType vt;
    vt.tensor = t;
    return g_.insert(at_, schema, std::move(args), {vt})->output();
  }
  Value* unary(const std::string& schema, Value* x) { return op(schema, {Arg::of(x)}, dt(x), sizes(x)); }
  Value* binary(const std::string& schema, Value* a, Value* b, bool alpha = false) {
    std::vector<Arg> args = {Arg::of(a), Arg::of(b)};
    if (alpha) args.push_back(Arg::lit(int64_t{1}));
    return op(schema, std::move(args), promote_types(dt(a), dt(b)), broadcast(sizes(a), sizes(b)));
  }
  Value* sub(Value* a, Value* b) { return binary("aten::sub.Tensor", a, b, true); }
  Value* add(Value* a, Value* b) { return binary("aten::add.Tensor", a, b, true); }
  Value* mul(Value* a, Value* b) { return binary("aten::mul.Tensor", a, b); }
  Value* div(Value* a, Value* b) { return binary("aten::div.Tensor", a, b); }
  Value* add_scalar(Value* a, double s) {
    return op("aten::add.Scalar", {Arg::of(a), Arg::lit(s), Arg::lit(int64_t{1})}, dt(a), sizes(a));
  }
  Value* cast(Value* x, DType to) {
    if (dt(x) == to) return x;
    return op("aten::to.dtype",
              {Arg::of(x), Arg::lit(int64_t{dtype_to_torch_code(to)}), Arg::lit(false), Arg::lit(false), Arg::lit(None{})},
              to, sizes(x));
  }
  // A reduction over `dims` (normalized) of x.
  Value* reduce(const std::string& schema, Value* x, const std::vector<int64_t>& dims, bool keepdim,
                std::optional<double> correction = std::nullopt) {
    std::vector<int64_t> out;
    for (int64_t d = 0; d < static_cast<int64_t>(sizes(x).size()); ++d) {
      bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!reduced) out.push_back(sizes(x)[d]);
      else if (keepdim) out.push_back(1);
    }
    std::vector<Arg> args = {Arg::of(x), Arg::lit(dims)};
    if (schema == "aten::var.correction") {
      args.push_back(Arg::lit(correction.value_or(1.0)));
      args.push_back(Arg::lit(keepdim));
    } else {
      args.push_back(Arg::lit(keepdim));
      if (schema != "aten::amax" && schema != "aten::amin") args.push_back(Arg::lit(None{}));
    }
    return op(schema, std::move(args), dt(x), out);
  }
  Value* reshape(Value* x, const std::vector<int64_t>& to) {
    return op("aten::reshape", {Arg::of(x), Arg::lit(to)}, dt(x), to);
  }

  static DType dt(const Value* v) { return v->tensor_type().dtype; }
  static const std::vector<int64_t>& sizes(const Value* v) { return v->tensor_type().sizes; }

 private:
  static const TensorType& first_tensor(const std::vector<Arg>& args) {
    for (const Arg& a : args)
      if (a.is_value() && a.value->is_tensor()) return a.value->tensor_type();
    FJ_INTERNAL_ASSERT(false, "a decomposition node without a tensor argument");
    static TensorType none;
    return none;
  }
  static std::vector<int64_t> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
      out[out.size() - 1 - i] = x == 1 ? y : x;
    }
    return out;
  }

  Graph& g_;
  Node* at_;
};

// Literal argument i of n (or `dflt` when absent); nullopt when it is computed at run time.
std::optional<Literal> lit(const Node& n, size_t i, Literal dflt = None{}) {
  if (i >= n.args().size()) return dflt;
  if (n.args()[i].is_value()) return std::nullopt;
  return n.args()[i].literal;
}
std::optional<Value*> tensor_or_none(const Node& n, size_t i) {
  if (i >= n.args().size()) return static_cast<Value*>(nullptr);
  const Arg& a = n.args()[i];
  if (a.is_value()) return a.value->is_tensor() ? std::optional<Value*>(a.value) : std::nullopt;
  return std::holds_alternative<None>(a.literal) ? std::optional<Value*>(nullptr) : std::nullopt;
}
std::optional<double> as_double(const std::optional<Literal>& l) {
  if (!l) return std::nullopt;
  if (std::holds_alternative<double>(*l)) return std::get<double>(*l);
  if (std::holds_alternative<int64_t>(*l)) return static_cast<double>(std::get<int64_t>(*l));
  return std::nullopt;
}
std::optional<int64_t> as_dim(const std::optional<Literal>& l, int64_t rank) {
  if (!l || !std::holds_alternative<int64_t>(*l)) return std::nullopt;
  int64_t d = std::get<int64_t>(*l);
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
  if (!x->is_tensor() || !shape || !std::holds_alternative<std::vector<int64_t>>(*shape)) return {};
  const auto& ns = std::get<std::vector<int64_t>>(*shape);
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

// Each rewrite returns the values replacing n's outputs, or an empty vector to leave n alone.
using Outputs = std::vector<Value*>;

Outputs softmax(Graph& g, Node* n, bool log) {
  Value* x = n->args()[0].value;
  if (!single_tensor_output(*n) || !x->is_tensor()) return {};
  auto d = as_dim(lit(*n, 1), std::max<int64_t>(x->tensor_type().dim(), 1));
  if (!d || x->tensor_type().dim() == 0 || !reducible(x, {*d})) return {};
  DType out = n->output()->tensor_type().dtype;
  Rewriter r(g, n);
  Value* xf = r.cast(x, compute_dtype(out));
  Value* m = r.reduce("aten::amax", xf, {*d}, true);
  Value* shifted = r.sub(xf, m);
  Value* e = r.unary("aten::exp", shifted);
  Value* s = r.reduce("aten::sum.dim_IntList", e, {*d}, true);
  Value* y = log ? r.sub(shifted, r.unary("aten::log", s)) : r.div(e, s);
  return {r.cast(y, out)};
}

Outputs logsumexp(Graph& g, Node* n) {
  Value* x = n->args()[0].value;
  auto dl = lit(*n, 1);
  auto keep = lit(*n, 2, false);
  if (!single_tensor_output(*n) || !x->is_tensor() || !dl || !keep || !std::holds_alternative<bool>(*keep)) return {};
  const int64_t rank = x->tensor_type().dim();
  std::vector<int64_t> dims;
  if (std::holds_alternative<int64_t>(*dl)) dims = {std::get<int64_t>(*dl)};
  else if (std::holds_alternative<std::vector<int64_t>>(*dl)) dims = std::get<std::vector<int64_t>>(*dl);
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
  Rewriter r(g, n);
  Value* xf = r.cast(x, compute_dtype(out));
  auto finite_max = [&](bool kd) {
    Value* m = r.reduce("aten::amax", xf, dims, kd);
    Value* inf = r.op("aten::eq.Scalar", {Arg::of(r.unary("aten::abs", m)), Arg::lit(INFINITY)}, DType::kBool,
                      Rewriter::sizes(m));
    return r.op("aten::masked_fill.Scalar", {Arg::of(m), Arg::of(inf), Arg::lit(0.0)}, Rewriter::dt(m),
                Rewriter::sizes(m));
  };
  Value* m = finite_max(true);
  Value* s = r.reduce("aten::sum.dim_IntList", r.unary("aten::exp", r.sub(xf, m)), dims, keepdim);
  Value* y = r.add(r.unary("aten::log", s), keepdim ? m : finite_max(false));
  return {r.cast(y, out)};
}

// layer_norm (outputs: y) and native_layer_norm (y, mean, rstd).
Outputs layer_norm(Graph& g, Node* n, bool native) {
  Value* x = n->args()[0].value;
  auto w = tensor_or_none(*n, 2), b = tensor_or_none(*n, 3);
  auto eps = as_double(lit(*n, 4, 1e-5));
  std::vector<int64_t> dims = normalized_dims(x, lit(*n, 1));
  if (dims.empty() || !w || !b || !eps || n->outputs().size() != (native ? 3u : 1u)) return {};
  DType out = n->output()->tensor_type().dtype;
  Rewriter r(g, n);
  DType ct = compute_dtype(out);
  Value* xf = r.cast(x, ct);
  Value* mean = r.reduce("aten::mean.dim", xf, dims, true);
  Value* var = r.reduce("aten::var.correction", xf, dims, true, 0.0);
  Value* rstd = r.unary("aten::rsqrt", r.add_scalar(var, *eps));
  Value* y = r.mul(r.sub(xf, mean), rstd);
  if (*w) y = r.mul(y, r.cast(*w, ct));
  if (*b) y = r.add(y, r.cast(*b, ct));
  Outputs outs = {r.cast(y, out)};
  if (native) {
    outs.push_back(r.cast(mean, n->output(1)->tensor_type().dtype));
    outs.push_back(r.cast(rstd, n->output(2)->tensor_type().dtype));
  }
  return outs;
}

Outputs rms_norm(Graph& g, Node* n) {
  Value* x = n->args()[0].value;
  auto w = tensor_or_none(*n, 2);
  auto eps_lit = lit(*n, 3);
  std::vector<int64_t> dims = normalized_dims(x, lit(*n, 1));
  if (dims.empty() || !single_tensor_output(*n) || !w || !eps_lit) return {};
  DType xt = x->tensor_type().dtype, ct = compute_dtype(xt);
  double eps = ct == DType::kFloat64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
  if (!std::holds_alternative<None>(*eps_lit)) {
    auto e = as_double(eps_lit);
    if (!e) return {};
    eps = *e;
  }
  Rewriter r(g, n);
  Value* xf = r.cast(x, ct);
  Value* ms = r.reduce("aten::mean.dim", r.mul(xf, xf), dims, true);
  Value* y = r.cast(r.mul(xf, r.unary("aten::rsqrt", r.add_scalar(ms, eps))), xt);
  if (*w) y = r.mul(y, *w);
  return {r.cast(y, n->output()->tensor_type().dtype)};
}

Outputs group_norm(Graph& g, Node* n) {
  Value* x = n->args()[0].value;
  auto groups = lit(*n, 1);
  auto w = tensor_or_none(*n, 2), b = tensor_or_none(*n, 3);
  auto eps = as_double(lit(*n, 4, 1e-5));
  if (!single_tensor_output(*n) || !x->is_tensor() || !groups || !std::holds_alternative<int64_t>(*groups) || !w ||
      !b || !eps)
    return {};
  const TensorType& xt = x->tensor_type();
  const TensorType& ot = n->output()->tensor_type();
  if (xt.dim() < 2 || !xt.is_contiguous() || !ot.is_contiguous() || ot.sizes != xt.sizes) return {};
  const int64_t N = xt.sizes[0], C = xt.sizes[1], G = std::get<int64_t>(*groups);
  if (G <= 0 || C % G != 0 || N == 0) return {};
  int64_t hw = 1;
  for (int64_t d = 2; d < xt.dim(); ++d) hw *= xt.sizes[d];
  for (auto p : {*w, *b})
    if (p && (p->tensor_type().sizes != std::vector<int64_t>{C} || !p->tensor_type().is_contiguous())) return {};
  std::vector<int64_t> view = {N, G, C / G, hw};
  if (!reducible(x, {2, 3}) || C / G * hw == 0) return {};
  DType ct = compute_dtype(ot.dtype);
  Rewriter r(g, n);
  Value* xf = r.cast(r.reshape(x, view), ct);
  Value* mean = r.reduce("aten::mean.dim", xf, {2, 3}, true);
  Value* var = r.reduce("aten::var.correction", xf, {2, 3}, true, 0.0);
  Value* y = r.mul(r.sub(xf, mean), r.unary("aten::rsqrt", r.add_scalar(var, *eps)));
  if (*w) y = r.mul(y, r.cast(r.reshape(*w, {G, C / G, 1}), ct));
  if (*b) y = r.add(y, r.cast(r.reshape(*b, {G, C / G, 1}), ct));
  return {r.reshape(r.cast(y, ot.dtype), xt.sizes)};
}

// std over the same arguments as var.
Outputs std_dev(Graph& g, Node* n, const std::string& var_schema) {
  Value* x = n->args()[0].value;
  if (!single_tensor_output(*n) || !x->is_tensor() || !is_floating(x->tensor_type().dtype)) return {};
  for (const Arg& a : n->args())
    if (a.is_value() && a.value != x) return {};
  DType out = n->output()->tensor_type().dtype;
  Rewriter r(g, n);
  Value* xf = r.cast(x, compute_dtype(out));
  std::vector<Arg> args = n->args();
  args[0] = Arg::of(xf);
  std::vector<int64_t> sizes = n->output()->tensor_type().sizes;
  Value* var = r.op(var_schema, std::move(args), Rewriter::dt(xf), sizes);
  Node* vn = var->producer();
  auto info = reduction_info(*vn);
  for (int64_t d : info ? info->dims : std::vector<int64_t>{})
    if (x->tensor_type().sizes[d] == 0) return {};  // the dead var node goes with DCE
  if (!info) return {};
  return {r.cast(r.unary("aten::sqrt", var), out)};
}

// max.dim / min.dim whose indices nobody uses.
Outputs max_values(Graph& g, Node* n, bool is_max, const std::vector<std::vector<Node*>>& users,
                   const std::vector<Value*>& graph_outputs) {
  if (n->outputs().size() != 2) return {};
  Value* idx = n->output(1);
  if (!users[idx->id()].empty() || std::count(graph_outputs.begin(), graph_outputs.end(), idx)) return {};
  Value* x = n->args()[0].value;
  auto d = as_dim(lit(*n, 1), std::max<int64_t>(x->tensor_type().dim(), 1));
  auto keep = lit(*n, 2, false);
  if (!x->is_tensor() || x->tensor_type().dim() == 0 || !d || !keep || !std::holds_alternative<bool>(*keep) ||
      x->tensor_type().sizes[*d] == 0 || x->tensor_type().dtype == DType::kBool)
    return {};
  Rewriter r(g, n);
  return {r.reduce(is_max ? "aten::amax" : "aten::amin", x, {*d}, std::get<bool>(*keep)), nullptr};
}

// _native_batch_norm_legit_no_training (what AOT autograd makes of an inference batch_norm) whose saved
// mean and rstd nobody uses: batch_norm in inference mode, an elementwise op of the table.
Outputs batch_norm_inference(Graph& g, Node* n, const std::vector<std::vector<Node*>>& users,
                             const std::vector<Value*>& graph_outputs) {
  if (n->outputs().size() != 3 || n->args().size() != 7) return {};
  for (int i = 1; i < 3; ++i)
    if (!users[n->output(i)->id()].empty() || std::count(graph_outputs.begin(), graph_outputs.end(), n->output(i)))
      return {};
  const auto& a = n->args();
  std::vector<Arg> args = {a[0], a[1], a[2], a[3], a[4], Arg::lit(false), a[5], a[6], Arg::lit(true)};
  Value* y = g.insert(n, "aten::batch_norm", std::move(args), {n->output(0)->type()})->output();
  return {y, nullptr, nullptr};
}

}  // namespace

bool decompose(Graph& g) {
  bool changed = false;
  auto users = g.users();
  for (Node* n : g.nodes()) {
    const std::string& s = n->schema();
    if (n->side_effects() || n->args().empty() || !n->args()[0].is_value()) continue;
    Outputs outs;
    if (s == "aten::softmax.int" || s == "aten::_softmax") outs = softmax(g, n, false);
    else if (s == "aten::log_softmax.int" || s == "aten::_log_softmax") outs = softmax(g, n, true);
    else if (s == "aten::logsumexp") outs = logsumexp(g, n);
    else if (s == "aten::layer_norm") outs = layer_norm(g, n, false);
    else if (s == "aten::native_layer_norm") outs = layer_norm(g, n, true);
    else if (s == "aten::rms_norm") outs = rms_norm(g, n);
    else if (s == "aten::group_norm") outs = group_norm(g, n);
    else if (s == "aten::std.correction") outs = std_dev(g, n, "aten::var.correction");
    else if (s == "aten::std.dim") outs = std_dev(g, n, "aten::var.dim");
    else if (s == "aten::std") outs = std_dev(g, n, "aten::var");
    else if (s == "aten::max.dim" || s == "aten::min.dim") outs = max_values(g, n, s == "aten::max.dim", users, g.outputs());
    else if (s == "aten::_native_batch_norm_legit_no_training") outs = batch_norm_inference(g, n, users, g.outputs());
    if (outs.empty()) continue;
    // _softmax's half_to_float (a float32 result of a float16 input) is the output's dtype, already honoured.
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i]) continue;
      Value* o = n->output(i);
      FJ_INTERNAL_ASSERT(outs[i]->tensor_type().sizes == o->tensor_type().sizes &&
                             outs[i]->tensor_type().dtype == o->tensor_type().dtype,
                         "decomposition of {} gives {} for {}", s, outs[i]->tensor_type().str(), o->tensor_type().str());
      // The replacement takes the original's layout, which eager's output has.
      outs[i]->mutable_type().tensor->strides = o->tensor_type().strides;
      g.replace_all_uses(o, outs[i]);
    }
    changed = true;
  }
  if (changed) dce(g);
  return changed;
}

}  // namespace fusion_jit
