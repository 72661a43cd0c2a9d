#include "torch/capture.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/lower_tuples.h>
#include <torch/csrc/jit/passes/remove_mutation.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "passes/conv_common.h"
#include "passes/passes.h"
#include "cost/cost_model.h"
#include "support/error.h"
#include "support/options.h"

namespace fusion_jit {
namespace tj = torch::jit;

TensorType tensor_type_of(const at::Tensor& t) {
  TensorType tt;
  tt.dtype = dtype_from_torch_code(static_cast<int>(t.scalar_type()));
  tt.sizes = t.sizes().vec();
  tt.strides = t.strides().vec();
  tt.device = t.is_cuda() ? Device::kCUDA : Device::kCPU;
  tt.device_index = t.is_cuda() ? t.get_device() : 0;
  return tt;
}

c10::IValue literal_to_ivalue(const Literal& l) {
  struct V {
    c10::IValue operator()(const None&) const { return c10::IValue(); }
    c10::IValue operator()(bool b) const { return b; }
    c10::IValue operator()(int64_t i) const { return i; }
    c10::IValue operator()(double d) const { return d; }
    c10::IValue operator()(const std::string& s) const { return s; }
    c10::IValue operator()(const std::vector<int64_t>& v) const { return v; }
    c10::IValue operator()(const std::vector<double>& v) const { return v; }
  };
  return std::visit(V{}, l);
}

namespace {

std::optional<Literal> ivalue_to_literal(const c10::IValue& v) {
  if (v.isNone()) return Literal(None{});
  if (v.isBool()) return Literal(v.toBool());
  if (v.isInt()) return Literal(v.toInt());
  if (v.isDouble()) return Literal(v.toDouble());
  if (v.isString()) return Literal(v.toStringRef());
  if (v.isIntList()) return Literal(v.toIntVector());
  if (v.isDoubleList()) return Literal(v.toDoubleVector());
  return std::nullopt;
}

std::string kind_name(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return "bool";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isString()) return "str";
  if (v.isIntList()) return "int[]";
  if (v.isDoubleList()) return "float[]";
  if (v.isTensorList()) return "Tensor[]";
  if (v.isDevice()) return "Device";
  return v.tagKind();
}

ValueType value_type_of(const c10::IValue& v) {
  ValueType t;
  if (v.isTensor() && v.toTensor().defined()) t.tensor = tensor_type_of(v.toTensor());
  else t.other = kind_name(v);
  return t;
}

std::string node_desc(const tj::Node* n) { return n->kind().toQualString(); }

bool is_metadata_op(const tj::Node* n) {
  static const std::set<std::string> ops = {"aten::size", "aten::dim", "aten::numel", "prim::device", "prim::dtype",
                                            "aten::len", "prim::layout", "aten::__isnot__", "aten::__is__"};
  return ops.count(n->kind().toQualString()) > 0;
}

// Whether `v` is the weight (input 1) of a 2-d convolution (conv2d, or convolution/_convolution not
// transposed) and a 4-d tensor type.
bool is_conv_weight(const tj::Value* v) {
  auto t = v->type()->cast<c10::TensorType>();
  if (!t || t->dim() != 4) return false;
  for (const tj::Use& u : v->uses()) {
    const tj::Node* n = u.user;
    if (u.offset != 1) return false;
    if (n->kind() == c10::aten::conv2d) continue;
    if (n->kind() != c10::aten::convolution && n->kind() != c10::aten::_convolution) return false;
    auto transposed = tj::toIValue(n->input(6));
    if (!transposed || !transposed->isBool() || transposed->toBool()) return false;
  }
  return !v->uses().empty();
}

bool any_node(const tj::Block* b, const std::function<bool(const tj::Node*)>& pred) {
  for (const tj::Node* n : b->nodes()) {
    if (pred(n)) return true;
    for (const tj::Block* inner : n->blocks())
      if (any_node(inner, pred)) return true;
  }
  return false;
}

// FUSION_JIT_DISABLE=channels_last (Note [Channels-last plans]); =symbolic, =symbolic.class and
// =weight_memo, read by the Python package (Note [Symbolic graphs], python/fusion_jit/_symbolic.py; Note
// [Plans of a shape class], runtime/plan.h; Note [Weights reordered once per content], torch/executor.h).
[[maybe_unused]] const bool kDisableNames =
    (Options::register_disable_names({"channels_last", "symbolic", "symbolic.class", "weight_memo"}), true);

class Importer {
 public:
  Importer(const std::shared_ptr<tj::Graph>& g, CaptureOptions options) : jg_(g), options_(options) {}

