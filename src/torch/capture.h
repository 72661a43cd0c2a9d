// Capture: a TorchScript graph, run once on concrete inputs, imported into the IR.
//
// The graph is run node by node with the JIT's own operations, which records the concrete value of every
// value and gives the first call's result. Then each node is imported:
//  - tensor constants (frozen weights) go to the constants table, as fj::constant nodes;
//  - non-tensor values computed only from constants and tensor metadata (aten::size, dim, numel, dtype,
//    device) become literals: the plan is specialized on sizes anyway;
//  - ATen ops become nodes named by their schema ("aten::add.Tensor"); prim::ListConstruct of tensors and
//    prim::ListUnpack run natively.
// Anything else (control flow, calls, in-place ops left after mutation removal, non-ATen ops) makes
// capture fail with a reason; the caller then runs that signature eagerly.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace torch::jit {
struct Graph;
}

namespace fusion_jit {

enum class OutputKind { kSingle, kTuple, kList };

struct CapturedGraph {
  std::unique_ptr<Graph> graph;
  std::vector<c10::IValue> constants;  // fj::constant(i) refers to constants[i]
  OutputKind output_kind = OutputKind::kSingle;
  int64_t eager_peak_bytes = 0;  // the graph as captured, run op by op (Note [Peak memory]); set by optimize_captured
};

struct CaptureResult {
  CapturedGraph captured;
  c10::IValue result;  // the eager result of this run
};

// Prepares a TorchScript graph for capture: inlines calls, lowers tuples, removes mutation.
void prepare_torchscript_graph(const std::shared_ptr<torch::jit::Graph>& graph);
// Inlines every method and function call, however deep. torch's Inline takes one level per run while the
// graph executor's optimization is off (it then inlines each callee's own graph, calls and all), which
// left a TorchScript ResNet's Conv2d._conv_forward calls in the graph that freezing then made dangling.
void inline_all_calls(torch::jit::Graph& graph);
// Note [Channels-last plans]
// A frozen 2-d convolution's weight made channels-last makes eager's convolution (oneDNN) write its result
// channels-last, and the ops after it keep that layout: captured that way, a conv net's activations are
// NHWC from its first convolution to its last, our kernels are generated for that layout, and the oneDNN
// rules (passes/epilogue_rules.cpp) run convolutions with post-ops without copies back to NCHW. This is Inductor's
// freezing layout as well. Whether it pays is the cost model's decision (decide_channels_last, over the NCHW
// capture: what the convolutions write against what the plan's edges copy), printed by explain; where it
// pays, the model runs once more at capture (its eager run gives the first result
// and eager's output layouts); each output whose layout then differs gets eager's back through
// aten::contiguous with eager's memory format, and where eager's is neither contiguous nor channels-last
// the plan stays as captured without it; where the second run fails (a view of a channels-last tensor
// that only a copy could give) the first capture is kept. Not done for graphs with nondeterministic ops
// (a second run would draw other random numbers), with as_strided (it reads memory by strides), whose
// outputs share storage (the copies giving layouts back would part them), with
// FUSION_JIT_DISABLE=channels_last, or for weights on a GPU: the layout's gain was measured for oneDNN
// only, and cuDNN's NHWC float32 convolution was 1.3e-3 off float64 on an H200 where eager's NCHW one
// was 1.8e-6 (tests/gpu/run.sh, conv_bn_relu). The torch.compile backend does the same with frozen inputs
// (python/fusion_jit/_lowering.py).
// The channels-last copies of a module's frozen conv weights, kept between its captures: the same copy for
// every input signature, so that what the plans fold from it is shared too (Note [Folded constants shared
// across signatures], torch/executor.h). By weight: its TensorImpl (held by the graph's constant, so never
// another tensor's); a weight whose version counter moved is copied again, its old copy dropped.
// Thread-safe.
class ChannelsLastCopies {
 public:
  at::Tensor of(const at::Tensor& weight);

 private:
  std::mutex mu_;
  std::map<const void*, std::pair<int64_t, at::Tensor>> copies_;  // weight -> (its version, the copy)
};

struct CaptureOptions {
  bool channels_last_weights = false;  // frozen 4-d convolution weights made channels-last first
  ChannelsLastCopies* channels_last_copies = nullptr;  // where set, copies are taken from it
};

// Runs the graph on `inputs` (without the module's `self` when `skip_self`) and imports it.
// Throws fusion_jit::Error naming the node when the graph cannot be imported.
CaptureResult capture_graph(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                            bool skip_self, CaptureOptions options = {});
// Whether the graph has a 2-d convolution whose weight is a constant on the CPU, no nondeterministic op and no
// as_strided: a channels-last capture may pay, runs the model the same way twice, and no op reads memory
// by strides (Note [Channels-last plans]).
bool wants_channels_last_capture(const torch::jit::Graph& graph);
// Whether channels-last activations pay for `nchw` (the graph captured with its weights as given), by the
// cost model (channels_last_estimate, cost/cost_model.h), and the line explain prints: the gain per element
// the 2-d convolutions on constant CPU weights write, against the elements copied at the plan's edges (4-d
// graph inputs a convolution reads, 4-d outputs given eager's layout back). The weights cost nothing per
// call: their channels-last copies are made once (ChannelsLastCopies).
struct LayoutDecision {
  bool channels_last = false;
  std::string line;  // "layout: ...", a line of explain
};
LayoutDecision decide_channels_last(const Graph& nchw);
// Gives `captured`'s outputs the layouts of `eager`'s (the same graph captured without channels-last
// weights): aten::contiguous nodes where they differ. False (nothing changed) where an eager layout is
// neither contiguous nor channels-last, or the outputs do not correspond.
bool restore_eager_layouts(CapturedGraph& captured, const CapturedGraph& eager);
TensorType tensor_type_of(const at::Tensor& t);
c10::IValue literal_to_ivalue(const Literal& l);

}  // namespace fusion_jit
