// The rule set "gemm" and the measurement it is named after (Note [GEMM backend measured on this
// machine], below): which GEMM library a float32 CPU linear takes, asked by the gemm, prepack and
// epilogue rules (onednn_gemm_chosen, passes/conv_common.h).
//
// Note [GEMM backend measured on this machine]
// A float32 CPU linear whose weight comes with each call (torch.compile's graphs without freezing, where
// the weight is a graph input; frozen weights: Note [Convolution rules]) runs either through ATen's GEMM (addmm:
// MKL's sgemm in torch's builds) or through oneDNN's matmul on the plain weight
// (mkldnn::_linear_pointwise, which also applies an activation as a post-op). Which is faster depends on
// the machine: on this project's Intel Xeon VMs MKL's sgemm beat oneDNN (prepack.linear_mkl in Note [Convolution
// rules]), while on its AMD EPYC VMs (AVX-512) it took 1.05-1.4x oneDNN's time on most of convnext_tiny's and ViT's
// linear shapes and 0.85x on one (bench/gemm_shapes.py, bench/RESULTS.md), and DeiT's small ones were even.
// So the rule set "gemm" measures: the torch adapter times both calls
// on random tensors of the linear's shape, alternating (gemm_choice.cpp), and a linear becomes oneDNN's
// where its median is under kGemmMargin of ATen's (FUSION_JIT_GEMM=measure, the default), once per shape and
// thread count per process; `aten` never, `onednn` always (tests, comparisons). The rows are timed at the
// next power of two (size_octave), and the bounds below apply to that count: one decision per octave
// of rows. A served model sees new row counts (batch x sequence length) in nearly every request; timed at
// its exact rows, each new length cost a measurement (about 40 ms for a 512-1024-512 MLP) and could
// take the other library where the two were near a tie, which changes the plan's kernels (an activation
// as oneDNN's post-op or in our kernel) and compiles them again. On the suite's linear shapes the ratio at
// the next power of two was within 0.08 of the ratio at the exact rows (bench/RESULTS.md).
// - gemm.linear: aten::linear(x, W, b), or torch.compile's addmm(b, x, t(W)) with beta and alpha 1, as
//   mkldnn::_linear_pointwise(x, W, b, "none"). CPU, float32, x, W [N, K] and the result contiguous, bias
//   [N] or none, from 2^21 (kLinearMinMacs) to 2^33 (kGemmMaxMacs) multiply-adds: larger ones are not
//   timed at plan build (the measurement would take seconds), and stay ATen's.
// - gemm.linear_<act> (the activations of epilogue.linear_<act>): an activation over such a call with no
//   post-op (or over a view of it), the call used there only, becomes the call with the activation as its
//   post-op: one pass over the result instead of the GEMM's and our kernel's. The measurement is of the
//   GEMM alone; the post-op only takes a pass away. Checked against eager in every activation.
// - Frozen weights (the rules above) take the same measurement between their two prepared forms: MKL's
//   packed GEMM (prepack.linear_mkl, the default for a float32 linear without post-op) against oneDNN's
//   reordered weight (prepack.linear), each weight prepared once outside the timing. prepack.linear_mkl
//   declines, with the times, where oneDNN's was faster by the same margin, and epilogue.linear_gelu then
//   takes a float32 gelu as oneDNN's post-op instead of declining for MKL's GEMM and our kernel.
//   FUSION_JIT_GEMM=aten keeps MKL's, onednn takes oneDNN's (in the timed sizes).
// The results are oneDNN's sums in another blocking than MKL's (float32 accumulation in both), within the
// tolerance rule.
#include <fmt/format.h>

#include <utility>

#include "passes/conv_common.h"
#include "support/options.h"