  CaptureResult run(const std::vector<c10::IValue>& inputs, bool skip_self) {
    CaptureResult res;
    auto& cap = res.captured;
    cap.graph = std::make_unique<Graph>();
    Graph& g = *cap.graph;
    auto jin = jg_->inputs();
    size_t first = skip_self ? 1 : 0;
    FJ_CHECK(jin.size() - first == inputs.size(), "the model takes {} inputs, {} were given", jin.size() - first,
             inputs.size());
    // Everything that makes capture fail whatever the values is decided before anything runs: a node that
    // changes its arguments must not run on the caller's tensors and then run again in the eager fallback.
    for (tj::Node* n : jg_->nodes()) check_capturable(n, /*in_branch=*/false);
    for (size_t i = first; i < jin.size(); ++i) {
      const c10::IValue& v = inputs[i - first];
      values_[jin[i]] = v;
      FJ_CHECK(!v.isTensor() || v.toTensor().defined(), "input {} is an undefined tensor", i - first);
      map_[jin[i]] = g.add_input(value_type_of(v));
    }
    for (tj::Node* n : jg_->nodes()) import_node(n, cap);
    // Outputs: one value, or the elements of a returned tuple or list.
    tj::Value* ret = jg_->outputs().at(0);
    std::vector<tj::Value*> outs = {ret};
    tj::Node* rn = ret->node();
    if (rn->kind() == c10::prim::TupleConstruct || (rn->kind() == c10::prim::ListConstruct && !literals_.count(ret))) {
      cap.output_kind = rn->kind() == c10::prim::TupleConstruct ? OutputKind::kTuple : OutputKind::kList;
      outs.assign(rn->inputs().begin(), rn->inputs().end());
    }
    for (tj::Value* o : outs) g.add_output(value_for_output(o, cap));
    res.result = values_.at(ret);
    verify_graph(g);
    return res;
  }

 private:
  void execute(tj::Node* n) {
    if (n->kind() == c10::prim::Constant) {
      auto v = tj::toIValue(n->output());
      FJ_CHECK(v.has_value(), "prim::Constant %{}: unsupported constant", n->output()->debugName());
      if (options_.channels_last_weights && v->isTensor() && is_conv_weight(n->output())) {
        const at::Tensor& w = v->toTensor();
        v = options_.channels_last_copies ? options_.channels_last_copies->of(w)
                                          : w.contiguous(at::MemoryFormat::ChannelsLast);
      }
      values_[n->output()] = *v;
      return;
    }
    tj::Stack stack;
    for (tj::Value* in : n->inputs()) stack.push_back(values_.at(in));
    if (run_structural(n, stack)) {
      for (size_t i = 0; i < stack.size(); ++i) values_[n->outputs()[i]] = std::move(stack[i]);
      return;
    }
    FJ_CHECK(n->maybeOperator() != nullptr, "{}: no operator to run it; not captured", node_desc(n));
    tj::Operation op = n->getOperation();
    op(stack);
    FJ_INTERNAL_ASSERT(stack.size() == n->outputs().size(), "{} returned {} values", node_desc(n), stack.size());
    for (size_t i = 0; i < stack.size(); ++i) values_[n->outputs()[i]] = std::move(stack[i]);
  }

  // Lists and tuples, which the interpreter builds with instructions of its own rather than operators.
  static bool run_structural(tj::Node* n, tj::Stack& stack) {
    auto kind = n->kind();
    if (kind == c10::prim::ListConstruct) {
      auto elem = n->output()->type()->expectRef<c10::ListType>().getElementType();
      c10::impl::GenericList list(elem);
      for (auto& v : stack) list.push_back(std::move(v));
      stack.assign(1, c10::IValue(std::move(list)));
      return true;
    }
    if (kind == c10::prim::TupleConstruct) {
      auto t = c10::ivalue::Tuple::create(std::vector<c10::IValue>(stack.begin(), stack.end()));
      stack.assign(1, c10::IValue(std::move(t)));
      return true;
    }
    if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
      std::vector<c10::IValue> items = kind == c10::prim::ListUnpack ? stack.at(0).toListRef().vec()
                                                                      : stack.at(0).toTupleRef().elements().vec();
      FJ_CHECK(items.size() == n->outputs().size(), "{}: {} elements, {} expected", node_desc(n), items.size(),
               n->outputs().size());
      stack = std::move(items);
      return true;
    }
    return false;
  }

