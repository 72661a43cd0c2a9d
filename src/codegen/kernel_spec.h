// KernelSpec: a fusion group as a device-neutral kernel description, made by the lowering
// (codegen/lowering.h) and printed by each target.
//
// The iteration space is the group's shape, with its dims reordered by the first output's strides
// (outermost first) and adjacent dims merged where every buffer allows, so that the innermost loop runs
// over unit strides whenever the layouts permit. Each buffer has a stride per iteration dim: broadcast
// dims have stride 0, per-channel arguments (batch_norm's) a stride only on the channel dim.
// The body is straight-line scalar code in the kernel IR (codegen/kernel_ir.h) over fj_* functions of the
// printers' preludes: it reads the buffer values `b<k>` (Load: already converted to their compute type)
// and assigns the outputs `o<k>`.
//
// Note [Gathered loads]
// `aten::embedding(table, indices)` (op category kGather) is computed where it is read: its kernel has an
// input buffer of the indices (their strides over the iteration space, none along the result's last dim)
// and, after it, a buffer of the table whose strides run along the last dim only, with `gather` naming
// the indices' buffer. Every printer loads a gathered element at its usual offset plus
// fj_gather_row(index, rows) * gather_stride, the index being the same element of the indices' buffer,
// read through load_ref. So a token embedding, the position embedding added to it and the layer norm
// after them are one kernel, with no [B, T, D] tensor written between them. `aten::gather(table, dim,
// indices)` is the same load with the table's strides along its other dims (the result has the indices'
// shape) and gather_stride the table's stride along `dim`. The fuser keeps a gather's
// table and indices outside its group (they are read from memory, never computed by the kernel) and
// makes the gather an element value of a reduction group, never a row value; a gathered buffer is a row
// buffer of a reduction kernel only when its indices' buffer is one too. Indices must lie in [0, rows):
// the CPU executor checks them before the launch and raises what eager raises (embedding's IndexError
// "index out of range in self", gather's "index I is out of bounds for dimension D with size S") without
// writing anything; the CUDA prelude's fj_gather_row traps, as eager's device assert does
// (the CPU prelude's reads row 0, never outside the table). The plan cache checks a gathered buffer's
// rows and row stride against its table's type and that its indices are an earlier integer input.
//
// Note [Reduction kernels]
// A group with reductions gives a kernel over rows: `sizes` are the kept dims (the first `kept_dims`,
// merged and ordered like the pointwise case) then the reduced dims; `rows` x `row_len` elements. Per row
// it loads the row buffers (stride 0 along every reduced dim) once, runs `row_prologue`, then each pass:
// a loop over the row's elements that loads the pass's element buffers, runs the pass body, feeds its
// accumulators and stores its element outputs, followed by the pass's `after` statements (accumulator
// results, then the row values they make known). Row outputs are stored after the last pass. Statements
// use the same variables as the pointwise body (`b<k>` buffers, `t<id>` values); an accumulator's result
// is the variable `acc<k>`, k counting the kernel's accumulators over its passes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"
#include "fusion/fusion.h"

