#include "targets/cuda/cuda_printer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "support/error.h"

namespace fusion_jit {
namespace {

const char* kPrelude =
#include "codegen/libm_functions.inc"
#include "targets/cuda/cuda_prelude.inc"
    ;
const char* kHalfPrelude =
#include "targets/cuda/cuda_prelude_half.inc"
    ;
const char* kCommonPrelude =
#include "codegen/common_prelude.inc"
    ;
const char* kReducePrelude =
#include "targets/cuda/cuda_prelude_reduce.inc"
    ;
// 128-bit (or narrower) vectors of N elements, aligned to their size.
const char* kVector =
    "template <class T, int N> struct alignas(sizeof(T) * N) fj_vec { T v[N]; };\n"
    "template <int N> struct fj_sizes { long long v[N]; };  // Note [CUDA size arguments]\n";

std::string storage_type(DType t) {
  if (t == DType::kFloat16) return "__half";
  if (t == DType::kBFloat16) return "__nv_bfloat16";
  return dtype_c_type(t);
}

std::string compute_type(DType t) { return compute_c_type(t); }


bool uses_reduced_floats(const KernelSpec& k) {
  for (const auto& b : k.buffers)
    if (is_reduced_float(b.dtype)) return true;
  std::vector<const std::vector<Stmt>*> parts = {&k.body, &k.row_prologue};
  for (const auto& p : k.passes) parts.insert(parts.end(), {&p.body, &p.after});
  for (const auto& p : k.pieces) {
    parts.push_back(&p.body);
    if (rounds_reduced_float(*p.value)) return true;
  }
  for (const auto* part : parts)
    for (const auto& st : *part)
      if (rounds_reduced_float(*st.value)) return true;
  return false;
}

// Note [CUDA size arguments]
// With sizes as arguments (Note [Sizes as kernel arguments]) a CUDA kernel takes its numbers after its
// buffers as one parameter passed by value, `const fj_sizes<N> z_` (N 64-bit integers), and its first
// statements copy them into the locals `z<i>` of the offsets' type. Passed by value, they reach the
// kernel in its parameter space (constant memory, no device allocation, captured as they are by a CUDA
// graph) and the launch passes the address of the plan's `args` as that parameter's value. A kernel
// whose numbers and pointers would not fit the 4 KB of parameters every architecture takes
// (kCudaParamBytes) is printed with literals instead: it is then specialized to its signature, as every
// CUDA kernel was before.
constexpr size_t kCudaParamBytes = 4000;

// The kernel's first lines, printed once its statements are (they depend on the numbers those print):
// `extern "C" __global__ void ... NAME(typed pointers p<b>[, sizes z_]) {`, the offsets' type `I`, and the
// size locals z<i> (Note [CUDA size arguments]).
std::string kernel_head(const KernelSpec& k, const KernelNumbers& z) {
  std::string params;
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const auto& kb = k.buffers[b];
    params += params.empty() ? "" : ", ";
    params += fmt::format("{}{}* __restrict__ p{}", kb.is_output ? "" : "const ", storage_type(kb.dtype), b);
  }
  if (z.count() > 0) params += fmt::format(", const fj_sizes<{}> z_", z.count());
  return fmt::format("extern \"C\" __global__ void __launch_bounds__({}, {}) {}({}) {{\n  typedef {} I;\n", kCudaBlockSize,
                     kCudaMinBlocksPerSm, k.name, params, k.index32 ? "int" : "long long") +
         z.declarations("z_.v");
}

size_t first_output(const KernelSpec& k) {
  size_t f = 0;
  while (f < k.buffers.size() && !k.buffers[f].is_output) ++f;
  return f;
}

// Note [Run-time dividers]: with int32 offsets and sizes as arguments, the index divided by a size through
// its magic number and shift (both arguments, whatever their values, so that the text does not depend on
// them); otherwise "" (the plain `%` and `/`).
// The magic number and shift are derived arguments of the size (KernelSpec::arg_of): a shape class's
// kernel computes them from the size's expression at each size, so the divider does not fix the size.
std::function<std::string(const std::string&, const std::string&, const SymInt&)> dividers(const KernelSpec& k,
                                                                                              const KernelNumbers& z) {
  if (!z.arguments() || !k.index32) return nullptr;
  return [&z](const std::string& index, const std::string& coord, const SymInt& size) -> std::string {
    const std::string d = z(size);
    if (d[0] != 'z') return "";  // 0 or 1: a literal, so a constant divisor
    // (The shift first: the order these arguments have always had.)
    const std::string shift = z.derived(size, ArgOf::kDividerShift);
    const std::string magic = z.derived(size, ArgOf::kDividerMagic);
    const std::string q = fmt::format("(I)fj_udiv((unsigned){}, (unsigned){}, (unsigned){})", index, magic, shift);
    if (coord.empty()) return fmt::format("{} = {};", index, q);
    return fmt::format("{{ const I dq_ = {0}; {1} = {2} - dq_ * {3}; {2} = dq_; }}", q, coord, index, d);
  };
}

// `offK = ...` for every buffer, from the flat index `i` (an I), decomposed over the dims.
void print_offsets(const KernelSpec& k, const std::string& indent, const KernelNumbers& z, std::string& s) {
  size_t nd = k.sizes.size();
  s += indent + "I r_ = i, c_;\n";
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("{}I off{} = 0;\n", indent, b);
  s += offsets_code(k, 0, nd,
                    {"r_", "c_", "off", /*short_unit_stride=*/true, /*skip_unused_dims=*/true, z.args_fn(), dividers(k, z)},
                    indent);
}

// Note [Sizes in device functions]
// A statement may read a size as a number (`x + x.shape[1]`, a mean's divisor after a row). In a shape
// class's kernel that number is a size argument (literal_text), but the pointwise body and the pieces are
// device functions outside the kernel, where the kernel's locals z<i> are not in scope: each such function
// takes the locals its statements read as parameters (`long long z<i>`), and its calls pass them. Printed
// as literals, the number would fix the size it reads.
struct DeviceNumbers {
  explicit DeviceNumbers(const KernelNumbers& z) : z_(z) {}
  // How the function's statements print numbers: the kernel's, recording each argument they read.
  NumberFn fn() {
    if (!z_.arguments()) return nullptr;
    return [this](const SymInt& v) {
      std::string n = z_(v);
      if (n[0] == 'z') read.push_back(n);
      return n;
    };
  }
  // ", long long z3, long long z4" for the signature and ", z3, z4" for a call; without the leading ", "
  // where they are the only ones (`alone`).
  std::string params(bool alone) const { return join(alone, "long long "); }
  std::string call_args(bool alone) const { return join(alone, ""); }
  std::vector<std::string> read;