  // Whether `v` is known once the input signature is (Note [Shape-only branches]): a literal, or a
  // non-tensor computed by pure nodes from literals and from tensors' metadata (dim, size, dtype, device),
  // which the signature fixes.
  bool signature_static(const tj::Value* v) {
    auto it = static_.find(v);
    if (it != static_.end()) return it->second;
    bool is = false;
    const tj::Node* n = v->node();
    if (v->type()->kind() == c10::TypeKind::TensorType) {
      is = false;
    } else if (n->kind() == c10::prim::Param) {
      is = false;  // non-tensor inputs are graph inputs of the plan, not literals
    } else if (n->kind() == c10::prim::Constant) {
      is = true;
    } else if (n->blocks().empty() && !n->hasSideEffects() && n->kind() != c10::prim::CallMethod &&
               n->kind() != c10::prim::CallFunction) {
      is = true;
      for (const tj::Value* in : n->inputs())
        is &= in->type()->kind() == c10::TypeKind::TensorType ? is_metadata_op(n) : signature_static(in);
    }
    static_[v] = is;
    return is;
  }

  // Throws, naming the node, when it can never be captured: control flow on values computed at run time,
  // calls, ops that mutate their arguments or have side effects. A branch on a signature-static condition
  // is checked inside; there raising (prim::RaiseException) is allowed, as it runs only if taken.
  void check_capturable(const tj::Node* n, bool in_branch) {
    auto kind = n->kind();
    std::string kname = kind.toQualString();
    if (kind == c10::prim::If && signature_static(n->input(0))) {
      for (const tj::Block* b : n->blocks())
        for (const tj::Node* inner : b->nodes()) check_capturable(inner, /*in_branch=*/true);
      return;
    }
    if (in_branch && kind == c10::prim::RaiseException) return;
    FJ_CHECK(n->blocks().empty(), "{}: control flow is not captured", kname);
    FJ_CHECK(kind != c10::prim::CallMethod && kind != c10::prim::CallFunction, "{}: calls are not captured", kname);
    if (const c10::FunctionSchema* schema = n->maybeSchema())
      FJ_CHECK(!schema->is_mutable(), "{}: in-place op left after mutation removal; not captured", kname);
    FJ_CHECK(kind == c10::prim::Constant || !n->hasSideEffects(), "{}: has side effects; not captured", kname);
  }

