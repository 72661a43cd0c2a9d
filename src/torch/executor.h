// Running an ExecutablePlan on torch values: generated kernels on tensors allocated with eager's strides,
// ATen steps through the c10 dispatcher (boxed calls by schema), intermediates released when dead.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "driver/build_plan.h"  // PlanInstance holds what build_plan makes; its users build plans
#include "passes/passes.h"  // GemmTiming
#include "runtime/memory_plan.h"
#include "runtime/run_loop.h"
#include "support/content_hash.h"
#include "torch/capture.h"
#include "torch/cuda_support.h"

namespace fusion_jit {

// Note [Weights reordered once per content]
// With default settings a convolution's weight is an input of each call (torch.compile's graphs without
// freezing), and oneDNN reorders it into its blocked layout inside every call: for a conv net's weights
// that is a pass over every weight per call. The backend's lowering therefore writes a channels-last
// plan's convolutions on a weight input as mkldnn::_reorder_convolution_weight(W) and
// mkldnn::_convolution_pointwise on its result (Note [Channels-last activations], _lowering.py), and the
// executor keeps the reorder's last result with the step, under a 128-bit hash of W's bytes (XXH3-128,
// support/content_hash.h) and W's dtype, sizes and strides: a later call whose W has the same bytes takes
// it without reordering; any other W is reordered at that call. What decides is the content, read at each
// call, because nothing else sees every way a weight is written: a write through `.data`
// (`w.data.mul_()`, `.data.copy_()`: EMA updates, weight clipping, model surgery) moves the version
// counter of `.data`'s tensor, not W's; a numpy or DLPack view writes the bytes with no counter at all;
// an inference tensor has none. Hashing reads W once at memory speed, on the plan's threads for a large W,
// where the reorder reads W and writes its blocked copy (bench/RESULTS.md measures both per model). The
// memo holds the last reorder (the size of the weight) per step. A weight that is not a dense CPU tensor
// is reordered at every call.
struct ReorderMemo {
  std::mutex mu;
  bool kept = false;
  ContentHash hash;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  c10::IValue result;
  // The hash of `w`'s bytes (on the calling thread and the plan's pool), or nullopt where `w` is not a
  // dense, non-overlapping CPU tensor with storage.
  static std::optional<ContentHash> hash_of(const at::Tensor& w);
  // The memo's result where it was made from a tensor of `w`'s dtype, sizes and strides whose bytes
  // hashed to `h`; None otherwise.
  c10::IValue find(const at::Tensor& w, const ContentHash& h);
  // Keeps `result`, made from `w` whose bytes hashed to `h` before the reorder read them.
  void put(const at::Tensor& w, const ContentHash& h, const c10::IValue& result);
};

// One ATen step resolved at plan build (Note [ATen steps resolved at plan build]): the operator handle,
// the boxed stack with every literal argument converted once, and where the step's values go in it.
struct AtenCall {
  enum class Kind { kNone, kOp, kTensorList, kOptionalTensorList, kListUnpack };
  Kind kind = Kind::kNone;              // kNone: a kernel or constant step
  const c10::OperatorHandle* op = nullptr;
  std::vector<c10::IValue> stack;       // literals in place; value slots hold None
  std::vector<int> slots;               // stack positions of the value arguments, in order
  std::vector<int> ids;                 // their value ids
  std::vector<bool> move;               // the value dies at this step and is used once by it: moved in
  // A view made without the dispatcher (Note [Views made at plan build]): the result's sizes and strides,
  // taken from the plan's type; the base's storage and offset, plus view_offset elements (a slice's start
  // or a select's index times the dim's stride).
  bool fast_view = false;
  std::vector<int64_t> view_sizes, view_strides;
  int64_t view_offset = 0;
  // A split or chunk whose pieces are all such views (its list read by one ListUnpack): each piece's
  // sizes, strides and offset in elements.
  bool fast_split = false;
  std::vector<std::vector<int64_t>> piece_sizes, piece_strides;
  std::vector<int64_t> piece_offsets;
  // Note [Results written into a dying argument]: the op's in-place form, called instead where the
  // argument at stack position in_place_slot is, at run time, the only reference to its tensor and storage.
  const c10::OperatorHandle* in_place_op = nullptr;
  int in_place_slot = -1;
  // Note [Weights reordered once per content]: set for a reorder of a graph input.
  std::shared_ptr<ReorderMemo> memo;
  // The library chooses its results' layout at run time (Note [The layout of SDPA's result],
  // passes/attention_rules.cpp): a result laid out otherwise than its type is copied into that layout.
  bool conform = false;
};

struct PlanInstance {
  CapturedGraph captured;
  std::unique_ptr<ExecutablePlan> plan;
  std::vector<AtenCall> calls;          // per plan step (resolve_aten_steps)
  RunSchedule schedule;                 // resolve_aten_steps (Note [The run loop], runtime/run_loop.h)
  MemoryPlan memory;                    // resolve_aten_steps
  int64_t peak_bytes = 0;               // Note [Peak memory] (resolve_aten_steps)
  // A captured signature planned on its own: why it is not an instance of a shape class (Note [Shape
  // classes of captured graphs], torch/graph_function.h); "" otherwise.
  std::string class_note;
  // CUDA Graph replay (CompileOptions::cuda_graphs): captured at the first call after the compiling one.
  std::mutex graph_mu;
  bool graph_tried = false;
  std::unique_ptr<CudaGraphReplay> cuda_graph;
  std::string graph_note;  // why the plan is not replayed as a graph, when it is not
};

// Why the plan cannot be captured as a CUDA Graph for these inputs ("" when it can).
std::string cuda_graph_blocker(const ExecutablePlan& plan, const std::vector<c10::IValue>& inputs, int* device);

// The signature of a call, as bytes: per tensor its dtype, device, sizes, strides and requires_grad;
// non-tensor inputs by value (plans specialize on them).
// `as_device`: the signature the tensors would have on that device (a CUDA package built from CPU inputs).
std::string input_signature(const std::vector<c10::IValue>& inputs, const c10::Device* as_device = nullptr);
// The first tensor input that requires grad while grad mode is on (plans record no autograd history, so
// such a call cannot run a plan), or -1.
int grad_requiring_input(const std::vector<c10::IValue>& inputs);
// Why a call with these inputs must run eagerly (grad_requiring_input), naming the input, or "": the
// eager reason of CompiledModule's and GraphFunction's signature tables.
std::string grad_eager_reason(const std::vector<c10::IValue>& inputs);
// Marks the nodes that draw from a random generator (the dispatcher's nondeterministic_seeded tag;
// dropout with a literal train=False excepted) and those with mutating schemas as having side effects:
// passes then never merge, fold, remove or reorder them, and fusion leaves them to ATen in order.
void mark_side_effects(Graph& g);
// Note [Folded constants shared across signatures]
// With frozen weights, each input signature's plan folds its constants again: batch norm into the
// convolution's weight, the weights reordered for oneDNN (passes/prepack_rules.cpp). A served model that sees
// a new sequence length or batch size in every request built, per signature, a new copy of every folded
// weight (35 MB per length for a 1024-4096-1024 MLP, 129 MB per batch size for resnet18; 64 plans are
// kept). A module or graph function therefore keeps, per folded step, weak references to its results under
// a key made of the step's schema, its literals and its arguments' keys: a constant given with the graph
// (a root) by its TensorImpl and version counter, a folded one by the key of the step that made it. A later
// signature whose step has the same key takes the same tensors while a plan holds them, and a result no
// plan holds any more is made again. Roots are held here (they are the module's weights and their
// channels-last copies, alive anyway), so an address in a key is never another tensor's. The oneDNN
// reorders take the octave of their batch size as its hint (size_octave), so the signatures of an octave
// share them; MKL's packed GEMM is packed for its exact row count (ATen runs a plain GEMM for others), so
// dynamic plans leave it out (passes_skipped, torch/graph_function.h). The channels-last copies of frozen
// conv weights are kept between captures (ChannelsLastCopies, torch/capture.h; the backend's lowering in
// Python likewise), so that they are roots of the same key.
class FoldedConstants {
 public:
  // The key of a constant given with the graph: a tensor's TensorImpl (held from then on) and version
  // counter, a number's value; "" for anything else (its steps are not shared).
  std::string root_key(const c10::IValue& v);
  // Results of an earlier step with this key that a plan still holds, or nullopt.
  std::optional<std::vector<c10::IValue>> find(const std::string& key);
  // Keeps weak references to `results` (tensors only; otherwise nothing is kept).
  void put(const std::string& key, const std::vector<c10::IValue>& results);
  void clear();