 private:
  std::string join(bool alone, const char* type) const {
    std::string s;
    for (size_t i = 0; i < read.size(); ++i) s += (alone && i == 0 ? "" : ", ") + std::string(type) + read[i];
    return s;
  }
  const KernelNumbers& z_;
};

// The call of the body function with loaded values `in(b)` and output variables `out(b)`; with pieces
// (Note [Cats of unequal items]), the outermost cat's value after the inputs, the pieces' own buffers left
// out.
template <class In, class Out>
std::string body_call(const KernelSpec& k, const KernelNumbers& z, const DeviceNumbers& body, In in, Out out) {
  std::string args;
  const size_t fo = first_output(k);
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    if (k.buffers[b].piece >= 0) continue;
    if (b == fo && !k.pieces.empty()) args += (args.empty() ? "" : ", ") + k.pieces.front().var;
    args += args.empty() ? "" : ", ";
    args += k.buffers[b].is_output ? out(b) : load_expr(k.buffers[b].dtype, load_ref(k, b, in, z.args_fn()));
  }
  return fmt::format("{}_body({}{});", k.name, args, body.call_args(args.empty()));
}

// Note [Cats of unequal items]: each leaf piece as a device function of the values of its buffers (and
// those of the pieces it lies in) returning the outermost cat's value there.
// Their size arguments (Note [Sizes in device functions]) go into `leaf_numbers`, one per leaf.
void print_pieces(const KernelSpec& k, const KernelNumbers& z, std::map<int, DeviceNumbers>& leaf_numbers,
                  std::string& s) {
  for (int leaf : k.piece_leaves()) {
    std::string params;
    for (size_t b = 0; b < k.buffers.size(); ++b)
      if (k.buffers[b].piece >= 0 && piece_on_path(k, k.buffers[b].piece, leaf))
        params += fmt::format("{}const {} b{}", params.empty() ? "" : ", ", compute_type(k.buffers[b].dtype), b);
    const KernelPiece& root = k.pieces[static_cast<size_t>(k.piece_path(leaf).front())];
    DeviceNumbers& numbers = leaf_numbers.emplace(leaf, DeviceNumbers(z)).first->second;
    std::string body;
    for (const auto& st : piece_statements(k, leaf)) body += "  " + print_stmt(st, numbers.fn()) + "\n";
    s += fmt::format("FJ_INLINE {} {}_leaf{}({}{}) {{\n", compute_type(root.type), k.name, leaf, params,
                     numbers.params(params.empty()));
    s += body + "  return " + root.var + ";\n}\n";
  }
}

