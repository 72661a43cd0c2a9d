// The differential fuzzer: random graphs of fusible ops, run fused and eagerly, compared.
//
// A case is a Recipe: input specifications (dtype, sizes, layout, values) and a list of ATen ops over
// earlier values with literal arguments. Generation is driven by eager PyTorch: each op is run on the
// concrete tensors as it is added, so only ops that eager accepts enter a graph, and the IR takes its
// types from eager's results. Cases run in batches (the disjoint union of several graphs in one plan, one
// compile). A failing case is shrunk (outputs, ops, shapes, values) and written as a TorchScript model
// and an inputs file that `fusion-jit run MODEL --inputs FILE --check` replays.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fusion_jit::fuzz {

enum class Layout { kContiguous, kTransposed, kSliced, kExpanded, kChannelsLast, kHugeStride };

struct InputSpec {
  int dtype = 6;                  // c10::ScalarType code
  std::vector<int64_t> sizes;
  Layout layout = Layout::kContiguous;
  uint64_t value_seed = 0;
  bool specials = true;           // NaN, +-Inf, +-0, extremes among the values
};

struct RecipeArg {
  int value = -1;                 // index into inputs, then op results; -1: the literal
  Literal literal;
};

struct OpSpec {
  std::string schema;
  std::vector<RecipeArg> args;
};

struct Recipe {
  uint64_t seed = 0;
  std::vector<InputSpec> inputs;
  std::vector<OpSpec> ops;
  std::vector<int> outputs;       // value indices
  std::string describe() const;   // one line per op
};

// The same tensor on another device: its whole storage moved, then viewed with the same sizes, strides
// and offset (Tensor::to would make expanded and sliced inputs contiguous).
at::Tensor to_device_same_layout(const at::Tensor& t, const at::Device& device);

// The recipes at other extents: each input extent e >= 2 becomes e + 1..5 (one choice per distinct extent
// for the whole batch, from the first recipe's seed, so inputs that broadcast together still do, and
// graphs whose groups run over one iteration space, merged side by side in the batch's plan, still do),
// and so do the sizes a view, reshape or expand names; 0 and 1 stay, and so does 2 where a huge-stride
// input has two rows. The ops are the same; a recipe eager rejects at the new extents (a literal slice
// bound, a reshape of a product) is skipped by check_batch as any other.
std::vector<Recipe> resized(const std::vector<Recipe>& batch);
// resized()'s choice: each extent that changes, and its value at the second size.
std::map<int64_t, int64_t> second_extents(const std::vector<Recipe>& batch);
// Whether the recipe's gathers (embedding, gather) take indices within their tables: eager replayed on
// the CPU, where an index out of range raises. On CUDA such an index stops the process (a device-side
// assert), so check_batch with CheckOptions::cuda skips a recipe that fails this, as one eager rejects.
bool gathers_in_range(const Recipe& r);

// Makes the input tensors of a recipe (deterministic from the specs).
std::vector<at::Tensor> make_inputs(const Recipe& r);
// What a recipe's ops are drawn from besides the elementwise ops of the op table: per op, the chance of
// a reduction or normalization (sum, mean, amax, var, softmax, log_softmax, layer_norm, rms_norm over
// random dims), of a view (view, reshape, permute, transpose, expand, slice, select, squeeze,
// unsqueeze), of a random op (rand_like, randn_like, bernoulli, dropout in training); per recipe, the
// chance of one in-place op on an input (add_, sub_, mul_, clamp_min_, relu_, neg_), which makes the
// recipe one that runs through TorchScript capture. See Note [The fuzzer's wider graphs].
struct GenOptions {
  double reductions = 0.10;
  double views = 0.10;
  double random_ops = 0.03;
  double inplace = 0.03;
  double cats = 0.05;  // cat and stack of 2-3 values of one shape (Note [Concatenation in kernels])
  // embedding of a 2-d value's rows by an integer value (Note [Gathered loads]); where no integer value
  // lies within the rows, the remainder of one by the row count, for a later draw.
  double gathers = 0.04;
  // batch_norm in inference over a float value of rank >= 2, its per-channel arguments 1-d values of its
  // channel count; without them, a [C] mean of the value, for a later draw.
  double batch_norms = 0.04;
  // Elementwise ops only (the generator of campaigns 1-4).
  static GenOptions elementwise_only() { return {0, 0, 0, 0, 0, 0, 0}; }
};