namespace fusion_jit {

class Target;

struct KernelBuffer {
  const Value* value = nullptr;
  DType dtype = DType::kFloat32;
  bool is_output = false;
  SymSizes strides;              // per iteration dim, in elements
  SymInt extent = 0;             // elements reachable from the data pointer
  // Elements from the tensor's data pointer to the buffer's first element: the slices a cat's result is
  // stored into (Note [Concatenation in kernels]); the launch adds it. An output with an offset is stored
  // into the tensor an earlier output buffer of the kernel (offset 0) allocated.
  SymInt offset = 0;
  // A buffer read at rows that an index buffer picks (embedding's or gather's table, Note [Gathered loads]): its
  // strides cover the dims the row's elements run along; the element's offset adds gather_stride times
  // the index, the element of input buffer `gather` (an earlier one, int64 or int32) the loop is at.
  int gather = -1;
  SymInt gather_stride = 0;
  SymInt gather_rows = 0;
  // aten::gather's dim (an index outside the table raises naming it); -1 for embedding's rows.
  int64_t gather_dim = -1;
  // A buffer read only in piece `piece` of the kernel (Note [Cats of unequal items] in fusion/fusion.h):
  // along each dim that piece or one it lies in splits, its index counts from the deepest such piece's start.
  int piece = -1;
};

// A piece of a pointwise kernel (Note [Cats of unequal items]): the elements whose index along iteration
// dim `dim` lies in [start, end) (and inside the parent piece) run `body`, then set `var` (the piece's cat,
// of compute type `type`) to `value`. Pieces with one parent (and cat) split it; those no piece lies in
// are leaves. A leaf runs its own statements, then its parent's, up to the kernel's body.
struct KernelPiece {
  int parent = -1;
  int dim = 0;
  SymInt start = 0, end = 0;
  std::vector<Stmt> body;
  ExprRef value;
  std::string var;
  DType type = DType::kFloat32;
};

// One reduction in a pass: how it combines (AccKind), the dtype it accumulates in, and the per-element
// expression it reads.
struct KernelAccumulator {
  AccKind kind = AccKind::kSum;
  DType type = DType::kFloat32;
  ExprRef input;
};

struct KernelPass {
  std::vector<int> loads;                 // element buffers loaded per element
  std::vector<Stmt> body;                 // per element
  std::vector<KernelAccumulator> accs;    // named acc<k>, k counting over the kernel's passes
  std::vector<std::pair<int, std::string>> stores;  // element outputs: buffer index, variable
  std::vector<Stmt> after;                // once per row after the loop
  std::vector<std::string> stash_in;      // element values read from the row's scratch (before the body)
  std::vector<std::string> stash_out;     // element values saved to the row's scratch (after the body)
};

// What a kernel argument passes of its expression's value (KernelSpec::arg_of): the value, or, for a CUDA
// kernel's run-time divider (Note [Run-time dividers], in the CUDA target), the magic
// number or the shift of the size it divides by, so that a shape class's kernel computes them at each
// size from the size's expression instead of fixing the size.
enum class ArgOf : uint8_t { kValue = 0, kDividerMagic = 1, kDividerShift = 2 };
// A run-time divider of d (1 <= d <= 2^31 - 1): the magic number m and shift s with which
// (umulhi(n, m) + n) >> s is n / d for every n below 2^31.
struct RuntimeDivider {
  uint32_t magic = 0;
  uint32_t shift = 0;
};
// Error where d is out of that range.
RuntimeDivider runtime_divider(int64_t divisor);
// What an argument `of` passes for a value v of its expression (Error: a divider out of range).
int64_t arg_value_of(ArgOf of, int64_t v);

struct KernelSpec {
  std::string name;                 // fj_kernel_<group>
  int group = 0;
  Device device = Device::kCPU;     // the target: the device of the group's outputs
  SymSizes sizes;                   // iteration space after reordering and merging, at least one dim
  SymInt numel = 0;
  bool index32 = true;              // int32 offsets suffice for every buffer
  std::vector<KernelBuffer> buffers;  // argument order: inputs, then outputs
  std::vector<Stmt> body;           // statements (pointwise kernels)
  // Pointwise kernels split into pieces (Note [Cats of unequal items]), parents first.
  std::vector<KernelPiece> pieces;
  // The pieces from the kernel down to piece p, outermost first.
  std::vector<int> piece_path(int p) const;
  // The pieces no other lies in.
  std::vector<int> piece_leaves() const;
  // The element offset a buffer of piece p subtracts: along each dim its path splits, the deepest such
  // piece's start times the buffer's stride.
  SymInt piece_shift(const KernelBuffer& b) const;
  // Elements of the iteration dims after `dim`: one step of `dim` in the flat index.
  SymInt inner_elements(int dim) const;
  // Reduction kernels (rows > 0 or row_len > 0): Note [Reduction kernels].
  int kept_dims = 0;
  SymInt rows = 0, row_len = 0;
  std::vector<int> row_loads;
  std::vector<Stmt> row_prologue;
  std::vector<KernelPass> passes;
  std::vector<std::pair<int, std::string>> row_stores;
  // Expensive element values (exp of softmax) computed in one pass and read in a later one are kept in a
  // scratch row instead of computed again: variable, compute dtype. Rows too long for it recompute them.
  std::vector<std::pair<std::string, DType>> scratch;
  bool is_reduction() const { return !passes.empty(); }
  // The numbers the printed code reads at run time rather than as literals, in the order it reads them
  // (Note [Sizes as kernel arguments]): set by Target::print_source, empty for a target that prints
  // every number. `args` holds their values, which the launch passes; `arg_exprs` the same numbers as
  // SymInts, expressions over the symbols where the kernel is a shape class's (Note [Symbolic sizes]), so
  // that each size of the class computes its own `args` from its bindings (arg_values).
  std::vector<int64_t> args;
  std::vector<SymInt> arg_exprs;
  // Per argument, what it passes of its expression (empty: every argument its value).
  std::vector<ArgOf> arg_of;
};

// The kernel's arguments at `bindings` (its `args` when it has no symbols).
std::vector<int64_t> arg_values(const KernelSpec& k, const SymBindings& bindings);
// The kernel of a shape class at one of its sizes (Note [Plans of a shape class], runtime/plan.h): every
// size, stride, extent, offset, row count and piece bound evaluated at `bindings`, and `args` set to
// arg_values. Its code is the class's: nothing is printed again.
void evaluate_numbers(KernelSpec* k, const SymBindings& bindings);

// Note [Sizes as kernel arguments]
// A target may print a kernel's sizes, strides, row lengths and piece bounds as reads of an argument
// array instead of literals: `Target::print_source` then records in `KernelSpec::args` the values it
// put there, in order, and the launch passes them. The source of a plan is then the same for every
// input signature whose kernels differ only in those numbers (the same dims after merging, the same
// broadcast dims and unit strides, the same index width and the same schedule decisions), and the kernel
// cache, keyed by the source, compiles it once: a new sequence length or batch size reuses the compiled
// kernels. It is correct by construction: every decision a number takes part in (a stride of 0 or 1, a
// table that fits, int32 offsets, a row that fits a scratch buffer) is printed into the text, so two
// signatures share compiled code only when the printer wrote the same text for both, and each launch
// passes the values its own signature's printing recorded. A plan keeps `args` with its kernels (the
// plan cache stores them). A kernel of a shape class's graph (Note [Symbolic sizes]) records each
// argument's expression too (`arg_exprs`), and the printer's decisions on its sizes are guards, so one
// printing serves every size where they hold: `arg_values` gives that size's arguments. Both targets
// print them when PlanTarget::size_args is set (the FUSION_JIT_DYNAMIC option): the CPU's kernels take
// them as a pointer `z_`, the CUDA kernels as a parameter passed by value (`fj_sizes<N> z_`, Note [CUDA
// size arguments] in the CUDA target's printer).

// (NumberFn, kernel_ir.h: how a printer prints a number of the kernel, as a literal or an argument.)

// For the printers (Note [Sizes as kernel arguments]): the numbers of one kernel, printed as literals, or
// as `z<i>`, locals the kernel sets from its argument array, whose values are recorded in order (in
// `args`, and as SymInts in `exprs`). 0 and 1 stay literals either way: whether a stride is 0 or 1 decides
// what the code does (a guard where a symbolic number could be either). A number printed as a literal is
// read as a number: a symbolic one specializes.
class KernelNumbers {
 public:
  // Arguments into `k`'s args, arg_exprs and arg_of (cleared), or literals where `k` is null.
  explicit KernelNumbers(KernelSpec* k)
      : args_(k ? &k->args : nullptr), exprs_(k ? &k->arg_exprs : nullptr), of_(k ? &k->arg_of : nullptr) {
    if (k) k->args.clear(), k->arg_exprs.clear(), k->arg_of.clear();
  }
  std::string operator()(const SymInt& v) const {
    if (!args_ || v == 0 || v == 1) return std::to_string(static_cast<int64_t>(v));
    return push(v);
  }
  // `z<i>` passing what `of` derives from `size` (a divider's magic number or shift), whatever its value:
  // the text does not change with it, and a class's kernel derives it at each size. Only with arguments.
  std::string derived(const SymInt& size, ArgOf of) const { return push(size, of); }
  // As a 64-bit integer expression: `123LL` or `(long long)z4`.
  std::string wide(const SymInt& v) const {
    const std::string t = (*this)(v);
    return t[0] == 'z' ? "(long long)" + t : t + "LL";
  }
  bool arguments() const { return args_ != nullptr; }
  size_t count() const { return args_ ? args_->size() : 0; }
  NumberFn fn() const {
    return [this](const SymInt& v) { return (*this)(v); };
  }
  // fn() where the numbers are arguments, null where they are literals.
  NumberFn args_fn() const { return args_ ? fn() : nullptr; }
  // The kernel's first statements: its z<i>, in the offsets' type `I`, from the argument array `array`
  // (`z_`, or the CUDA parameter's `z_.v`). Every printer reads each argument once, as `z_[` or `z_.v[`
  // (plan_io counts them).
  std::string declarations(const std::string& array = "z_") const {
    std::string s;
    for (size_t i = 0; i < count(); ++i) s += "  const I z" + std::to_string(i) + " = (I)" + array + "[" + std::to_string(i) + "];\n";
    return s;
  }

