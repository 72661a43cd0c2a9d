// Graph passes. Each runs in place, returns whether it changed the graph, and keeps the graph valid.
//
// decompose      rewrites composite ops (softmax, log_softmax, logsumexp, layer_norm, rms_norm, group_norm,
//                std, max.dim without indices) into reductions and elementwise ops (Note [Decompositions]).
// dce            removes nodes whose outputs are unused and that have no side effects.
// cse            merges nodes with the same schema and arguments (pure ops only), keeping the first.
// constant_fold  evaluates pure nodes whose tensor arguments are all fj::constant, through an evaluator
//                supplied by the caller (the torch adapter runs ATen); the result becomes a new constant.
//
// run_pipeline runs them in order, times each, verifies the graph after each, and leaves out those named
// in FUSION_JIT_DISABLE. With FUSION_JIT_DUMP=ir it prints the graph after each pass that changed it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fusion_jit {

bool decompose(Graph& g);
bool dce(Graph& g);
bool cse(Graph& g);

// Evaluates node `n` whose value arguments are all constants; returns the constants-table index of each
// output, or nullopt when it cannot (the node is then left as it is).
using ConstantEvaluator = std::function<std::optional<std::vector<int64_t>>(const Node& n)>;
bool constant_fold(Graph& g, const ConstantEvaluator& eval);

struct PassTiming {
  std::string name;
  double ms;
  bool changed;
};
std::vector<PassTiming> run_pipeline(Graph& g, const ConstantEvaluator& eval);

}  // namespace fusion_jit