  // Note [Shape-only branches]
  // A prim::If whose condition the input signature decides (signature_static: BatchNorm's rank check,
  // `if x.dim() == 4`) is captured as its taken branch: the plan is specialized to the signature, as it is
  // to the sizes that shape arithmetic folds into literals. The other branch is never run or captured.
  void import_branch(tj::Node* n, CapturedGraph& cap) {
    auto cond = literals_.find(n->input(0));
    FJ_INTERNAL_ASSERT(cond != literals_.end() && std::holds_alternative<bool>(cond->second),
                       "prim::If: a signature-static condition was not folded into a literal");
    tj::Block* taken = n->blocks().at(std::get<bool>(cond->second) ? 0 : 1);
    for (tj::Node* inner : taken->nodes()) import_node(inner, cap);
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      tj::Value* from = taken->outputs()[i];
      tj::Value* to = n->outputs()[i];
      values_[to] = values_.at(from);
      if (auto l = literals_.find(from); l != literals_.end()) literals_[to] = l->second;
      if (auto m = map_.find(from); m != map_.end()) map_[to] = m->second;
      if (const_of_.count(from)) const_of_.insert(to);
      if (shape_tensors_.count(from)) shape_tensors_.insert(to);
    }
  }

  void import_node(tj::Node* n, CapturedGraph& cap) {
    auto kind = n->kind();
    std::string kname = kind.toQualString();
    if (kind == c10::prim::If) return import_branch(n, cap);
    // The branch taken raises: this signature runs eagerly, where the model's own error reaches the caller.
    FJ_CHECK(kind != c10::prim::RaiseException, "the model raises on this input signature (a branch that raises)");
    execute(n);
    if (kind == c10::prim::Constant) {
      const c10::IValue& v = values_.at(n->output());
      if (auto lit = ivalue_to_literal(v)) literals_[n->output()] = *lit;
      else add_constant(n->output(), v, cap);
      return;
    }
    // Non-tensor results of constants and tensor metadata fold into literals.
    bool all_outputs_plain = true;
    for (tj::Value* o : n->outputs()) all_outputs_plain &= !values_.at(o).isTensor() && !values_.at(o).isTensorList();
    bool inputs_known = true;
    for (tj::Value* in : n->inputs()) {
      bool known = literals_.count(in) || (const_of_.count(in) && !values_.at(in).isTensor()) ||
                   shape_tensors_.count(in);
      if (!known && values_.at(in).isTensor()) known = is_metadata_op(n);
      inputs_known &= known;
    }
    if (all_outputs_plain && inputs_known && !n->hasSideEffects()) {
      for (tj::Value* o : n->outputs()) {
        const c10::IValue& v = values_.at(o);
        if (auto lit = ivalue_to_literal(v)) literals_[o] = *lit;
        else add_constant(o, v, cap);
      }
      return;
    }
    if (kind == c10::prim::NumToTensor && literals_.count(n->input())) {
      // A traced size as a 0-d tensor: a constant, and still a literal for aten::Int and friends.
      add_constant(n->output(), values_.at(n->output()), cap);
      shape_tensors_.insert(n->output());
      return;
    }
    if (kind == c10::prim::TupleConstruct && n->output()->uses().size() == 1 &&
        n->output()->uses()[0].user == jg_->return_node())
      return;  // the graph's result, flattened in run()
    if (kind == c10::prim::ListConstruct || kind == c10::prim::ListUnpack) {
      bool tensors = true;
      for (tj::Value* in : n->inputs()) tensors &= values_.at(in).isTensor() || values_.at(in).isTensorList();
      for (tj::Value* o : n->outputs()) tensors &= values_.at(o).isTensor() || values_.at(o).isTensorList();
      FJ_CHECK(tensors, "{}: only lists of tensors are captured", kname);
      if (kind == c10::prim::ListConstruct && n->output()->uses().size() == 1 &&
          n->output()->uses()[0].user == jg_->return_node())
        return;  // the graph's result, flattened in run()
      append(n, kname, cap);
      return;
    }
    FJ_CHECK(kind.is_aten() && n->maybeSchema() != nullptr, "{}: not an ATen op; not captured", kname);
    const c10::FunctionSchema& schema = n->schema();
    FJ_CHECK(!schema.is_mutable(), "{}: in-place op left after mutation removal; not captured", kname);
    std::string name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    FJ_CHECK(c10::Dispatcher::singleton().findSchema({schema.name(), schema.overload_name()}).has_value(),
             "{}: not a dispatcher op; not captured", name);
    append(n, name, cap);
  }

  void append(tj::Node* n, const std::string& name, CapturedGraph& cap) {
    std::vector<Arg> args;
    for (tj::Value* in : n->inputs()) {
      auto lit = literals_.find(in);
      if (lit != literals_.end()) args.push_back(Arg::lit(lit->second));
      else args.push_back(Arg::of(value_of(in, cap)));
    }
    std::vector<ValueType> types;
    for (tj::Value* o : n->outputs()) types.push_back(value_type_of(values_.at(o)));
    Node* node = cap.graph->append(name, std::move(args), std::move(types));
    for (size_t i = 0; i < n->outputs().size(); ++i) map_[n->outputs()[i]] = node->output(i);
  }

  void add_constant(tj::Value* v, const c10::IValue& iv, CapturedGraph& cap) {
    int64_t idx = static_cast<int64_t>(cap.constants.size());
    cap.constants.push_back(iv);
    Node* c = cap.graph->append("fj::constant", {Arg::lit(idx)}, {value_type_of(iv)});
    map_[v] = c->output();
    const_of_.insert(v);
  }

  Value* value_of(tj::Value* v, CapturedGraph& cap) {
    auto it = map_.find(v);
    FJ_INTERNAL_ASSERT(it != map_.end(), "value %{} has no IR value", v->debugName());
    return it->second;
  }

  Value* value_for_output(tj::Value* v, CapturedGraph& cap) {
    auto lit = literals_.find(v);
    if (lit != literals_.end()) {
      add_constant(v, values_.at(v), cap);
      return map_.at(v);
    }
    return value_of(v, cap);
  }

  std::shared_ptr<tj::Graph> jg_;
  CaptureOptions options_;
  std::unordered_map<tj::Value*, c10::IValue> values_;
  std::unordered_map<tj::Value*, Value*> map_;
  std::unordered_map<tj::Value*, Literal> literals_;
  std::set<tj::Value*> const_of_;
  std::set<tj::Value*> shape_tensors_;  // 0-d tensors made from literals by prim::NumToTensor
  std::unordered_map<const tj::Value*, bool> static_;  // signature_static, memoized
};

}  // namespace