// In the scalar loop: the leaf piece the element at flat index `i` lies in runs, setting the outermost
// cat's variable; the leaf's buffers are read at offsets counted from its pieces' starts.
void print_piece_choice(const KernelSpec& k, const std::string& indent, const KernelNumbers& z,
                        const std::map<int, DeviceNumbers>& leaf_numbers, std::string& s) {
  std::set<int> dims;
  for (const auto& p : k.pieces) dims.insert(p.dim);
  for (int d : dims) s += fmt::format("{}const I pc{}_ = (i / {}) % {};\n", indent, d, z(k.inner_elements(d)), z(k.sizes[d]));
  const KernelPiece& root = k.pieces.front();
  s += fmt::format("{}{} {};\n", indent, compute_type(root.type), root.var);
  const auto leaves = k.piece_leaves();
  for (size_t l = 0; l < leaves.size(); ++l) {
    std::string args, cond;
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      const auto& kb = k.buffers[b];
      if (kb.piece < 0 || !piece_on_path(k, kb.piece, leaves[l])) continue;
      auto ref = [&](size_t x) { return fmt::format("p{}[off{} - {}]", x, x, z(k.piece_shift(k.buffers[x]))); };
      args += (args.empty() ? "" : ", ") + load_expr(kb.dtype, load_ref(k, b, ref, z.args_fn()));
    }
    for (int p : k.piece_path(leaves[l])) {
      const KernelPiece& pc = k.pieces[static_cast<size_t>(p)];
      cond += fmt::format("{}pc{}_ >= {} && pc{}_ < {}", cond.empty() ? "" : " && ", pc.dim, z(pc.start), pc.dim, z(pc.end));
    }
    args += leaf_numbers.at(leaves[l]).call_args(args.empty());
    s += fmt::format("{}{}{}{} = {}_leaf{}({});\n", indent, l ? "else " : "",
                     l + 1 < leaves.size() ? "if (" + cond + ") " : "", root.var, k.name, leaves[l], args);
  }
}