 private:
  std::string push(const SymInt& v, ArgOf of = ArgOf::kValue) const {
    args_->push_back(arg_value_of(of, v.hint()));
    exprs_->push_back(v);
    of_->push_back(of);
    return "z" + std::to_string(args_->size() - 1);
  }
  std::vector<int64_t>* args_;
  std::vector<SymInt>* exprs_;
  std::vector<ArgOf>* of_;
};

// The variable every reduction kernel declares as its row length (the elements each row reduces), which
// its statements may read (mean's divisor): a literal or a size argument, as the printer prints sizes.
inline constexpr const char* kRowLength = "L_";

// For the printers: a buffer element `ref` of dtype `t` loaded into its compute type (float for f16 and
// bf16, through the preludes' fj_h2f / fj_bf2f), and a compute-type value `v` converted for storing.
std::string load_expr(DType t, const std::string& ref);
std::string store_expr(DType t, const std::string& v);
// For the printers: the element of buffer b the loop is at, `ref(b)` (`P[INDEX]`), moved to the row its
// gather picks, the index being `ref(gather)`, the same element of the index buffer (Note [Gathered
// loads]); `ref(b)` itself for other buffers. Every load of every printer goes through it. The table's
// row count and row stride are printed by `number` where given (Note [Sizes as kernel arguments]).
std::string load_ref(const KernelSpec& k, size_t b, const std::function<std::string(size_t)>& ref,
                     const NumberFn& number = nullptr);
// Whether any buffer of the kernel is gathered.
bool has_gathers(const KernelSpec& k);
// Note [Cats of unequal items], for the printers: whether `piece` is leaf `leaf` or one it lies in, and
// the statements a leaf runs before the kernel's body: its own, its value, then its parent's, and so on.
bool piece_on_path(const KernelSpec& k, int piece, int leaf);
std::vector<Stmt> piece_statements(const KernelSpec& k, int leaf);

// Whether a reduction kernel reduces across rows laid out next to each other (a column reduction, such as
// a sum over dim 0 of a row-major matrix): its first element buffer is contiguous along the innermost kept
// dim and strided along the (single) reduced dim. Both printers then walk tiles of neighbouring rows.
bool reduction_is_column(const KernelSpec& k);

// For the printers of reduction kernels: "group N: R rows of L elements as [kept | reduced]"; with
// `sizes` false (a source whose numbers are arguments), "group N: K kept and R reduced dims".
std::string reduction_summary(const KernelSpec& k, bool sizes = true);

// Note [Offsets]
// The one emitter of index arithmetic: statements that turn a flat index over the iteration dims
// [lo, hi) (row-major, the last dim fastest) into per-buffer element offsets. For each dim from the
// innermost out: its coordinate is the index modulo the dim's size (the outermost takes the rest), the
// index is divided by it, and each buffer moving along the dim adds coordinate * stride. The offsets
// (declared by the caller, starting at 0 or a base) may be int32 by KernelSpec::index32.
struct OffsetNames {
  std::string index;   // the flat index variable, divided down as dims are peeled
  std::string coord;   // the current dim's coordinate
  std::string offset;  // per-buffer offset variables: <offset><b>
  bool short_unit_stride = false;  // `off += c` for stride 1 (else `off += c * 1`)
  bool skip_unused_dims = false;   // a dim no buffer moves along only divides the index
  // How a size or a stride other than 0 and 1 is printed (Note [Sizes as kernel arguments]); null:
  // as a literal.
  NumberFn number = nullptr;
  // A target's own division of the index by a dim's size (a run-time divider): given the index, the
  // coordinate ("" when only the quotient is needed) and the size, the statements that set the
  // coordinate to the remainder and the index to the quotient, or "" for the plain `%` and `/`.
  std::function<std::string(const std::string&, const std::string&, const SymInt&)> divide = nullptr;
};
std::string offsets_code(const KernelSpec& k, size_t lo, size_t hi, const OffsetNames& names, const std::string& indent);
// The statements that turn the row index in `r_` into per-buffer offsets `roff<b>` over the first `dims`
// dims (`c_` is scratch); `number` as in OffsetNames.
std::string row_offsets_code(const KernelSpec& k, size_t dims, const std::string& indent,
                             const NumberFn& number = nullptr);

// The value an accumulator of `kind` accumulating in `type` starts from, as C text.
std::string reduction_identity(AccKind kind, DType type);

// How eager's CPU kernels compute where that depends on the machine's CPU (ATen dispatches by CPU
// capability): asked once, at first use, of the probe the torch adapter registers (without one, as in
// the torch-free unit tests, the defaults).
struct EagerCpuMath {
  // Whether eager's gelu (erf form) of a float32, bfloat16 or float16 tensor that is contiguous and has
  // more than one element goes through oneDNN, whose gelu is NaN at +-inf. Other tensors (strided,
  // channels-last, one element) and dtypes oneDNN does not take on this CPU go through ATen's own loop:
  // 0.5 * x * (1 + erf(x / sqrt 2)), +inf at +inf and NaN at -inf. Seen: float32 always; bfloat16 with
  // AVX512-BF16; float16 on Intel Xeon with AVX512-FP16, not on AMD EPYC. Target::gelu_fn picks by the
  // input's layout.
  bool gelu_onednn_f32 = true, gelu_onednn_bf16 = true, gelu_onednn_f16 = true;
  bool gelu_onednn(DType t) const {
    return t == DType::kFloat32 ? gelu_onednn_f32 : t == DType::kBFloat16 ? gelu_onednn_bf16 : t == DType::kFloat16 && gelu_onednn_f16;
  }
  std::string key() const {  // for plan cache keys
    return std::string("gelu-onednn") + "01"[gelu_onednn_f32] + "01"[gelu_onednn_bf16] + "01"[gelu_onednn_f16];
  }
};
const EagerCpuMath& eager_cpu_math();
void set_eager_cpu_math_probe(EagerCpuMath (*probe)());

// Note [Kernel hooks]
// Test-only injection points into code generation: the fuzzer's self-test plants known bugs through them
// (tests/torch/fuzz_test.cpp) to prove that the fuzzer catches each. Nothing else sets them. While any is
// set, plans are neither read from nor written to the plan cache (the driver checks `empty()`), and the
// generated sources, hence the kernel cache keys, differ by what the hooks change.
struct KernelHooks {
  // A pointwise kernel after its buffers are known, their strides still over the group's shape (before
  // dims are ordered and merged).
  void (*before_layout)(const FusionGroup& group, KernelSpec& kernel) = nullptr;
  // Every kernel once lowered.
  void (*after_lowering)(const FusionGroup& group, KernelSpec& kernel) = nullptr;
  // Text appended to a target's preludes, before the kernels, by target name ("cpu").
  std::map<std::string, std::string> preludes;
  const std::string& prelude(const std::string& target) const {
    static const std::string none;
    auto it = preludes.find(target);
    return it == preludes.end() ? none : it->second;
  }
  bool empty() const { return !before_layout && !after_lowering && preludes.empty(); }
};
// Not synchronized: set them before compiling, reset them (to KernelHooks{}) after.
void set_kernel_hooks(KernelHooks hooks);
const KernelHooks& kernel_hooks();

}  // namespace fusion_jit