namespace fusion_jit {
namespace conv_rules {
namespace {

GemmProbe g_gemm_probe = nullptr;
// Larger linears are not timed at plan build: their measurement would take seconds.
constexpr double kGemmMaxMacs = 8589934592.0;  // 2^33
// oneDNN's median time must be under this share of MKL's: near ties keep the rule's default.
constexpr double kGemmMargin = 0.95;

// ---- Linears whose weight comes with each call (Note [GEMM backend measured on this machine]) ----

bool dense(const TensorType& t) { return same_strides(t, contiguous_strides(t.sizes)); }

// gemm.linear: a float32 CPU linear on a plain weight -> mkldnn::_linear_pointwise(x, W, b, "none") where
// oneDNN's GEMM is faster on this machine.
Replacement gemm_linear(const Match& m, Builder& r) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_linear_pointwise")) return {};
  auto l = as_linear(m.root);
  if (!l || !l->weight) return {};
  const TensorType& x = l->x->tensor_type();
  const TensorType& w = l->weight->tensor_type();
  const TensorType& y = m.root->output()->tensor_type();
  if (x.device != Device::kCPU || x.dtype != DType::kFloat32 || w.dtype != x.dtype || y.dtype != x.dtype) return {};
  if (x.dim() < 2 || w.dim() != 2 || y.sym_extent() == 0 || !dense(x) || !dense(w) || !dense(y)) return {};
  const int64_t k = x.sizes.back(), n = w.sizes[0];
  if (w.sizes[1] != k || y.sizes.back() != n) return {};
  if (l->bias) {
    const TensorType& b = l->bias->tensor_type();
    if (b.dtype != x.dtype || b.sizes != std::vector<int64_t>{n} || !dense(b)) return {};
  }
  std::string why;
  const std::optional<bool> onednn = onednn_gemm_chosen(rows_at_hint(x), k, n, l->bias != nullptr, false, &why);
  if (!onednn) return {};
  if (!*onednn) return why.empty() ? Replacement{} : r.decline(why);
  return {r.op("mkldnn::_linear_pointwise",
               {Arg::of(l->x), Arg::of(l->weight), l->bias ? Arg::of(l->bias) : Arg::lit(None{}),
                Arg::lit(std::string("none")), Arg::lit(std::vector<int64_t>{}), Arg::lit(None{})},
               y.dtype, y.sizes)};
}

// gemm.linear_<act>: act(call) or act(view(call)), where call is gemm.linear's (a plain weight, no post-op)
// used there only -> the call with the activation as its post-op, viewed as the activation's input was.
Replacement gemm_linear_activation(const Match& m, Builder& r, const char* attr) {
  Node* act = m.root;
  Value* in = read_alone_by(m, r);
  if (!in || in->producer()->schema() != "mkldnn::_linear_pointwise") return {};
  const Node* call = in->producer();
  const auto& a = call->args();
  if (a.size() != 6 || !is_literal(a[3], std::string("none")) || !a[1].is_value()) return {};
  // The plain weight: a reordered one is prepack.linear's, whose activation epilogue.linear_<act> decided.
  if (const Node* w = a[1].value->producer(); w && is_prepack(w->schema())) return {};
  const TensorType& out = act->output()->tensor_type();
  if (!dense(out) || out.dtype != in->tensor_type().dtype) return {};
  auto post = post_op_args(act, attr);
  if (!post) return {};
  std::vector<Arg> args = {a[0], a[1], a[2]};
  for (Arg& p : *post) args.push_back(std::move(p));
  const TensorType& lt = in->tensor_type();
  Value* y = r.op("mkldnn::_linear_pointwise", std::move(args), lt.dtype, lt.sizes);
  return {lt.sizes == out.sizes ? y : r.reshape(y, out.sizes)};
}

RuleSet make_gemm_rules() {
  RuleSet set{"gemm", {{"linear", Pattern::op({"aten::linear", "aten::addmm"}), gemm_linear}}};
  for (const Act& a : kActs) {
    const char* attr = a.attr;
    set.rules.push_back({std::string("linear") + (a.rule + 4),  // conv_relu -> linear_relu
                         Pattern::op({a.schema}, {Pattern::tensor().bind("in")}).outputs(1),
                         [attr](const Match& m, Builder& b) { return gemm_linear_activation(m, b, attr); }});
  }
  return set;
}

}  // namespace

std::optional<bool> onednn_gemm_chosen(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked,
                                       std::string* why) {
  // Decided for the octave of rows (Note [GEMM backend measured on this machine]).
  const int64_t timed = size_octave(rows);
  const double macs = static_cast<double>(timed) * static_cast<double>(k) * static_cast<double>(n);
  if (macs < kLinearMinMacs || macs > kGemmMaxMacs) return std::nullopt;
  switch (Options::get().gemm) {
    case GemmChoice::kAten:
      return false;
    case GemmChoice::kOneDnn:
      return true;
    case GemmChoice::kMeasure:
      break;
  }
  const std::optional<GemmTiming> t = g_gemm_probe ? g_gemm_probe(timed, k, n, bias, prepacked) : std::nullopt;
  if (!t) return std::nullopt;
  *why = fmt::format("[{}, {}] x [{}, {}]{}: {} {:.0f} us, oneDNN's {:.0f} us on this machine", rows, k, k, n,
                     timed == rows ? std::string() : fmt::format(" (timed at [{}, {}])", timed, k),
                     prepacked ? "MKL's packed GEMM" : "ATen's GEMM", t->mkl_us, t->onednn_us);
  return t->onednn_us < kGemmMargin * t->mkl_us;
}

}  // namespace conv_rules

GemmProbe set_gemm_probe(GemmProbe probe) { return std::exchange(conv_rules::g_gemm_probe, probe); }

const RuleSet& gemm_rules() {
  static const RuleSet set = conv_rules::make_gemm_rules();
  return set;
}

}  // namespace fusion_jit