// A random recipe of 2 to 16 ops.
Recipe generate(uint64_t seed, const GenOptions& gen = {});
// Whether a recipe has random ops (checked alone, with the torch generator seeded alike for the eager
// and the fused run) or an in-place op (checked alone through TorchScript capture and compile()).
bool has_random_ops(const Recipe& r);
bool has_inplace_ops(const Recipe& r);
// Whether a cat of the recipe joins items of unequal sizes (Note [Cats of unequal items]); replays it.
bool has_ragged_cats(const Recipe& r);

struct CaseResult {
  bool ok = true;
  std::string message;  // the first mismatch
  bool rejected = false;  // eager rejects the recipe (shapes that do not broadcast, say): nothing compared
  static CaseResult rejected_by_eager() { return {true, "eager rejects this recipe", true}; }
};

struct CheckOptions {
  // Run on cuda:0 against eager CUDA (inputs keep their layouts, offsets and strides there).
  bool cuda = false;
  // Also generate each batch's kernels for a GPU and compile them with NVRTC for this architecture
  // ("sm_90"; no GPU needed): a compile error or a spill fails the batch's recipes. Empty: off.
  std::string nvrtc_arch;
  // shrink(): a recipe fails where it fails through one plan of its shape class at its size and its
  // second size (check_class), as a failure found there does.
  bool through_class = false;
};

// Runs recipes in one plan and checks each against eager; one result per recipe.
std::vector<CaseResult> check_batch(const std::vector<Recipe>& recipes, const CheckOptions& co = {});
// Runs the recipes through one plan of their shape class at their sizes and at resized(recipes)'s, each
// instance against eager (Note [The fuzzer's shape classes]); a recipe with random ops through a class of
// its own, seeded. Recipes with in-place ops, and those eager rejects at either size, are not covered;
// nor is any where the graph does not generalize or the second size fails a guard of the class (`why`
// says which, for the batch's graph).
struct ClassCheck {
  std::vector<CaseResult> results;  // per recipe; ok where not covered
  std::vector<bool> covered;
  std::string why;                  // "" where the class plan ran at both sizes
  bool outside = false;             // the second size fails a guard of the class
  std::string class_ir;             // the class's graph, where generalized
};
ClassCheck check_class(const std::vector<Recipe>& recipes, const CheckOptions& co = {});
// Smaller recipe that still fails (or the same one).
Recipe shrink(const Recipe& r, const std::function<void(const std::string&)>& log, const CheckOptions& co = {});
// TorchScript source of a recipe's forward.
std::string torchscript_source(const Recipe& r);
// Writes DIR/repro-SEED.pt (the model), DIR/repro-SEED-inputs.pt and DIR/repro-SEED.txt; returns the
// command that replays it.
std::string write_repro(const Recipe& r, const std::string& message, const std::string& dir, const std::string& cli);

struct Options {
  uint64_t seed = 1;
  int64_t max_graphs = 2000;
  double max_seconds = 0;         // 0: no time limit
  int batch = 16;
  std::string repro_dir;          // "" : no repros written
  std::string cli = "fusion-jit";
  bool stop_at_first_failure = false;
  bool shrink = true;
  CheckOptions check;
  // When set: only these graph seeds (as a failure's "graph seed N" names them), in batches, and the rest
  // of the campaign options are ignored. For re-checking a campaign's findings after a fix.
  std::vector<uint64_t> graph_seeds;
  GenOptions gen;
  // Each batch is checked again at a second size (resized()): a graph failing there fails, shrunk and
  // replayed at that size.
  bool second_size = false;
};

struct Report {
  int64_t graphs = 0;
  int64_t rejected = 0;  // of them, graphs eager rejects: not compared, neither passed nor failed
  int64_t ops = 0;
  int64_t nvrtc_kernels = 0;      // kernels compiled with NVRTC (CheckOptions::nvrtc_arch)
  double nvrtc_seconds = 0;
  double seconds = 0;
  int64_t second_batches = 0;     // Options::second_size: batches checked at their second size
  int64_t second_shared = 0;      // of them, those checked there without a compiler run
  int64_t class_batches = 0;      // of them, those whose graph ran through one plan of its class at both sizes
  int64_t class_graphs = 0;       // graphs run through a plan of their class at both sizes (those batches',
                                  // and each graph with random ops, through a class of its own)
  int64_t class_outside = 0;      // batches whose second size failed a guard of the class
  int64_t class_not_generalized = 0;  // batches whose graph fit no class (their texts differ beyond numbers)
  std::string class_outside_example;  // the first such reason, for the report
  std::vector<std::string> failures;  // message and, where written, the repro command
};

Report run(const Options& opt, const std::function<void(const std::string&)>& log);

}  // namespace fusion_jit::fuzz
