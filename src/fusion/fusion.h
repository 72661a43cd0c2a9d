// Fusion: which nodes run together in one generated kernel, and why.
//
// Legality (can_fuse_node, and the shape and cycle rules in fusion.cpp), cost (cost/cost_model.h) and
// mechanism (the greedy grouping) are separate; every decision, yes or no, is recorded with its reason and
// printed by explain_plan.
//
// A graph of a shape class (Note [Symbolic sizes] in ir/sym.h) fuses as it is: iteration spaces, rows,
// cat regions and strides are SymSizes and SymInts, legality compares them (shapes equal or broadcasting
// for every size of the class need no guard; one that holds only at some sizes records the guard it
// needs), and the cost model prices each candidate at the hints, with no guard: an estimate decides what
// runs together, never what a kernel computes.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "ir/graph.h"

namespace fusion_jit {

struct Decision {
  bool fused;
  std::string text;  // "aten::gelu %4 into group 0: saves 512.0 KB and 1 launch"
};

// Note [Gathered loads] (codegen/kernel_spec.h): a gather node's table, its indices, and the table dim
// an index picks: embedding's rows (dim 0; its result appends the row's elements to the indices'
// dims), or aten::gather's dim (its result has the indices' shape). nullopt for other nodes.
struct GatherForm {
  const Value* table = nullptr;
  const Value* index = nullptr;
  int64_t dim = 0;
  bool embedding = true;
};
std::optional<GatherForm> gather_form(const Node& n);

// The form of a group with reductions (Note [Reduction groups] in fusion.cpp). Every reduction of the group
// reduces the same shape over the same dims; the other values are computed per element of that shape or
// once per row (a row: one index of the kept dims).
struct ReductionForm {
  SymSizes shape;                      // the reductions' input shape: the iteration space
  std::vector<int64_t> dims;           // the reduced dims of `shape`, sorted
  std::set<const Value*> row_values;   // values computed once per row
  std::map<const Value*, int> phase;   // element values: the pass over the row that first computes them
  std::map<const Value*, int> ready;   // row values: the pass after which they are known (0: before any)
  int passes = 0;                      // passes over each row
  SymInt row_len = 0;                  // elements per row
};
// The form of `nodes` (in graph order, at least one a reduction) as one kernel; nullopt with the reason
// when they cannot run together. `outside` holds the values read after the group or returned by the graph.
std::optional<ReductionForm> reduction_form(const std::vector<const Node*>& nodes,
                                            const std::set<const Value*>& outside, std::string* why);

// Note [Concatenation in kernels]
// `aten::cat` and `aten::stack` of a `prim::ListConstruct` whose inputs (the items) all have one shape S
// (items with no elements, which cat skips, left out), one dtype and one device, that of the result, run
// inside a generated kernel: the kernel iterates over S and stores the value of each of the K items into
// the result's buffer at the offset of the item's slice (the buffer's strides over S: the result's,
// without the stacked dim for stack). The items' producers join the kernel as any pointwise producer
// does, so `cat((-x2, x1), -1)` (rotary embeddings), `cat((freqs, freqs), -1)`, a stack of computed
// tensors or a cat onto an empty cache are one kernel writing the final buffer, without an ATen step or
// a copy. The list joins the group with its cat (the fuser moves them as one unit). A cat left with one
// item is a copy of it: consumers over the same shape may join too. Otherwise the result is only stored:
// nothing in the kernel reads it, and the group holds no reduction. Kernels over other shapes (the cat's
// consumers) read the result as any input.
//
// Note [Cats of unequal items]
// A cat whose items differ in size along its dim (a key/value cache and this step's keys) is one
// kernel over the result's shape, split along the cat's dim into pieces, one per item: an element of
// piece k is item k's element, its index along the dim counted from the piece's start
// (KernelSpec::pieces). The nodes that compute item k (its producers in the group, and theirs) are
// owned by the piece: they run only there, over loads of that piece, and nothing else in the kernel
// reads them (cat_pieces; the fuser refuses a node feeding two items or read by others). A cat among
// them (rotary embedding's halves, inside this step's keys) splits its piece again, along its own dim.
// The result is a value of the kernel like any other: its consumers over the result's shape join it (a
// cat of the cache, then a cast, is one kernel). One such cat per kernel, and no reductions.
struct CatForm {
  bool stack = false;
  int64_t dim = 0;                   // in the result, wrapped
  std::vector<const Value*> items;   // inputs with elements, in order: the stores' regions
  // Items of one shape: that shape, the kernel's iteration space. Items of unequal sizes along `dim`
  // (ragged): the result's shape.
  SymSizes shape;
  bool ragged = false;
  // The offset (in elements of the result) of region k, and the result's strides over `shape`.
  SymInt offset(size_t k) const { return static_cast<int64_t>(k) * step; }
  // A cat left with one item is a copy of it, of the same shape: a value the kernel may read on.
  bool copies() const { return !stack && items.size() == 1; }
  SymSizes strides;
  SymInt step = 0;
};
// The form of a cat or stack node as one kernel's stores; nullopt (and the reason) when it cannot be, or
// when `n` is neither. It does not check the list's other users (the fuser does).
std::optional<CatForm> cat_form(const Node& n, std::string* why);
// The prim::ListConstruct node a cat or stack reads its items from, or nullptr.
const Node* cat_list(const Node& n);
// Note [Cats of unequal items]: the pieces of the cat of unequal items `cat` among `members`, and the
// piece each member computing an item belongs to (the deepest, for a cat inside an item); nullopt (and
// why) when a node would compute two items or a stack computes one.
struct CatPiece {
  const Node* cat = nullptr;  // the cat whose item this piece is
  int item = 0;               // index into its CatForm::items
  int parent = -1;            // the piece the cat lies in (-1: the kernel)
};
struct CatPieces {
  std::vector<CatPiece> pieces;        // parents first
  std::map<const Node*, int> owner;    // node -> piece
};
std::optional<CatPieces> cat_pieces(const Node& cat, const std::set<const Node*>& members, std::string* why);

struct FusionGroup {
  int id = 0;
  std::vector<Node*> nodes;       // in graph order
  std::vector<Value*> inputs;     // tensors read by the kernel, first use order
  std::vector<Value*> outputs;    // tensors written: used outside the group or graph outputs
  SymSizes shape;                 // the iteration space
  std::optional<ReductionForm> reduction;  // set for groups with reductions
  double estimated_us = 0;        // fused
  double unfused_us = 0;          // the same ops run one by one
  std::vector<Decision> decisions;
  // Ops the kernel runs: its nodes but the lists its cats read.
  int num_ops() const;
};

// A step of the plan: a group (group >= 0) or one node run through ATen (node != nullptr).
struct PlanStep {
  int group = -1;
  Node* node = nullptr;
  std::string reason;  // for nodes run through ATen: why not fused
};

struct FusionPlan {
  std::vector<FusionGroup> groups;
  std::vector<PlanStep> steps;  // execution order
};

// Whether a node may be part of a generated kernel at all; `why` tells why not.
bool can_fuse_node(const Node& n, std::string* why);

// Greedy grouping over `g` (which must outlive the plan), then independent groups merged side by side
// where `horizontal` (Note [Horizontal fusion]). With fusion disabled each fusible node becomes its own
// group.
// Cats and stacks are stored by their items' kernel where `cat` (Note [Concatenation in kernels]);
// embeddings are read inside their consumers' kernels where `gather` (Note [Gathered loads]).
//
// Note [Decisions measured both ways]
// `refuse_decision` >= 0 makes the fusion the cost model accepts as its refuse_decision-th (0-based,
// counting every accepted merge, grown or side by side, in the order the fuser makes them) the other way:
// the two stay apart, with the decision "split for measurement (would fuse: est. A -> B us)", and
// everything after is decided afresh. `fusion-jit explain --measure-decisions` builds each such plan beside
// the plan as decided and times both, so that each decision is checked against measurement.
FusionPlan plan_fusion(const Graph& g, const CostModel& cost, bool enable_fusion = true, bool horizontal = true,
                       bool cat = true, bool gather = true, int refuse_decision = -1);

// The text a decision made the other way for measurement starts with.
inline constexpr const char* kRefusedForMeasurement = "split for measurement";

// The plan as text: groups with their ops, estimated costs and decisions, then the ATen steps with
// their reasons.
std::string explain_plan(const FusionPlan& p);

}  // namespace fusion_jit
