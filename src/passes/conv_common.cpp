// What the rule sets around convolutions and linears share (passes/conv_common.h, Note [Convolution rules]).
#include "passes/conv_common.h"

#include <fmt/format.h>

#include <utility>

#include "support/options.h"

namespace fusion_jit {
namespace conv_rules {

bool (*g_schema_probe)(const std::string&) = nullptr;

namespace {

bool (*g_onednn_bf16_probe)() = nullptr;

// FUSION_JIT_ENABLE=onednn_nchw (Note [Convolution rules], "Layout").
[[maybe_unused]] const bool kOnednnNchwName = (Options::register_enable_names({"onednn_nchw"}), true);
// FUSION_JIT_DISABLE=conv_timing (Note [Convolutions timed on this machine]).
[[maybe_unused]] const bool kConvTimingName = (Options::register_disable_names({"conv_timing"}), true);

ConvProbe g_conv_probe = nullptr;

std::optional<std::vector<int64_t>> int_list(const Arg& a) {
  if (a.is_value() || !std::holds_alternative<SymSizes>(a.literal)) return std::nullopt;
  return std::get<SymSizes>(a.literal);
}

// Contiguous (NCHW) or channels-last (NHWC), the strides of size-1 dims aside.
bool contiguous_or_channels_last(const TensorType& t) {
  return t.dim() == 4 && (same_strides(t, contiguous_strides(t.sizes)) || is_channels_last(t));
}

// A literal number argument of `n` (absent: `fallback`), or nullopt for a value.
std::optional<double> number_arg(const Node* n, size_t i, double fallback) {
  return as_double(literal_arg(i < n->args().size() ? &n->args()[i] : nullptr, fallback));
}

}  // namespace

std::string onednn_refuses(DType t) {
  if (t != DType::kBFloat16 || !g_onednn_bf16_probe || g_onednn_bf16_probe()) return "";
  return "oneDNN takes no bfloat16 on this CPU (it needs AVX512BW, AVX512VL and AVX512DQ, or AVX-NE-CONVERT)";
}

bool is_constant(const Value* v) { return v && v->producer() && v->producer()->is_constant(); }

bool is_literal(const Arg& a, const Literal& l) { return !a.is_value() && a.literal == l; }

bool frozen(const Value* v, int depth) {
  if (is_constant(v)) return true;
  const Node* n = v ? v->producer() : nullptr;
  if (!n || depth == 0 || n->side_effects()) return false;
  for (const Value* in : n->value_inputs())
    if (!frozen(in, depth - 1)) return false;
  return true;
}

std::optional<Conv> as_conv(Node* n) {
  const auto& a = n->args();
  const bool conv2d = n->schema() == "aten::conv2d";
  if (a.size() != (conv2d ? 7u : 9u)) return std::nullopt;
  Conv c;
  c.node = n;
  if (!a[0].is_value() || !a[0].value->is_tensor() || !a[1].is_value() || !a[1].value->is_tensor()) return std::nullopt;
  c.x = a[0].value;
  c.weight = a[1].value;
  if (a[2].is_value()) {
    if (!a[2].value->is_tensor()) return std::nullopt;
    c.bias = a[2].value;
  } else if (!std::holds_alternative<None>(a[2].literal)) {
    return std::nullopt;
  }
  auto stride = int_list(a[3]), padding = int_list(a[4]), dilation = int_list(a[5]);
  if (!stride || !padding || !dilation) return std::nullopt;
  c.stride = *stride;
  c.padding = *padding;
  c.dilation = *dilation;
  const Arg& groups = a[conv2d ? 6 : 8];
  if (!conv2d && !is_literal(a[6], false)) return std::nullopt;  // transposed
  if (groups.is_value() || !std::holds_alternative<SymInt>(groups.literal)) return std::nullopt;
  c.groups = std::get<SymInt>(groups.literal);
  return c;
}

std::optional<ConvShape> conv_shape(const Conv& conv) {
  const TensorType& x = conv.x->tensor_type();
  const TensorType& w = conv.weight->tensor_type();
  if (x.dim() != 4 || w.dim() != 4 || conv.stride.size() != 2 || conv.padding.size() != 2 || conv.dilation.size() != 2)
    return std::nullopt;
  ConvShape s;
  for (const SymInt& d : x.sizes) s.x.push_back(d.hint());  // a shape class's convolution at its hint
  for (const SymInt& d : w.sizes) {
    if (d.is_symbolic()) return std::nullopt;
    s.w.push_back(d);
  }
  s.stride = conv.stride;
  s.padding = conv.padding;
  s.dilation = conv.dilation;
  s.groups = conv.groups;
  s.dtype = x.dtype;
  s.bias = conv.bias != nullptr;
  return s;
}

bool is_channels_last(const TensorType& t) { return t.dim() == 4 && same_strides(t, channels_last_strides(t.sizes)); }

bool onednn_conv(const Conv& conv, const Value* result, std::string* why) {
  const TensorType& x = conv.x->tensor_type();
  const TensorType& y = result->tensor_type();
  if (x.device != Device::kCPU || x.dim() != 4 || conv.weight->tensor_type().dim() != 4) return false;
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kBFloat16) return false;
  if (conv.weight->tensor_type().dtype != x.dtype || y.dtype != x.dtype) return false;
  if (const std::string no = onednn_refuses(x.dtype); !no.empty()) {
    if (why) *why = no;
    return false;
  }
  if (conv.bias && conv.bias->tensor_type().dtype != x.dtype) return false;
  if (!contiguous_or_channels_last(x) || !contiguous_or_channels_last(y)) return false;
  if (x.sym_extent() == 0 || y.sym_extent() == 0) return false;
  for (const auto* l : {&conv.stride, &conv.padding, &conv.dilation})
    if (l->size() != 2) return false;
  // A weight given at each call would be reordered at each call: slower than eager's convolution.
  if (!frozen(conv.weight) || (conv.bias && !frozen(conv.bias))) return false;
  // An NCHW result would be copied back from oneDNN's channels-last one: only when asked for.
  if (!is_channels_last(y) && !Options::get().is_enabled("onednn_nchw")) {
    if (why)
      *why = "the result is NCHW: oneDNN's channels-last result copied back was slower here than eager's "
             "convolution and our kernel (FUSION_JIT_ENABLE=onednn_nchw takes it)";
    return false;
  }
  return true;
}

Value* onednn_call(Builder& r, const Conv& conv, const Value* out, const std::string& schema, Value* other,
                   std::vector<Arg> post) {
  // The input size hint with the batch by octave (oneDNN's layout and times did not change within one on
  // the shapes measured): the batch sizes of a served model share the folded weight (Note [Folded
  // constants shared across signatures], torch/executor.h).
  // (At a shape class's hint for the batch: a choice of layout, which computes the same for any batch.)
  const SymSizes& xs = conv.x->tensor_type().sizes;
  std::vector<int64_t> hint;
  for (size_t d = 0; d < xs.size(); ++d) hint.push_back(d == 0 ? size_octave(xs[0].hint()) : int64_t{xs[d]});
  Value* packed = r.node("mkldnn::_reorder_convolution_weight",
                         {Arg::of(conv.weight), Arg::lit(conv.padding), Arg::lit(conv.stride), Arg::lit(conv.dilation),
                          Arg::lit(conv.groups), Arg::lit(hint)},
                         {conv.weight->type()})
                      ->output();
  std::vector<Arg> args = {Arg::of(conv.x)};
  if (other) args.push_back(Arg::of(other));
  for (Arg a : {Arg::of(packed), conv.bias ? Arg::of(conv.bias) : Arg::lit(None{}), Arg::lit(conv.padding),
                Arg::lit(conv.stride), Arg::lit(conv.dilation), Arg::lit(conv.groups)})
    args.push_back(std::move(a));
  for (Arg& a : post) args.push_back(std::move(a));
  if (is_channels_last(out->tensor_type())) return r.node(schema, std::move(args), {out->type()})->output();
  ValueType channels_last = out->type();
  const auto& sz = out->tensor_type().sizes;  // [N, C, H, W]
  channels_last.tensor->strides = channels_last_strides(sz);
  Value* y = r.node(schema, std::move(args), {channels_last})->output();
  return r.op("aten::contiguous", {Arg::of(y), Arg::lit(int64_t{0})}, out->tensor_type().dtype, sz);
}

std::optional<std::vector<Arg>> post_op_args(const Node* act, const char* attr) {
  Arg algorithm = Arg::lit(None{});
  std::vector<double> scalars;
  const std::string a = attr;
  if (a == "gelu") {
    const auto& ga = act->args();
    std::string approximate = "none";
    if (ga.size() > 1) {
      if (ga[1].is_value() || !std::holds_alternative<std::string>(ga[1].literal)) return std::nullopt;
      approximate = std::get<std::string>(ga[1].literal);
    }
    if (approximate != "none" && approximate != "tanh") return std::nullopt;
    algorithm = Arg::lit(approximate);
  } else if (a == "leaky_relu") {
    auto slope = number_arg(act, 1, 0.01);
    if (!slope) return std::nullopt;
    scalars = {*slope};
  } else if (a == "hardtanh" && act->schema() == "aten::relu6") {
    scalars = {0.0, 6.0};
  } else if (a == "hardtanh") {
    auto lo = number_arg(act, 1, -1.0), hi = number_arg(act, 2, 1.0);
    if (!lo || !hi || *lo > *hi) return std::nullopt;
    scalars = {*lo, *hi};
  }
  Arg scalar_list = scalars.empty() ? Arg::lit(std::vector<int64_t>{}) : Arg::lit(scalars);
  return std::vector<Arg>{Arg::lit(std::string(attr)), scalar_list, algorithm};
}

Pattern conv_output() {
  return Pattern::op({"aten::conv2d", "aten::convolution"}).single_use().bind("conv");
}

// ---- Linear (Note [Convolution rules], epilogue.linear_<act> and prepack.linear) ----

std::optional<Linear> as_linear(Node* n) {
  const auto& a = n->args();
  auto tensor = [](const Arg& x) { return x.is_value() && x.value->is_tensor() ? x.value : nullptr; };
  Linear l;
  l.node = n;
  if (n->schema() == "aten::linear" && a.size() == 3) {
    l.x = tensor(a[0]);
    l.weight = tensor(a[1]);
    if (a[2].is_value()) {
      if (!(l.bias = tensor(a[2]))) return std::nullopt;
    } else if (!std::holds_alternative<None>(a[2].literal)) {
      return std::nullopt;
    }
  } else if (n->schema() == "aten::addmm" && a.size() == 5) {
    for (size_t i : {3u, 4u})
      if (!is_literal(a[i], int64_t{1}) && !is_literal(a[i], 1.0)) return std::nullopt;
    l.bias = tensor(a[0]);
    l.x = tensor(a[1]);
    l.weight_t = tensor(a[2]);
    // t(W) of a frozen W (the lowering's form): W itself.
    if (l.weight_t && l.weight_t->producer() && l.weight_t->producer()->schema() == "aten::t")
      l.weight = l.weight_t->producer()->value_inputs().at(0);
    if (!l.bias || l.bias->tensor_type().dim() != 1) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!l.x || (!l.weight && !l.weight_t)) return std::nullopt;
  return l;
}

bool packable_linear(const Linear& l, const Value* y) {
  const TensorType& x = l.x->tensor_type();
  const Value* w = l.weight ? l.weight : l.weight_t;
  const TensorType& wt = w->tensor_type();
  const TensorType& yt = y->tensor_type();
  if (x.device != Device::kCPU || x.dim() < 2 || wt.dim() != 2) return false;
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kBFloat16) return false;
  if (wt.dtype != x.dtype || yt.dtype != x.dtype || (l.bias && l.bias->tensor_type().dtype != x.dtype)) return false;
  if (!same_strides(yt, contiguous_strides(yt.sizes)) || yt.sym_extent() == 0) return false;
  const int64_t k = x.sizes.back(), n = l.weight ? wt.sizes[0] : wt.sizes[1];
  if ((l.weight ? wt.sizes[1] : wt.sizes[0]) != k || (l.bias && l.bias->tensor_type().sizes != std::vector<int64_t>{n}))
    return false;
  return frozen(w) && (!l.bias || frozen(l.bias));
}