void inline_all_calls(torch::jit::Graph& graph) {
  auto has_call = [](const torch::jit::Block* b, auto& self) -> bool {
    for (const torch::jit::Node* n : b->nodes()) {
      if (n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) return true;
      for (const torch::jit::Block* sub : n->blocks())
        if (self(sub, self)) return true;
    }
    return false;
  };
  for (int depth = 0; depth < 64 && has_call(graph.block(), has_call); ++depth) tj::Inline(graph);
}

namespace {

// Note [Ops that return their input unannotated]
// dropout (and its feature and alpha forms) returns its input tensor itself where it does nothing (train
// false, or p = 0 on the CPU), and type_as where the dtype and device already match, although their
// schemas promise new tensors. Mutation removal trusts the schemas: `b = dropout(a, p, False);
// b.add_(1)` would become b' = b + 1 with `a` left as it was, where eager changes `a`. A dropout with a
// constant train=False is its input, so it is dropped before mutation removal; an in-place op on any
// other such op's result is kept (the graph is then not captured and runs eagerly, as eager would).
bool may_return_input(const tj::Node* n) {
  const auto kind = n->kind();
  return kind == c10::aten::dropout || kind == c10::aten::feature_dropout || kind == c10::aten::alpha_dropout ||
         kind == c10::aten::feature_alpha_dropout || kind == c10::aten::type_as;
}

void drop_identity_ops(tj::Block* b) {
  for (auto it = b->nodes().begin(); it != b->nodes().end();) {
    tj::Node* n = *it++;
    for (tj::Block* sub : n->blocks()) drop_identity_ops(sub);
    if (n->kind() != c10::aten::type_as && may_return_input(n) && n->inputs().size() == 3 &&
        tj::toIValue(n->input(2)) == c10::IValue(false)) {
      n->output()->replaceAllUsesWith(n->input(0));
      n->destroy();
    }
  }
}

// Whether mutation removal may rewrite `n`: not an in-place op on what may be another value's tensor.
bool removable_mutation(tj::Node* n) {
  return n->inputs().empty() || !may_return_input(n->input(0)->node());
}

}  // namespace

void prepare_torchscript_graph(const std::shared_ptr<torch::jit::Graph>& graph) {
  inline_all_calls(*graph);
  tj::LowerSimpleTuples(graph);
  drop_identity_ops(graph->block());
  tj::RemoveTensorMutation(graph, removable_mutation);
  tj::InplaceToFunctionalActivation(graph);
}

at::Tensor ChannelsLastCopies::of(const at::Tensor& weight) {
  if (weight.is_inference()) return weight.contiguous(at::MemoryFormat::ChannelsLast);  // no version counter
  std::lock_guard<std::mutex> g(mu_);
  auto& [version, copy] = copies_[weight.unsafeGetTensorImpl()];
  if (!copy.defined() || version != weight._version()) {
    version = weight._version();
    copy = weight.contiguous(at::MemoryFormat::ChannelsLast);
  }
  return copy;
}

CaptureResult capture_graph(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                            bool skip_self, CaptureOptions options) {
  return Importer(graph, options).run(inputs, skip_self);
}

bool wants_channels_last_capture(const torch::jit::Graph& graph) {
  const bool conv = any_node(graph.block(), [](const tj::Node* n) {
    return n->kind() == c10::prim::Constant && n->output()->type()->kind() == c10::TypeKind::TensorType &&
           is_conv_weight(n->output()) && n->t(c10::attr::value).is_cpu();
  });
  // Ops that read memory by strides would read other elements of a channels-last tensor.
  return conv && !any_node(graph.block(), [](const tj::Node* n) {
    return n->isNondeterministic() || n->kind() == c10::aten::as_strided || n->kind() == c10::aten::as_strided_;
  });
}