 private:
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::mutex mu_;
  std::map<const void*, at::Tensor> roots_;
  std::map<std::string, std::vector<Weak>> entries_;
  size_t live_after_sweep_ = 0;
};
// Runs the pass pipeline on a captured graph (marking side effects first); ATen evaluates the subgraphs of constants (into the
// constants table). `skip`: passes, rule sets or rules left out (run_pipeline). `shared`: Note [Folded
// constants shared across signatures] (nullptr: none).
void optimize_captured(CapturedGraph& cap, const std::set<std::string>& skip = {}, FoldedConstants* shared = nullptr);
// optimize_captured for a plan on cuda:0 from a capture on the CPU (compile_cuda, CUDA packages): the graph
// is moved to cuda:0 before the passes, whose rules depend on the device (decompose's rms_norm; the oneDNN
// and MKL rules take CPU tensors only, the cuBLASLt and cuDNN epilogues CUDA tensors only), and the values
// they made (folded constants) after.
void optimize_captured_on_cuda(CapturedGraph& cap, std::set<std::string> skip);
// Whether oneDNN takes bfloat16 on this CPU, as eager's mkldnn ops check it (mkldnn::_is_mkldnn_bf16_supported),
// asked once; false without oneDNN.
bool onednn_bf16_supported();
// The gemm rules' timings in the kernel cache (gemm_choice.cpp, Note [GEMM backend measured on this
// machine]): the entry's key for a float32 linear [rows, k] x [k, n] (on a plain or a prepacked weight) at
// `threads` threads on this CPU, and its bytes read back (nullopt unless two positive finite numbers of
// microseconds and nothing else).
std::string gemm_timing_key(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked, int threads);
std::optional<GemmTiming> parse_gemm_timing(const std::string& text);
// The conv probe's entry for a shape's timings (the same parts as the GEMM's), and an entry read back:
// four positive finite numbers of microseconds and nothing else, or nothing.
std::string conv_timing_key(const ConvShape& s, int threads);
std::optional<ConvTiming> parse_conv_timing(const std::string& text);
// The conv probe's times for `s` (Note [Convolutions timed on this machine], passes/conv_common.h), also
// where FUSION_JIT_DISABLE has conv_timing (the Python backend reads that option as the environment is at
// each use); nullopt where oneDNN cannot run it.
std::optional<ConvTiming> time_convolution(const ConvShape& s);
// While it lives, this thread's large CPU allocations come from the buffer pool, as during a plan's run
// (Note [ATen steps' buffers from the pool], executor.cpp): the probes time the library calls as a plan
// runs them.
class PooledAllocations {
 public:
  PooledAllocations();
  ~PooledAllocations();
  PooledAllocations(const PooledAllocations&) = delete;
  PooledAllocations& operator=(const PooledAllocations&) = delete;
};
// The first line of an exception's message (c10's carry a backtrace).
std::string message_of(const std::exception& e);
// Note [Prepacked weights] (passes/passes.h): evaluates, once, each step of `inst.plan` that prepacks a
// weight from constants alone; its result becomes a new constant of `inst.captured.constants` and the step
// a constant step (the value keeps its id). Called when a package loads, before resolve_aten_steps.
// `shared`: results by step (schema, argument tensors and literals), so that signatures reading the same
// weight through the same step share one result. Throws fusion_jit::Error naming `where` and the step.
// Returns the number of steps evaluated.
int prepack_at_load(PlanInstance& inst, std::map<std::string, c10::IValue>* shared, const std::string& where);
// Runs a compiled instance: as a CUDA Graph when `cuda_graphs` is set and the plan can be captured (at
// its first call after this one), else step by step. `*replayed` says whether a graph replay served it.
c10::IValue run_instance(PlanInstance& inst, const std::vector<c10::IValue>& inputs, bool cuda_graphs,
                         const std::string& name, bool* replayed);

// Resolves the ATen steps of `inst.plan` (Note [ATen steps resolved at plan build]), folds views into
// kernel loads and plans memory; called once the plan is built, before the first run_plan. Throws
// fusion_jit::Error naming a schema the dispatcher lacks.
// `in_place`: steps may write their result into a dying argument (Note [Results written into a dying
// argument]); false where the module's disable option names "in_place".
void resolve_aten_steps(PlanInstance& inst, bool in_place = true);
// The memory plan's questions about ops (runtime/memory_plan.h: views, mutation, in-place forms),
// answered from the dispatcher's schemas.
const OpFacts& dispatcher_op_facts();
// What plans ask: the op table's data for its ops (TableOpFacts), dispatcher_op_facts() for the rest.
const OpFacts& plan_op_facts();
// runtime/memory_plan.h's eager_peak_bytes, plan_peak_bytes and plan_memory with plan_op_facts():
// Note [Peak memory], Note [Static memory plan], Note [Results written into a dying argument].
int64_t eager_peak_bytes(const Graph& g);
int64_t plan_peak_bytes(const ExecutablePlan& plan, const MemoryPlan* memory = nullptr);
MemoryPlan plan_memory(const ExecutablePlan& plan, bool in_place = true);
// explain's lines for what an instance decides: views made at plan build and folded into kernel loads,
// and the peak memory against eager's with the arena.
std::string instance_explain(const PlanInstance& inst);
// Runs the plan; returns the result in the shape the model returns (a value, tuple or list).
// `check_layouts`: each ATen step's tensor results are checked against their types in the graph (sizes,
// dtype, and strides but for size-1 dims and empty tensors), and a mismatch throws fusion_jit::Error
// naming the step; for a graph whose types were derived rather than seen at run time (Note [Symbolic
// graphs], python/fusion_jit/_symbolic.py), on its first run.
c10::IValue run_plan(const PlanInstance& p, const std::vector<c10::IValue>& inputs, bool check_layouts = false);
// `t` without its stride-0 dims (narrowed to one element): its distinct elements, so that copy_ can
// write it.
at::Tensor distinct_view(at::Tensor t);
// A copy of `t` in new storage with the same sizes and strides (expanded dims included).
at::Tensor clone_same_layout(const at::Tensor& t);
// `v` with fn applied to each tensor of it (a tensor, or the tensors of a tuple or a list of tensors).
c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn);
// `result` with every tensor that shares storage with one of `constants` (a folded result, a frozen
// tensor or a view of one) replaced by a copy: outputs are the caller's to keep and change, as eager
// computes them anew at every call. The same for those on the call's `arena` storage (a safety net:
// the memory plan never places a returned value there).
c10::IValue unalias_constants(c10::IValue result, const std::vector<c10::IValue>& constants,
                              const c10::StorageImpl* arena = nullptr);
// Calls an ATen op by schema ("aten::add.Tensor") through the dispatcher on a complete boxed stack;
// the results replace the stack.
void call_schema(const std::string& schema, std::vector<c10::IValue>& stack);
// Calls one node through the dispatcher with the given values for its value arguments (in order).
std::vector<c10::IValue> call_aten(const Node& n, const std::vector<c10::IValue>& value_args);

}  // namespace fusion_jit