bool onednn_linear(const Linear& l, const Value* y, std::string* why) {
  if (!packable_linear(l, y)) return false;
  if (const std::string no = onednn_refuses(l.x->tensor_type().dtype); !no.empty()) {
    if (why) *why = no;
    return false;
  }
  const TensorType& x = l.x->tensor_type();
  const int64_t n = y->tensor_type().sizes.back();
  // (At a shape class's hint: a choice of speed.)
  const double macs = static_cast<double>(x.sym_extent().hint()) * static_cast<double>(n);
  if (macs < kLinearMinMacs) {
    if (why)
      *why = fmt::format("{:.0f} multiply-adds, under the 2^21 from which oneDNN's call beats ATen's GEMM and our "
                         "kernel",
                         macs);
    return false;
  }
  return true;
}

int64_t rows_at_hint(const TensorType& x) {
  return x.sym_extent().hint() / std::max<int64_t>(1, x.sizes.back().hint());
}

Value* linear_weight(Builder& r, const Linear& l) {
  if (l.weight) return l.weight;
  const TensorType& t = l.weight_t->tensor_type();
  return r.op("aten::t", {Arg::of(l.weight_t)}, t.dtype, {t.sizes[1], t.sizes[0]});
}

Value* onednn_linear_call(Builder& r, const Linear& l, const Value* out, std::vector<Arg> post) {
  const TensorType& x = l.x->tensor_type();
  Value* w = linear_weight(r, l);
  // The batch-size hint by octave (the layout oneDNN picks did not change within one on the suite's shapes):
  // the signatures of a dynamic dimension fold the same step and share its result (Note [Folded constants
  // shared across signatures], torch/executor.h).
  const int64_t rows = size_octave(rows_at_hint(x));
  Value* packed = r.node("mkldnn::_reorder_linear_weight", {Arg::of(w), Arg::lit(rows)}, {w->type()})->output();
  std::vector<Arg> args = {Arg::of(l.x), Arg::of(packed), l.bias ? Arg::of(l.bias) : Arg::lit(None{})};
  for (Arg& a : post) args.push_back(std::move(a));
  const TensorType& lt = l.node->output()->tensor_type();
  Value* y = r.op("mkldnn::_linear_pointwise", std::move(args), lt.dtype, lt.sizes);
  return lt.sizes == out->tensor_type().sizes ? y : r.reshape(y, out->tensor_type().sizes);
}

