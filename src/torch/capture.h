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

#include <memory>
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
// Runs the graph on `inputs` (without the module's `self` when `skip_self`) and imports it.
// Throws fusion_jit::Error naming the node when the graph cannot be imported.
CaptureResult capture_graph(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                            bool skip_self);
TensorType tensor_type_of(const at::Tensor& t);
c10::IValue literal_to_ivalue(const Literal& l);

}  // namespace fusion_jit