void print_kernel(const KernelSpec& k, const KernelNumbers& z, std::string& s) {
  size_t nd = k.sizes.size();
  const int vec = cuda_vector_width(k);
  const size_t fo = first_output(k);
  if (z.arguments()) {
    s += fmt::format("\n// group {}: {} dims, {} offsets, vector width {}\n", k.group, nd, k.index32 ? "int32" : "int64", vec);
  } else {
    s += fmt::format("\n// group {}: {} elements as [", k.group, static_cast<int64_t>(k.numel));
    for (size_t d = 0; d < nd; ++d) s += (d ? "," : "") + std::to_string(static_cast<int64_t>(k.sizes[d]));
    s += fmt::format("], {} offsets, vector width {}\n", k.index32 ? "int32" : "int64", vec);
  }
  // The scalar body as a device function.
  std::string params;
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const auto& kb = k.buffers[b];
    if (kb.piece >= 0) continue;
    if (b == fo && !k.pieces.empty())
      params += fmt::format("{}const {} {}", params.empty() ? "" : ", ", compute_type(k.pieces.front().type),
                            k.pieces.front().var);
    params += params.empty() ? "" : ", ";
    params += kb.is_output ? fmt::format("{}& o{}", compute_type(kb.dtype), b - fo)
                           : fmt::format("const {} b{}", compute_type(kb.dtype), b);
  }
  std::map<int, DeviceNumbers> leaf_numbers;
  print_pieces(k, z, leaf_numbers, s);
  DeviceNumbers body_numbers(z);
  std::string body;
  for (const auto& st : k.body) body += "  " + print_stmt(st, body_numbers.fn()) + "\n";
  s += fmt::format("FJ_INLINE void {}_body({}{}) {{\n", k.name, params, body_numbers.params(params.empty()));
  s += body + "}\n";
  // The kernel: its statements first, then its signature and size locals, which depend on the numbers
  // the statements print (Note [CUDA size arguments]).
  std::string t;
  const std::string numel = z.wide(k.numel);
  t += "  const long long tid_ = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
  t += "  const long long stride_ = (long long)gridDim.x * blockDim.x;\n";
  t += "  long long first_ = tid_;  // the scalar loop's first element\n";
  auto decl_out = [&](const std::string& indent) {
    for (size_t b = fo; b < k.buffers.size(); ++b)
      t += fmt::format("{}{} o{};\n", indent, compute_type(k.buffers[b].dtype), b - fo);
  };
  if (vec > 1) {
    std::string aligned;
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      if (k.buffers[b].strides[nd - 1] != 1) continue;
      aligned += aligned.empty() ? "" : " | ";
      aligned += fmt::format("((unsigned long long)p{} % {})", b, vec * dtype_size(k.buffers[b].dtype));
    }
    t += fmt::format("  const long long nvec_ = {} / {};  // whole vectors\n", numel, vec);
    t += fmt::format("  if (({}) == 0) {{\n", aligned);
    t += "    for (long long v_ = tid_; v_ < nvec_; v_ += stride_) {\n";
    t += fmt::format("      const I i = (I)(v_ * {});\n", vec);
    print_offsets(k, "      ", z, t);
    for (size_t b = 0; b < fo; ++b) {
      const auto& kb = k.buffers[b];
      if (kb.strides[nd - 1] == 1)
        t += fmt::format("      const fj_vec<{0}, {1}> x{2} = *(const fj_vec<{0}, {1}>*)(p{2} + off{2});\n",
                         storage_type(kb.dtype), vec, b);
      else
        t += fmt::format("      const {0} x{1} = p{1}[off{1}];\n", storage_type(kb.dtype), b);
    }
    for (size_t b = fo; b < k.buffers.size(); ++b)
      t += fmt::format("      fj_vec<{}, {}> y{};\n", storage_type(k.buffers[b].dtype), vec, b);
    // One body per element, written out: a loop indexing the vectors would leave them in local memory
    // wherever the unroller gives up.
    for (int e = 0; e < vec; ++e) {
      t += "      {\n";
      decl_out("        ");
      t += "        " +
           body_call(
               k, z, body_numbers,
               [&](size_t b) {
                 return k.buffers[b].strides[nd - 1] == 1 ? fmt::format("x{}.v[{}]", b, e) : fmt::format("x{}", b);
               },
               [&](size_t b) { return fmt::format("o{}", b - fo); }) +
           "\n";
      for (size_t b = fo; b < k.buffers.size(); ++b)
        t += fmt::format("        y{}.v[{}] = {};\n", b, e, store_expr(k.buffers[b].dtype, fmt::format("o{}", b - fo)));
      t += "      }\n";
    }
    for (size_t b = fo; b < k.buffers.size(); ++b)
      t += fmt::format("      *(fj_vec<{0}, {1}>*)(p{2} + off{2}) = y{2};\n", storage_type(k.buffers[b].dtype), vec, b);
    t += "    }\n";
    t += fmt::format("    first_ = nvec_ * {} + tid_;\n  }}\n", vec);
  }
  t += fmt::format("  for (long long e_ = first_; e_ < {}; e_ += stride_) {{\n", numel);
  t += "    const I i = (I)e_;\n";
  print_offsets(k, "    ", z, t);
  if (!k.pieces.empty()) print_piece_choice(k, "    ", z, leaf_numbers, t);
  decl_out("    ");
  t += "    " +
       body_call(k, z, body_numbers, [&](size_t b) { return fmt::format("p{0}[off{0}]", b); },
                 [&](size_t b) { return fmt::format("o{}", b - fo); }) +
       "\n";
  for (size_t b = fo; b < k.buffers.size(); ++b)
    t += fmt::format("    p{0}[off{0}] = {1};\n", b, store_expr(k.buffers[b].dtype, fmt::format("o{}", b - fo)));
  t += "  }\n}\n";
  s += kernel_head(k, z) + t;
}