Value* read_alone_by(const Match& m, const Builder& r) {
  auto only_use = [&r](const Value* v) { return v->producer() && r.users(v).size() == 1 && !r.returned(v); };
  Value* in = m.value("in");
  if (only_use(in) && (in->producer()->schema() == "aten::view" || in->producer()->schema() == "aten::reshape"))
    in = in->producer()->value_inputs().at(0);
  return only_use(in) ? in : nullptr;
}

std::optional<Linear> linear_read_by(const Match& m, const Builder& r, Value** result) {
  Value* in = read_alone_by(m, r);
  if (!in) return std::nullopt;
  *result = in;
  return as_linear(in->producer());
}

}  // namespace conv_rules

ConvProbe set_conv_probe(ConvProbe probe) { return std::exchange(conv_rules::g_conv_probe, probe); }

std::optional<ConvTiming> conv_timing(const ConvShape& shape) {
  if (!conv_rules::g_conv_probe) return std::nullopt;
  if (shape.dtype != DType::kFloat32 && shape.dtype != DType::kBFloat16) return std::nullopt;
  return conv_rules::g_conv_probe(shape);
}

int64_t size_octave(int64_t n) {
  int64_t octave = 1;
  while (octave < n && octave <= (int64_t{1} << 61)) octave *= 2;
  return octave;
}

void set_schema_probe(bool (*probe)(const std::string& schema)) { conv_rules::g_schema_probe = probe; }
void set_onednn_bf16_probe(bool (*probe)()) { conv_rules::g_onednn_bf16_probe = probe; }

}  // namespace fusion_jit
