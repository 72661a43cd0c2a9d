// What the fuzzer's files share, beyond fuzzer.h's interface:
//   generator.cpp    the random recipes (seeds and draws, input tensors, ops over earlier values)
//   eager.cpp        eager replays of recipes under the oracle's preconditions (Note [The fuzzer's oracle
//                    and ill-conditioned cases], Note [The fuzzer's wider graphs])
//   oracle.cpp       fused runs of recipes judged against eager (check_batch)
//   fuzzer.cpp       the NVRTC check of a batch's CUDA kernels (CheckOptions::nvrtc_arch)
//   shape_class.cpp  the second size, and runs through one plan of a shape class (check_class)
//   shrinker.cpp     smaller recipes that still fail
//   report.cpp       recipes as text, TorchScript and repro files
//   campaign.cpp     the campaign loop (run)
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzzer.h"
#include "torch/executor.h"

namespace fusion_jit::fuzz {

// ---- Seeds (generator.cpp) ----

uint64_t mix(uint64_t a, uint64_t b);
// The torch generator's seed for a recipe's random ops: set before generation, before its eager replay
// and before its fused run.
uint64_t draw_seed(uint64_t recipe_seed);

inline bool is_float_code(int c) { return c == 5 || c == 6 || c == 7 || c == 15; }

// ---- The eager model (eager.cpp) ----

bool in_set(const std::string& fn, std::initializer_list<const char*> names);

// Per-value flags. Bits 2-3 hold the coarsest precision an inexact value was computed in:
// 1 float64, 2 float32, 3 float16/bfloat16 (its ulps bound how far two correct libraries may drift).
enum : uint8_t { kInexact = 1, kZeroSignUnspecified = 2 };
int precision_class(at::ScalarType t);
double class_eps(int c);

// The magnitudes of a sum-like op's summands, in float64 (Note [The fuzzer's oracle and ill-conditioned
// cases]); empty for other ops.
std::vector<at::Tensor> summands(const std::string& fn, const std::vector<c10::IValue>& args);

// The schemas of reductions, views, random ops and in-place ops (Note [The fuzzer's wider graphs]).
const std::vector<std::string>& reduction_schemas();
const std::vector<std::string>& view_schemas();
const std::vector<std::string>& random_schemas();
const std::vector<std::string>& inplace_schemas();
bool listed(const std::vector<std::string>& v, const std::string& s);
bool is_random_schema(const std::string& s);
// cat and stack: a recipe gives their items as value arguments before the dim; the graph, eager and the
// TorchScript source take them as a list.
bool is_cat_schema(const std::string& s);
bool is_gather_schema(const std::string& s);
bool is_structural_schema(const std::string& s);
// The out-of-place op of an in-place one ("aten::add_.Tensor" -> "aten::add.Tensor"), "" for others.
std::string inplace_base(const std::string& s);

// How much a reduction-like op amplifies relative errors of its input, per element of its result;
// undefined for amax, views and random ops.
at::Tensor structural_local_amp(const std::string& schema, const std::vector<c10::IValue>& args, const at::Tensor& res);

// Runs one op on `stack` (its result replaces the arguments) and gives its result's flags; false where
// eager rejects it or, with `check_preconditions`, where it breaks a precondition of the oracle.
bool eager_op(const std::string& schema, std::vector<c10::IValue>& stack, const std::vector<uint8_t>& arg_flags,
              uint8_t* out_flags, bool check_preconditions = true);

// Eager evaluation of a recipe; optionally builds its IR graph into `g` (appending inputs and nodes) and
// optionally in float64. Returns false when eager rejects an op.
struct Replay {
  std::vector<at::Tensor> values;  // inputs, then op results
  std::vector<uint8_t> flags;      // per value: see Note [The fuzzer's oracle and ill-conditioned cases]
  std::vector<Value*> ir;          // the same, in `g`
};

// `eager`: in the float64 replay, random ops take the values the eager replay drew (a float64 draw would
// give other numbers).
bool replay(const Recipe& r, const std::vector<at::Tensor>& inputs, bool to64, Graph* g, Replay* out,
            const Replay* eager = nullptr);

// ---- Fused runs against eager (oracle.cpp) ----

// Judges one recipe's fused outputs against eager's (the tolerance rule, the float64 reference, and
// the oracle's ulps for inexact values).
CaseResult judge(const Recipe& recipe, const std::vector<at::Tensor>& inputs, const Replay& eager_rp,
                 const std::vector<at::Tensor>& fused, size_t first);

// One batch at one size: each recipe's inputs and eager replay, and the graph that runs them all.
struct BatchRun {
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  std::vector<std::vector<at::Tensor>> inputs, before;
  std::vector<Replay> eager;
  std::vector<c10::IValue> all_inputs;
  explicit BatchRun(size_t n) : inputs(n), before(n), eager(n) {}

  // Recipe k's inputs (on the device of `co`) and its eager replay. False, with `why`, where eager rejects
  // the recipe or its replay raised.
  bool eager_ok(const Recipe& r, size_t k, const CheckOptions& co, bool seeded, CaseResult* why);
  // The same ops on the same inputs, into the graph (its inputs and outputs appended).
  void build(const Recipe& r, size_t k, bool seeded);
  // The inputs as eager left them (unchanged: no recipe built here mutates); the fused run must leave
  // them so.
  void keep_inputs();
  std::vector<at::Tensor> run(const PlanInstance& inst) const;
  // Each built recipe's outputs (in order among `fused`) against its eager replay, its inputs unchanged.
  void judge_all(const std::vector<Recipe>& recipes, const std::vector<bool>& built, const std::vector<at::Tensor>& fused,
                 std::vector<CaseResult>* results) const;
};

// ---- The NVRTC check (fuzzer.cpp) ----

// Kernels compiled with NVRTC so far, and the microseconds it took (Report::nvrtc_kernels, nvrtc_seconds).
extern std::atomic<int64_t> g_nvrtc_kernels;
extern std::atomic<int64_t> g_nvrtc_micros;

// The NVRTC check of a graph's CUDA kernels on a thread of its own, alongside the CPU run; its verdict
// fails the built recipes still passing when joined (at join(), or when it goes out of scope).
class NvrtcCheck {
 public:
  NvrtcCheck(const Graph& g, const std::string& arch, std::vector<CaseResult>* results, const std::vector<bool>& built);
  NvrtcCheck(const NvrtcCheck&) = delete;
  NvrtcCheck& operator=(const NvrtcCheck&) = delete;
  ~NvrtcCheck() { join(); }
  void join();

 private:
  std::future<std::string> f_;
  std::vector<CaseResult>* results_;
  std::vector<bool> built_;
};

}  // namespace fusion_jit::fuzz
