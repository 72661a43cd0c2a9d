// The oracle: recipes run fused, in one plan per batch (or through compile() for in-place ops), and each
// output judged against eager's by the tolerance rule, the float64 reference and the ulps that the
// amplifications on its way allow (Note [The fuzzer's oracle and ill-conditioned cases]).
#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>
#include <fmt/format.h>

#include <optional>
#include <set>

#include "fuzz/fuzz_internal.h"
#include "fusion_jit/fusion_jit.h"
#include "ir/op_table.h"
#include "passes/passes.h"
#include "support/options.h"
#include "torch/executor.h"
#include "torch/session.h"
#include "torch/tolerance.h"

namespace fusion_jit::fuzz {

namespace {
// |a - b| <= n ulps of the dtype at max(|a|, |b|), elementwise (equal infinities pass). The fuzzer accepts
// this for values computed through transcendental functions: two correct 1-ulp libraries differ by a few
// ulps, and in float16/bfloat16 every intermediate rounding can turn that into a whole ulp of the result.
// `n` is a number or a tensor of them, per element.
bool within_ulps(const at::Tensor& a, const at::Tensor& b, const at::Tensor& n, double eps) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  at::Tensor ok = at::logical_or((x - y).abs().le(n * eps * at::maximum(x.abs(), y.abs()) + 1e-30), x.eq(y));
  return at::logical_or(ok, at::logical_and(x.isnan(), y.isnan())).all().item<bool>();
}

// |x f'(x) / f(x)| of a unary transcendental op at x (float64), or undefined for other ops.
at::Tensor condition_number(const std::string& fn, const at::Tensor& x) {
  if (fn == "exp" || fn == "sinh") return x.abs();
  if (fn == "exp2") return x.abs() * 0.6931471805599453;
  if (fn == "expm1") return (x * x.exp() / x.expm1()).abs();
  if (fn == "log" || fn == "log2") return x.log().abs().reciprocal();
  if (fn == "log1p") return (x / ((1 + x) * x.log1p())).abs();
  if (fn == "sin") return (x * x.cos() / x.sin()).abs();
  if (fn == "cos") return (x * x.sin() / x.cos()).abs();
  if (fn == "tan") return (x / (x.sin() * x.cos())).abs();
  if (fn == "tanh") return (x * (1 - x.tanh().square()) / x.tanh()).abs();
  if (fn == "sigmoid") return (x * (1 - x.sigmoid())).abs();
  if (fn == "erf") return (x * 1.1283791670955126 * (-x.square()).exp() / x.erf()).abs();
  if (fn == "silu" || fn == "mish" || fn == "softplus" || fn == "elu") return (x.abs() + 1);  // loose bounds
  return at::Tensor();
}

// Per element of each value of a replay, how much the cancellations on its way amplified the ulps by
// which two correct libraries' operands may differ: a sum (add, sub, rsub, addcmul, addcdiv, lerp,
// batch_norm) with an inexact operand multiplies it by |its largest summand| / |its result|, gelu by
// 1 / (1 + erf(x / sqrt 2)), a transcendental function by its condition number (condition_number);
// other ops pass on the largest amplification of their float operands. Undefined: 1.
// See Note [The fuzzer's oracle and ill-conditioned cases].
std::vector<at::Tensor> amplifications(const Recipe& r, const Replay& rp) {
  std::vector<at::Tensor> amp(rp.values.size());
  size_t n_in = r.inputs.size();
  for (size_t j = 0; j < r.ops.size(); ++j) {
    const at::Tensor& res = rp.values.at(n_in + j);
    const std::string& schema = r.ops[j].schema;
    if (is_structural_schema(schema)) {
      // Reductions, views, random ops: the largest amplification of the input, times the op's own.
      if (!at::isFloatingType(res.scalar_type()) || res.numel() == 0 || r.ops[j].args.empty() || r.ops[j].args[0].value < 0)
        continue;
      std::vector<c10::IValue> args;
      for (const auto& arg : r.ops[j].args)
        args.push_back(arg.value >= 0 ? c10::IValue(rp.values.at(static_cast<size_t>(arg.value))) : literal_to_ivalue(arg.literal));
      const at::Tensor& in_amp = amp[static_cast<size_t>(r.ops[j].args[0].value)];
      at::Tensor a = in_amp.defined() && in_amp.numel() ? in_amp.max().expand(res.sizes()) : at::Tensor();
      if (is_cat_schema(schema)) {
        // The largest of the items'.
        for (const auto& arg : r.ops[j].args) {
          if (arg.value < 0) continue;
          const at::Tensor& ia = amp[static_cast<size_t>(arg.value)];
          if (!ia.defined() || !ia.numel()) continue;
          at::Tensor m = ia.max().expand(res.sizes());
          a = a.defined() ? at::maximum(a, m) : m;
        }
        amp[n_in + j] = a;
        continue;
      }
      if (is_random_schema(schema) && schema != "aten::dropout") a = at::Tensor();
      at::Tensor local = structural_local_amp(schema, args, res);
      if (local.defined()) a = a.defined() ? a * local : local;
      amp[n_in + j] = a;
      continue;
    }
    std::string base = inplace_base(schema);
    const OpInfo* info = find_op(base.empty() ? schema : base);
    if (!info || !at::isFloatingType(res.scalar_type()) || res.numel() == 0) continue;
    at::Tensor a;
    std::vector<at::Tensor> float_args;
    bool inexact_arg = false;
    for (const auto& arg : r.ops[j].args) {
      if (arg.value < 0) continue;
      size_t v = static_cast<size_t>(arg.value);
      const at::Tensor& t = rp.values.at(v);
      if (!at::isFloatingType(t.scalar_type())) continue;
      // Arguments that only lend their dtype (type_as's second) need not broadcast to the result.
      bool broadcasts = t.dim() <= res.dim();
      for (int64_t d = 1; d <= t.dim() && broadcasts; ++d)
        broadcasts = t.size(-d) == 1 || t.size(-d) == res.size(-d);
      if (!broadcasts) continue;
      float_args.push_back(t.to(at::kDouble));
      inexact_arg = inexact_arg || (rp.flags.at(v) & kInexact);
      if (amp[v].defined()) a = a.defined() ? at::maximum(a, amp[v].expand_as(res)) : amp[v].expand_as(res);
    }
    const std::string& fn = info->kernel_fn;
    // A transcendental function of an inexact argument multiplies the argument's relative error by its
    // condition number |x f'(x) / f(x)| and adds its own few ulps: exp(exp(x)) with x near 2.7 turns
    // 4 ulps of the inner exp into 11 of the outer.
    at::Tensor kappa = inexact_arg && float_args.size() == 1 ? condition_number(fn, float_args[0]) : at::Tensor();
    if (kappa.defined()) {
      kappa = at::where(kappa.isfinite(), kappa, at::ones_like(kappa)).expand_as(res);
      a = 1.0 + kappa * (a.defined() ? a : at::ones_like(kappa));
    }
    at::Tensor local;
    if (inexact_arg && in_set(fn, {"add", "sub", "rsub", "addcmul", "addcdiv", "lerp", "batch_norm"})) {
      std::vector<c10::IValue> args;
      for (const auto& arg : r.ops[j].args)
        args.push_back(arg.value >= 0 ? c10::IValue(rp.values.at(static_cast<size_t>(arg.value))) : literal_to_ivalue(arg.literal));
      at::Tensor big = at::zeros(res.sizes(), res.options().dtype(at::kDouble));
      for (const auto& t : summands(fn, args)) big = at::maximum(big, at::where(t.isnan(), at::zeros_like(t), t).expand_as(big));
      local = big / res.to(at::kDouble).abs();
    } else if (fn == "gelu" && !float_args.empty()) {
      local = at::erfc(float_args[0] * -0.70710678118654752440).reciprocal();
    }
    if (local.defined()) {
      local = at::where(local.isfinite(), local, at::ones_like(local)).clamp_min(1.0);  // 0 / 0, x / 0: 1
      a = a.defined() ? a * local : local;
    }
    amp[n_in + j] = a;
  }
  return amp;
}
}  // namespace