LayoutDecision decide_channels_last(const Graph& g) {
  static const std::set<std::string> kConvs = {"aten::conv2d", "aten::convolution", "aten::_convolution"};
  std::set<int> graph_inputs, read;
  for (const Value* v : g.inputs()) graph_inputs.insert(v->id());
  int64_t written = 0, edges = 0, estimated = 0;  // estimated: written by the convolutions not timed
  int convs = 0, timed = 0;
  double aten_us = 0, onednn_us = 0;  // the timed convolutions' (Note [Convolutions timed on this machine])
  for (const Node* n : g.nodes()) {
    if (!kConvs.count(n->schema()) || n->args().size() < 2 || !n->args()[1].is_value()) continue;
    const Value* w = n->args()[1].value;
    if (!w->producer() || !w->producer()->is_constant() || !w->is_tensor() || w->tensor_type().dim() != 4 ||
        w->tensor_type().device != Device::kCPU || !n->output()->is_tensor() || n->output()->tensor_type().dim() != 4)
      continue;
    convs++;
    written += n->output()->tensor_type().numel();
    std::optional<ConvTiming> t;
    if (auto conv = conv_rules::as_conv(const_cast<Node*>(n)))
      if (auto shape = conv_rules::conv_shape(*conv)) t = conv_timing(*shape);
    if (t) {
      timed++;
      aten_us += t->aten_us;
      onednn_us += t->onednn_cl_us;
    } else {
      estimated += n->output()->tensor_type().numel();
    }
    const Value* x = n->args()[0].is_value() ? n->args()[0].value : nullptr;
    if (x && x->is_tensor() && x->tensor_type().dim() == 4 && graph_inputs.count(x->id()) && read.insert(x->id()).second)
      edges += x->tensor_type().numel();
  }
  std::set<int> outputs;
  for (const Value* o : g.outputs())
    if (o->is_tensor() && o->tensor_type().dim() == 4 && outputs.insert(o->id()).second) edges += o->tensor_type().numel();
  static const DeviceDescription cpu = host_cpu_description();
  LayoutEstimate e = channels_last_estimate(cpu, estimated, /*weights=*/0, /*copied=*/0, edges);
  std::string gain = fmt::format("est. gain {:.1f} us ({} elements written by {} convolution(s))", e.gain_us, written, convs);
  if (timed > 0) {
    e.gain_us += aten_us - onednn_us;
    gain = fmt::format("gain {:.1f} us ({} of {} convolution(s) timed here: ATen's on NCHW {:.1f} us, oneDNN's on "
                       "channels-last {:.1f} us{})",
                       e.gain_us, timed, convs, aten_us, onednn_us,
                       timed < convs ? fmt::format("; {} elements written by the others, estimated", estimated) : "");
  }
  const std::string why =
      fmt::format("{}, cost {:.1f} us ({} copied at the edges; the weights copied once)", gain, e.cost_us, edges);
  if (e.gain_us <= e.cost_us) return {false, "layout: NCHW kept, channels-last activations would not pay: " + why};
  return {true, "layout: channels-last activations: " + why};
}

bool restore_eager_layouts(CapturedGraph& captured, const CapturedGraph& eager) {
  Graph& g = *captured.graph;
  const auto& want = eager.graph->outputs();
  if (g.outputs().size() != want.size()) return false;
  std::vector<std::pair<size_t, int64_t>> fixes;  // output, memory format
  for (size_t i = 0; i < want.size(); ++i) {
    const Value* o = g.outputs()[i];
    if (o->type().str() == want[i]->type().str()) continue;
    if (!o->is_tensor() || !want[i]->is_tensor()) return false;
    const TensorType& have = o->tensor_type();
    const TensorType& w = want[i]->tensor_type();
    if (have.sizes != w.sizes || have.dtype != w.dtype || have.device != w.device) return false;
    if (same_strides(w, have.strides)) continue;
    if (w.strides == contiguous_strides(w.sizes)) fixes.emplace_back(i, 0);
    else if (w.dim() == 4 && w.strides == channels_last_strides(w.sizes)) fixes.emplace_back(i, 2);
    else return false;
  }
  std::map<const Value*, Value*> made;  // a value returned twice stays one tensor, as eager's
  for (auto [i, format] : fixes) {
    Value* o = g.outputs()[i];
    Value*& c = made[o];
    if (!c) c = g.append("aten::contiguous", {Arg::of(o), Arg::lit(format)}, {want[i]->type()})->output();
    g.mutable_outputs()[i] = c;
  }
  verify_graph(g);
  return true;
}

}  // namespace fusion_jit