// Note [CUDA reduction schedule]
// Blocks of 256 threads. A row gets TR threads (cuda_threads_per_row): a warp for rows of up to 512
// elements (8 rows per block), the whole block otherwise; blocks walk the groups of rows grid-stride.
// Thread t of a row handles elements t, t + TR, t + 2 TR, ... (coalesced when the reduced dim is the
// innermost). When a thread has at most kCudaRowRegisters of them (counted up to a power of two,
// cuda_elements_per_thread), the loops are unrolled and the row
// stays in registers between passes: element buffers read by several passes are loaded once, and the
// expensive values the builder keeps in scratch (softmax's exp) are kept in registers; longer rows are
// read again in each pass (from L2). Each pass ends with fj_row_reduce of its accumulators, which gives
// every thread of the row the result, so the `after` statements run redundantly in each thread; row
// outputs are stored by the row's first thread. Reductions accumulate in float for float16/bfloat16.
// Column reductions (reduction_is_column) take a block tile instead: 32 neighbouring rows (neighbouring
// threads, so loads along the kept dim coalesce) by kCudaColumnThreads threads per row along the reduced
// dim, combined through shared memory by fj_column_reduce.
//
// Note [Variance of a row in registers]
// Welford's update divides by the running count at every element, and its combine in each shuffle step
// divides again: MeanVar's kernel was 632 SASS instructions with 14 calls to the division's slow path,
// 22% of the copy bandwidth on an H200 (LayerNorm's 50%). Where the row is in registers, a var
// accumulator is two sums instead: the row's mean, summed from each thread's sum (at most 16 elements)
// times 1 / row length (the row's sum itself would overflow where |x| * length passes the type's range
// and Welford's mean does not), which then centres the thread's elements, kept in registers (wx), and
// the sum of their squared deviations;
// fj_welford_var reads {mean, m2, n = row length} as from Welford's. An error in the mean adds only its
// square times the length to m2, so the result is as accurate as Welford's.
//
// Note [Values kept in registers between passes]
// A later pass that needs an element value an earlier pass computed either computes it again from the
// element buffers, each kept in registers (rcN) since the earlier pass read it, or reads the value kept
// (sr_). Layer norm of x + bias + residual computed x + bias + residual again in its second pass from
// three kept buffers: 12 registers a thread at 4 elements, where the sum kept takes 4. With sizes as
// arguments the kernel had 53 registers (40 with literal sizes), so an SM held 4 of its blocks instead
// of 6, and it ran at 1.23x the literal plan's time on an H200. The target keeps expensive values, and
// cheap ones made of two element buffers or more (Target::may_keep_between_passes); a buffer that is the
// same for every row (the bias, read again for the output) is read again from L1 rather than kept. The
// kernel's registers fall to 40, as with literal sizes.
void print_reduction_kernel(const KernelSpec& k, const KernelNumbers& z, std::string& out) {
  const size_t nd = k.sizes.size(), kd = static_cast<size_t>(k.kept_dims);
  const bool column = reduction_is_column(k);
  const int tr = cuda_threads_per_row(k);
  const int rb = kCudaBlockSize / tr;
  const bool regs = cuda_row_in_registers(k);
  const int64_t K = cuda_elements_per_thread(k);
  out += fmt::format("\n// {}, {} passes, {} threads per row, {}\n", reduction_summary(k, !z.arguments()), k.passes.size(), tr,
                   regs ? fmt::format("{} elements per thread in registers", K) : std::string("rows read per pass"));
  // The statements first, then the signature and the size locals (Note [CUDA size arguments]).
  std::string s;
  s += fmt::format("  [[maybe_unused]] const I {} = {};\n", kRowLength, z(k.row_len));
  const std::string rows = z.wide(k.rows);
  if (column)  // neighbouring threads take neighbouring rows: coalesced along the kept dim
    s += fmt::format("  const int sub_ = threadIdx.x % {0}, lane_ = threadIdx.x / {0};\n", rb);
  else
    s += fmt::format("  const int lane_ = threadIdx.x % {0}, sub_ = threadIdx.x / {0};\n", tr);
  s += fmt::format("  const long long groups_ = ({} + {}) / {};\n", rows, rb - 1, rb);
  s += "  for (long long g_ = blockIdx.x; g_ < groups_; g_ += gridDim.x) {\n";
  if (column) {
    // Every thread takes part in the block-wide reductions; those past the last row only load nothing.
    s += fmt::format("    const bool active_ = g_ * {0} + sub_ < {1};\n", rb, rows);
    s += fmt::format("    const long long row_ = active_ ? g_ * {} + sub_ : 0;\n", rb);
  } else {
    s += fmt::format("    const long long row_ = g_ * {} + sub_;\n", rb);
    // With a warp per row, a warp past the last row has nothing to do (no block-wide barrier follows).
    if (rb > 1) s += fmt::format("    if (row_ >= {}) continue;\n", rows);
    s += "    const bool active_ = true;\n";
  }
  s += "    I r_ = (I)row_, c_;\n";
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("    I roff{} = 0;\n", b);
  s += row_offsets_code(k, kd, "    ", z.args_fn());
  auto row_ref = [](size_t b) { return fmt::format("p{0}[roff{0}]", b); };
  for (int b : k.row_loads)
    s += fmt::format("    const {} b{} = {};\n", compute_type(k.buffers[b].dtype), b,
                     load_expr(k.buffers[b].dtype, load_ref(k, b, row_ref, z.args_fn())));
  for (const auto& st : k.row_prologue) s += "    " + print_stmt(st, z.args_fn()) + "\n";
  // Registers: element buffers read by more than one pass, and the scratch values.
  std::map<int, int> passes_reading;
  for (const auto& pass : k.passes)
    for (int b : pass.loads) passes_reading[b]++;
  // Note [Values kept in registers between passes]: a buffer that is the same for every row is read again
  // (from L1) rather than kept.
  auto same_for_every_row = [&](int b) {
    if (k.buffers[b].gather >= 0) return false;
    for (size_t d = 0; d < kd; ++d)
      if (k.buffers[b].strides[d] != 0) return false;
    return true;
  };
  std::set<int> cached;
  if (regs) {
    for (auto& [b, n] : passes_reading)
      if (n > 1 && !same_for_every_row(b)) {
        cached.insert(b);
        s += fmt::format("    {} rc{}[{}];\n", compute_type(k.buffers[b].dtype), b, K);
      }
    for (const auto& [var, ty] : k.scratch) s += fmt::format("    {} sr_{}[{}];\n", compute_c_type(ty), var, K);
  }
  std::set<int> loaded;  // cached buffers already in registers
  auto ref = [&](size_t b) {
    std::string off;
    if (nd - kd == 1) {
      const SymInt& st = k.buffers[b].strides[nd - 1];
      off = st == 0 ? "" : st == 1 ? " + (I)e_" : fmt::format(" + (I)e_ * {}", z(st));
    } else {
      off = fmt::format(" + eoff{}", b);
    }
    return fmt::format("p{0}[roff{0}{1}]", b, off);
  };
  // Note [Row loops with sizes as arguments]: with the row length a literal, the guard of the unrolled
  // loop folds away where every element of a thread lies in the row, and its loads issue together; as an
  // argument it stays, and each load waits behind its branch (1.2-1.4x the literal kernel's time on an
  // H200). Such a kernel runs the loop unguarded where the thread's last element lies in the row (full_),
  // guarded elsewhere.
  const bool versioned = regs && z.arguments();
  if (versioned) s += fmt::format("    const bool full_ = active_ && lane_ + {} < (long long){};\n", (K - 1) * tr, kRowLength);
  auto row_loop = [&](const std::string& body) {
    const std::string guard = fmt::format("active_ && e_ < (long long){}", kRowLength);
    if (!regs)
      return fmt::format("    for (long long e_ = lane_; {}; e_ += {}) {{\n      {{\n{}      }}\n    }}\n", guard, tr, body);
    auto loop = [&](const std::string& g) {
      return fmt::format("#pragma unroll\n    for (int u_ = 0; u_ < {}; ++u_) {{\n      const long long e_ = lane_ + u_ * {};\n"
                         "      if ({}) {{\n{}      }}\n    }}\n", K, tr, g, body);
    };
    return versioned ? "    if (full_) {\n" + loop("true") + "    } else {\n" + loop(guard) + "    }\n" : loop(guard);
  };
  auto reduce = [&](const std::string& v, const std::string& op) {
    return fmt::format("{}<{}>({}, {}())", column ? "fj_column_reduce" : "fj_row_reduce", tr, v, op);
  };
  int acc_base = 0;
  for (const auto& pass : k.passes) {
    const size_t na = pass.accs.size();
    s += fmt::format("    // pass {}\n", &pass - &k.passes[0]);
    for (size_t i = 0; i < na; ++i) {
      const auto& a = pass.accs[i];
      const char* ty = compute_c_type(a.type);
      if (a.kind == AccKind::kKahanSum)
        s += fmt::format("    {0} a{1} = 0, ac{1} = 0, ap{1} = 0;\n", ty, acc_base + i);
      else if (a.kind == AccKind::kWelford && regs)  // Note [Variance of a row in registers]
        s += fmt::format("    {0} a{1} = 0, q{1} = 0, wx{1}[{2}];\n", ty, acc_base + i, K);
      else if (a.kind == AccKind::kWelford)
        s += fmt::format("    fj_wf<{0}> w{1}; w{1}.mean = w{1}.m2 = w{1}.n = ({0})0;\n", ty, acc_base + i);
      else
        s += fmt::format("    {} a{} = {};\n", ty, acc_base + i, reduction_identity(a.kind, a.type));
    }
    std::string body;  // the loop's statements, wrapped by row_loop below
    const std::string ind = "        ";
    if (nd - kd != 1) {
      body += ind + "I q_ = (I)e_, d_;\n";
      for (size_t b = 0; b < k.buffers.size(); ++b) body += fmt::format("{}I eoff{} = 0;\n", ind, b);
      body += offsets_code(k, kd, nd, {"q_", "d_", "eoff", false, false, z.args_fn(), dividers(k, z)}, ind);
    }
    for (int b : pass.loads) {
      const std::string ty = compute_type(k.buffers[b].dtype);
      if (cached.count(b) && loaded.count(b)) {
        body += fmt::format("{}const {} b{} = rc{}[u_];\n", ind, ty, b, b);
      } else {
        body += fmt::format("{}const {} b{} = {};\n", ind, ty, b, load_expr(k.buffers[b].dtype, load_ref(k, b, ref, z.args_fn())));
        if (cached.count(b)) body += fmt::format("{}rc{}[u_] = b{};\n", ind, b, b);
      }
    }
    for (int b : pass.loads)
      if (cached.count(b)) loaded.insert(b);
    for (const auto& var : pass.stash_in) {
      std::string ty = "float";
      for (const auto& [v, t] : k.scratch)
        if (v == var) ty = compute_c_type(t);
      body += fmt::format("{}const {} {} = sr_{}[u_];\n", ind, ty, var, var);
    }
    for (const auto& st : pass.body) body += ind + print_stmt(st, z.args_fn()) + "\n";
    for (const auto& var : pass.stash_out) body += fmt::format("{}sr_{}[u_] = {};\n", ind, var, var);
    for (size_t i = 0; i < na; ++i) {
      const auto& a = pass.accs[i];
      const int j = acc_base + static_cast<int>(i);
      const char* ty = compute_c_type(a.type);
      const std::string in = print_expr(*a.input, z.args_fn());
      FJ_INTERNAL_ASSERT(a.kind != AccKind::kDoubleSum, "{}: double-sum accumulators are the CPU's", k.name);
      if (a.kind == AccKind::kKahanSum)
        body += fmt::format("{0}{{ const {1} x_ = {2}; ap{3} += x_; fj_kahan_add(a{3}, ac{3}, x_); }}\n", ind, ty, in, j);
      else if (a.kind == AccKind::kSum) body += fmt::format("{}a{} += {};\n", ind, j, in);
      else if (a.kind == AccKind::kProd) body += fmt::format("{}a{} *= {};\n", ind, j, in);
      else if (a.kind == AccKind::kMax || a.kind == AccKind::kMin)
        body += fmt::format("{0}a{1} = fj_red_{2}(a{1}, {3});\n", ind, j, acc_kind_name(a.kind), in);
      else if (regs)
        body += fmt::format("{0}{{ const {1} x_ = {2}; a{3} += x_; wx{3}[u_] = x_; }}\n", ind, ty, in, j);
      else
        body += fmt::format("{0}{{ const {1} x_ = {2}; w{3}.n += ({1})1; const {1} d_ = x_ - w{3}.mean; "
                         "w{3}.mean += d_ / w{3}.n; w{3}.m2 += d_ * (x_ - w{3}.mean); }}\n",
                         ind, ty, in, j);
    }
    for (const auto& [b, var] : pass.stores)
      body += fmt::format("{}{} = {};\n", ind, ref(b), store_expr(k.buffers[b].dtype, var));
    s += row_loop(body);
    for (size_t i = 0; i < na; ++i) {
      const auto& a = pass.accs[i];
      const size_t j = acc_base + i;
      const bool welford = a.kind == AccKind::kWelford;
      if (welford && regs) {  // Note [Variance of a row in registers]
        const char* ty = compute_c_type(a.type);
        s += fmt::format("    const {0} wm{1} = {2};\n", ty, j,
                         reduce(fmt::format("a{0} * (({1})1 / ({1}){2})", j, ty, kRowLength), "fj_op_sum"));
        s += row_loop(fmt::format("        {{ const {0} d_ = wx{1}[u_] - wm{1}; q{1} += d_ * d_; }}\n", ty, j));
        s += fmt::format("    const fj_wf<{0}> acc{1} = {{wm{1}, {2}, ({0}){3}}};\n", ty, j,
                         reduce(fmt::format("q{}", j), "fj_op_sum"), kRowLength);
        continue;
      }
      std::string op = is_sum(a.kind) ? "fj_op_sum" : std::string("fj_op_") + acc_kind_name(a.kind);
      std::string ty = welford ? fmt::format("fj_wf<{}>", compute_c_type(a.type)) : compute_c_type(a.type);
      std::string v = welford                        ? fmt::format("w{}", j)
                      : a.kind == AccKind::kKahanSum ? fmt::format("fj_kahan_value(a{0}, ac{0}, ap{0})", j)
                                                     : fmt::format("a{}", j);
      s += fmt::format("    const {} acc{} = {};\n", ty, j, reduce(v, op));
    }
    acc_base += static_cast<int>(na);
    for (const auto& st : pass.after) s += "    " + print_stmt(st, z.args_fn()) + "\n";
  }
  if (!k.row_stores.empty()) {
    s += "    if (lane_ == 0 && active_) {\n";
    for (const auto& [b, var] : k.row_stores)
      s += fmt::format("      p{0}[roff{0}] = {1};\n", b, store_expr(k.buffers[b].dtype, var));
    s += "    }\n";
  }
  s += "  }\n}\n";
  out += kernel_head(k, z) + s;
}

}  // namespace