at::Tensor to_device_same_layout(const at::Tensor& t, const at::Device& device) {
  int64_t n = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  at::Tensor base = at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
  return base.to(device).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

CaseResult judge(const Recipe& recipe, const std::vector<at::Tensor>& inputs, const Replay& eager_rp,
                 const std::vector<at::Tensor>& fused, size_t first) {
  std::vector<at::Tensor> amp = amplifications(recipe, eager_rp);
  std::vector<at::Tensor> ref;
  for (size_t i = 0; i < recipe.outputs.size(); ++i) {
    size_t o = static_cast<size_t>(recipe.outputs[i]);
    const at::Tensor& f = fused.at(first + i);
    const at::Tensor& e = eager_rp.values.at(o);
    auto c = check_close(f, e);
    if (!c.ok && at::isFloatingType(f.scalar_type()) && c.message.find("values differ") != std::string::npos) {
      if (ref.empty()) {
        Replay r64;
        if (replay(recipe, inputs, true, nullptr, &r64, &eager_rp))
          for (int out : recipe.outputs) ref.push_back(r64.values.at(static_cast<size_t>(out)));
      }
      if (!ref.empty()) c = check_close(f, e, ref[i].to(at::kDouble));
    }
    uint8_t fl = eager_rp.flags.at(o);
    const at::Tensor& a = amp.at(o);
    at::Tensor ulps = a.defined() ? (a * 4.0).to(f.device()) : at::scalar_tensor(4.0, f.options().dtype(at::kDouble));
    if (!c.ok && (fl & kInexact) && c.message.find("NaN") == std::string::npos &&
        within_ulps(f, e, ulps, class_eps(std::max(fl >> 2, precision_class(f.scalar_type())))))
      c.ok = true;
    if (!c.ok) return {false, fmt::format("output {} (v{}): {}", i, recipe.outputs[i], c.message)};
  }
  return {};
}

namespace {

// A recipe with an in-place op, through the path a user's model takes: its TorchScript source compiled
// with compile(), called twice on fresh inputs (the first call captures, the second runs the plan).
// Outputs must match eager's, and the inputs must come back modified exactly as eager modifies them.
CaseResult check_captured(const Recipe& r, const CheckOptions& co) {
  // Eager runs on the device the compiled module runs on (CUDA's kernels differ from the CPU's in NaN and
  // infinity handling), and results are judged there: a copy to the CPU would change their strides.
  if (co.cuda && !gathers_in_range(r)) return CaseResult::rejected_by_eager();
  std::vector<at::Tensor> in_e = make_inputs(r);
  if (co.cuda)
    for (auto& t : in_e) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
  std::vector<at::Tensor> original;
  for (auto& t : in_e) original.push_back(t.clone());
  at::manual_seed(draw_seed(r.seed));
  Replay e;
  if (!replay(r, in_e, false, nullptr, &e)) return CaseResult::rejected_by_eager();
  torch::jit::Module m("FuzzCase");
  try {
    m.define(torchscript_source(r));
    m.eval();
  } catch (const std::exception& ex) {
    return {false, std::string("TorchScript source not accepted: ") + ex.what()};
  }
  try {
    CompiledModule fused = compile(m);
    for (int call = 0; call < 2; ++call) {
      std::vector<at::Tensor> in_f = make_inputs(r);
      if (co.cuda)
        for (auto& t : in_f) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
      std::vector<c10::IValue> args(in_f.begin(), in_f.end());
      at::manual_seed(draw_seed(r.seed));
      c10::IValue out = fused(args);
      std::vector<at::Tensor> outs;
      for (const auto& v : out.toTupleRef().elements()) outs.push_back(v.toTensor());
      // The float64 reference starts from the inputs as they were before eager's call.
      CaseResult c = judge(r, original, e, outs, 0);
      if (!c.ok) return {false, fmt::format("call {}: {}", call + 1, c.message)};
      for (size_t i = 0; i < in_f.size(); ++i)
        if (!same_values(in_f[i], in_e[i]))
          return {false, fmt::format("call {}: input {} after the call differs from eager's (in-place op)", call + 1, i)};
    }
  } catch (const std::exception& ex) {
    return {false, std::string("compiled module failed: ") + ex.what()};
  }
  return {};
}

}  // namespace

bool has_random_ops(const Recipe& r) {
  for (const auto& op : r.ops)
    if (is_random_schema(op.schema)) return true;
  return false;
}

bool has_inplace_ops(const Recipe& r) {
  for (const auto& op : r.ops)
    if (!inplace_base(op.schema).empty()) return true;
  return false;
}

bool has_ragged_cats(const Recipe& r) {
  Replay rp;
  if (!replay(r, make_inputs(r), false, nullptr, &rp)) return false;
  for (const auto& op : r.ops) {
    if (op.schema != "aten::cat") continue;
    std::set<std::vector<int64_t>> shapes;
    for (size_t a = 0; a + 1 < op.args.size(); ++a)
      if (op.args[a].value >= 0 && rp.values.at(static_cast<size_t>(op.args[a].value)).numel() > 0)
        shapes.insert(rp.values[static_cast<size_t>(op.args[a].value)].sizes().vec());
    if (shapes.size() > 1) return true;
  }
  return false;
}

bool gathers_in_range(const Recipe& r) {
  if (std::none_of(r.ops.begin(), r.ops.end(), [](const OpSpec& op) { return is_gather_schema(op.schema); }))
    return true;
  at::manual_seed(draw_seed(r.seed));
  Replay cpu;
  try {
    return replay(r, make_inputs(r), false, nullptr, &cpu);
  } catch (const std::exception&) {  // the replay's own defect: the device replay reports it
    return true;
  }
}

bool BatchRun::eager_ok(const Recipe& r, size_t k, const CheckOptions& co, bool seeded, CaseResult* why) {
  if (co.cuda && !gathers_in_range(r)) {
    *why = CaseResult::rejected_by_eager();
    return false;
  }
  inputs[k] = make_inputs(r);
  if (co.cuda)
    for (auto& t : inputs[k]) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
  // Validated first (a shrunk recipe may be one eager rejects), then built into the batch graph.
  if (seeded) at::manual_seed(draw_seed(r.seed));
  try {
    if (replay(r, inputs[k], false, nullptr, &eager[k])) return true;
    *why = CaseResult::rejected_by_eager();
  } catch (const std::exception& e) {  // a precondition's own defect: reported with the graph, not fatal
    *why = {false, std::string("the eager replay raised: ") + e.what()};
  }
  return false;
}

void BatchRun::build(const Recipe& r, size_t k, bool seeded) {
  if (seeded) at::manual_seed(draw_seed(r.seed));
  replay(r, inputs[k], false, g.get(), &eager[k]);
  for (auto& t : inputs[k]) all_inputs.emplace_back(t);
  for (int o : r.outputs) g->add_output(eager[k].ir.at(static_cast<size_t>(o)));
}

void BatchRun::keep_inputs() {
  for (size_t k = 0; k < inputs.size(); ++k) {
    before[k].clear();
    for (auto& t : inputs[k]) before[k].push_back(t.clone());
  }
}

std::vector<at::Tensor> BatchRun::run(const PlanInstance& inst) const {
  std::vector<at::Tensor> fused;
  c10::IValue out = run_plan(inst, all_inputs);
  for (const auto& e : out.toTupleRef().elements()) fused.push_back(e.toTensor());
  return fused;
}

void BatchRun::judge_all(const std::vector<Recipe>& recipes, const std::vector<bool>& built,
                         const std::vector<at::Tensor>& fused, std::vector<CaseResult>* results) const {
  size_t pos = 0;
  for (size_t k = 0; k < recipes.size(); ++k) {
    if (!built[k]) continue;
    CaseResult& res = (*results)[k];
    try {
      res = judge(recipes[k], inputs[k], eager[k], fused, pos);
    } catch (const std::exception& e) {  // a checker's own defect is reported with its graph, not fatal
      res = {false, std::string("judging the results failed: ") + e.what()};
    }
    pos += recipes[k].outputs.size();
    for (size_t i = 0; i < inputs[k].size() && res.ok; ++i)
      if (!same_values(inputs[k][i], before[k][i])) res = {false, fmt::format("input {} was modified", i)};
  }
}

std::vector<CaseResult> check_batch(const std::vector<Recipe>& recipes, const CheckOptions& co) {
  std::vector<CaseResult> results(recipes.size());
  // Recipes with an in-place op go through capture; recipes with random ops run alone, the generator
  // seeded alike before the eager and the fused run.
  std::vector<bool> valid(recipes.size(), true);
  const bool seeded = recipes.size() == 1 && has_random_ops(recipes[0]);
  for (size_t k = 0; k < recipes.size(); ++k) {
    if (has_inplace_ops(recipes[k])) {
      try {
        results[k] = check_captured(recipes[k], co);
      } catch (const std::exception& e) {  // the checker's own defect: reported with the graph, not fatal
        results[k] = {false, std::string("checking the captured graph raised: ") + e.what()};
      }
      valid[k] = false;
    } else if (!seeded && has_random_ops(recipes[k])) {
      results[k] = check_batch({recipes[k]}, co).at(0);
      valid[k] = false;
    }
  }
  BatchRun b(recipes.size());
  for (size_t k = 0; k < recipes.size(); ++k) {
    if (!valid[k]) continue;
    valid[k] = b.eager_ok(recipes[k], k, co, seeded, &results[k]);
    if (valid[k]) b.build(recipes[k], k, seeded);
  }
  if (b.g->outputs().empty()) return results;
  b.keep_inputs();
  try {
    verify_graph(*b.g);
    // The batch's plan as a user's graph gets it (Note [The plan session]): the passes with ATen's constant
    // evaluator, build_plan, the ATen steps resolved.
    PlanSession session("fuzz batch", CompileOptions{});
    CapturedGraph cap;
    cap.graph = std::move(b.g);
    cap.output_kind = OutputKind::kTuple;
    PlanTarget target;
    // FUSION_JIT_DYNAMIC=on: the batch's kernels read their sizes (Note [Sizes as kernel arguments]).
    target.size_args = fusion_jit::Options::get().dynamic == DynamicSizes::kOn;
    std::optional<NvrtcCheck> nvrtc;
    auto inst = session.plan_alone(std::move(cap), target, session.skipped(target), 0, nullptr,
                                   [&](const Graph& g) { nvrtc.emplace(g, co.nvrtc_arch, &results, valid); });
    if (seeded) at::manual_seed(draw_seed(recipes[0].seed));
    b.judge_all(recipes, valid, b.run(*inst), &results);
    if (nvrtc) nvrtc->join();
  } catch (const std::exception& e) {
    for (size_t k = 0; k < recipes.size(); ++k)
      if (valid[k]) results[k] = {false, std::string("fused run failed: ") + e.what()};
  }
  return results;
}

}  // namespace fusion_jit::fuzz