namespace {

// One kernel, with its numbers as arguments recorded in `with_args`'s args (null: literals).
void print_cuda_kernel(const KernelSpec& k, KernelSpec* with_args, std::string& s) {
  const KernelNumbers z(with_args);
  if (k.is_reduction()) print_reduction_kernel(k, z, s);
  else print_kernel(k, z, s);
}

std::string print_source(const std::vector<KernelSpec>& kernels, std::vector<KernelSpec>* with_args) {
  std::string s = "// Generated by fusion_jit: CUDA kernels of one plan.\n";
  s += kPrelude;
  bool half = false;
  for (const auto& k : kernels) half = half || uses_reduced_floats(k);
  if (half) s += kHalfPrelude;
  s += kCommonPrelude;
  bool reductions = false;
  for (const auto& k : kernels) reductions = reductions || k.is_reduction();
  if (reductions) s += kReducePrelude;
  s += kVector;
  s += kernel_hooks().prelude("cuda");  // empty but in tests (Note [Kernel hooks])
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!with_args) {
      print_cuda_kernel(kernels[i], nullptr, s);
      continue;
    }
    KernelSpec& spec = (*with_args)[i];
    std::string k;
    print_cuda_kernel(kernels[i], &spec, k);
    if ((spec.args.size() + kernels[i].buffers.size()) * 8 > kCudaParamBytes) {  // Note [CUDA size arguments]: too many for the parameter space
      spec.args.clear();
      spec.arg_exprs.clear();
      k.clear();
      print_cuda_kernel(kernels[i], nullptr, k);
    }
    s += k;
  }
  return s;
}

}  // namespace

std::string print_cuda_source(const std::vector<KernelSpec>& kernels) { return print_source(kernels, nullptr); }

std::string print_cuda_source(std::vector<KernelSpec>& kernels, bool size_args) {
  if (!size_args) {
    for (auto& k : kernels) k.args.clear(), k.arg_exprs.clear();
    return print_source(kernels, nullptr);
  }
  return print_source(kernels, &kernels);
}

}  // namespace fusion_jit
