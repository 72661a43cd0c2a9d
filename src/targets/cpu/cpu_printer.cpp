#include "targets/cpu/cpu_printer.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "support/error.h"
#include "targets/cpu/host_compiler.h"

namespace fusion_jit {
namespace {

const char* kPrelude =
#include "codegen/libm_functions.inc"
#include "targets/cpu/cpu_prelude.inc"
#include "codegen/common_prelude.inc"
    ;

std::string storage_type(DType t) { return dtype_c_type(t); }

// The compute C type of a value kept in the kernel's scratch rows.
const char* scratch_c_type(const KernelSpec& k, const std::string& var) {
  for (const auto& [v, t] : k.scratch)
    if (v == var) return compute_c_type(t);
  return "float";
}

// `p<b>`: the kernel's buffers, typed, from the `buf` argument.
void print_buffer_pointers(const KernelSpec& k, std::string& s) {
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const auto& kb = k.buffers[b];
    std::string ty = storage_type(kb.dtype);
    if (kb.is_output) s += fmt::format("  {0}* __restrict__ p{1} = ({0}*)buf[{1}];\n", ty, b);
    else s += fmt::format("  const {0}* __restrict__ p{1} = (const {0}*)buf[{1}];\n", ty, b);
  }
}

// The signature every CPU kernel has (CpuKernelFn, cpu_launch.h), and the offsets' type `I`; the kernel's
// z<i> are declared at `*decl_at` once its body is printed.
void print_signature(const KernelSpec& k, std::string& s, size_t* decl_at) {
  s += fmt::format("extern \"C\" void {}(void* const* buf, const int64_t* z_, int64_t begin_, int64_t end_) {{\n", k.name);
  s += fmt::format("  typedef {} I;\n", k.index32 ? "int32_t" : "int64_t");
  *decl_at = s.size();
}

std::string index_expr(const std::string& j, const SymInt& stride, const KernelNumbers& z) {
  if (stride == 0) return "0";
  if (stride == 1) return j;
  return fmt::format("{} * {}", j, z(stride));
}

// Note [Row-invariant values]
// A pointwise kernel walks rows of its innermost dim. Some statements read only buffers that are the same
// in every element of a row (innermost stride 0: batch_norm's per-channel operands in an NCHW tensor,
// scalars) or the same in every row (outer strides 0: those operands in a channels-last tensor). The
// printer computes the first kind once per row, before the row's loop, and the second once per kernel
// call into a table of the row's length (at most kMaxTable elements), which the row's loop reads; the
// statements are the same, so are the values. batch_norm's alpha and beta are such statements (x * alpha
// + beta): a BN+ReLU kernel over [1,32,112,112] took 2.3x a ReLU's time with them computed per element.
enum class Reach { kConstant, kRow, kColumn, kElement };
constexpr int64_t kMaxTable = 4096, kMaxTableBytes = 256 << 10;

Reach combine(Reach a, Reach b) {
  if (a == Reach::kConstant) return b;
  if (b == Reach::kConstant || a == b) return a;
  return Reach::kElement;  // row and column, or either with element
}

// What each body statement's value varies with (by statement), from what each buffer's does.
std::vector<Reach> statement_reach(const KernelSpec& k) {
  const size_t nd = k.sizes.size();
  std::vector<Reach> buffer(k.buffers.size(), Reach::kElement);
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const KernelBuffer& kb = k.buffers[b];
    if (kb.is_output || kb.gather >= 0 || kb.piece >= 0) continue;
    bool outer_zero = true;
    for (size_t d = 0; d + 1 < nd; ++d) outer_zero = outer_zero && kb.strides[d] == 0;
    if (kb.strides[nd - 1] == 0) buffer[b] = outer_zero ? Reach::kConstant : Reach::kRow;
    else if (outer_zero && nd > 1) buffer[b] = Reach::kColumn;
  }
  for (const KernelBuffer& kb : k.buffers)  // a gathered load's index is read per element
    if (kb.gather >= 0) buffer[static_cast<size_t>(kb.gather)] = Reach::kElement;
  std::map<std::string, Reach> var;
  std::vector<Reach> out;
  for (const Stmt& st : k.body) {
    Reach r = Reach::kConstant;
    if (st.kind != Stmt::kLet) r = Reach::kElement;
    std::set<int> bs;
    std::set<std::string> vs;
    buffers_read(*st.value, &bs);
    vars_read(*st.value, &vs);
    for (int b : bs) r = combine(r, buffer[static_cast<size_t>(b)]);
    for (const auto& v : vs) {
      auto it = var.find(v);
      r = combine(r, it == var.end() ? Reach::kElement : it->second);
    }
    if (st.kind == Stmt::kLet) var[st.name] = r;
    out.push_back(r);
  }
  return out;
}

// Note [Stores of held values]
// A float16 or bfloat16 output is stored through a rounding conversion, which in bfloat16 is about seven
// vector instructions per vector (the rounding bias, the NaN test, the narrowing), where the value stored
// is usually one the dtype holds already: a result rounded to it where eager rounds it, a load of it, or
// a value kept (Note [Results that need no rounding]). Such a value's bits are its upper half, so its
// store is a shift (fj_bf16_bits), the same bits: the rounding of a held value changes nothing, and a
// NaN was made quiet where it was rounded, or is stored as it was loaded (eager copies it as it is). In a
// GhostNet plan every one of the 193 bfloat16 stores is of a held value; the plan's source, compiled as
// one unit, took 3.0 s instead of 3.5 s.
// (float16's conversion is one instruction: stores of float16 are left as they are.)

// The statement that sets variable `name`: in the body, a reduction's row prologue, or a pass.
const Stmt* let_of(const KernelSpec& k, const std::string& name) {
  auto find = [&](const std::vector<Stmt>& sts) -> const Stmt* {
    for (const Stmt& st : sts)
      if (st.kind == Stmt::kLet && st.name == name) return &st;
    return nullptr;
  };
  const Stmt* st = find(k.body);
  if (!st) st = find(k.row_prologue);
  for (size_t p = 0; !st && p < k.passes.size(); ++p) {
    st = find(k.passes[p].body);
    if (!st) st = find(k.passes[p].after);
  }
  return st;
}

// Whether `e` is a value that dtype `t` holds exactly: a rounding to `t`, a load of a buffer of `t`, a
// variable whose statement holds one (Stmt::held), or one of these converted to float.
bool holds_value(const KernelSpec& k, const Expr& e, DType t) {
  switch (e.kind) {
    case ExprKind::kRound: return e.type == t;
    case ExprKind::kLoad: return e.buffer >= 0 && k.buffers.at(static_cast<size_t>(e.buffer)).dtype == t;
    case ExprKind::kCast:
    case ExprKind::kConvert:
      return (e.type == t || e.type == DType::kFloat32) && holds_value(k, *e.args.at(0), t);
    case ExprKind::kVar: {
      const Stmt* st = let_of(k, e.name);
      return st && st->held && st->type == t;
    }
    default: return false;
  }
}

// The store into buffer `b` of `v`, whose value is `value` (null: not known here).
std::string store_of(const KernelSpec& k, size_t b, const Expr* value, const std::string& v) {
  const DType t = k.buffers[b].dtype;
  return t == DType::kBFloat16 && value && holds_value(k, *value, t) ? "fj_bf16_bits(" + v + ")" : store_expr(t, v);
}

// The store into buffer `b` of a reduction kernel's variable `var`, read as `v`.
std::string store_var(const KernelSpec& k, size_t b, const std::string& var, const std::string& v) {
  return store_of(k, b, Expr::var(var).get(), v);
}

// The store of output `o` (buffer `b`) of a pointwise kernel from its variable `o<o>`: its value is known
// where the body sets it once (a kernel with pieces sets it per piece).
std::string store_output(const KernelSpec& k, size_t b, size_t o) {
  const Stmt* set = nullptr;
  int sets = 0;
  for (const Stmt& st : k.body)
    if (st.kind == Stmt::kOutput && st.output == static_cast<int>(o)) set = &st, ++sets;
  const bool once = sets == 1 && k.pieces.empty();
  return store_of(k, b, once ? set->value.get() : nullptr, fmt::format("o{}", o));
}

// Whether an expression computes something (a call or a division), not only loads, converts or names a value.
bool computes(const Expr& e) {
  if (e.kind == ExprKind::kCall || e.kind == ExprKind::kDiv) return true;
  for (const auto& a : e.args)
    if (computes(*a)) return true;
  return false;
}

// Note [Short rows]
// A pointwise kernel walks rows of its innermost iteration dim, one vector loop per row. Where that dim is
// a few elements long (a channels-last copy of a 3-channel image: [50176, 3], the input's reads 50176
// apart; a [N, 3] tensor plus a [3] bias) each loop ran 3 elements with a row's set-up around them, the
// set-up costing more than the elements. Such a kernel walks the whole rows of its range along the next
// dim instead, the vector loop over rows (each buffer stepping by its stride there) and the row's few
// elements written out in its body, which GCC vectorizes as interleaved loads and stores (the image's
// copy about 14 times faster: bench/RESULTS.md, "Figures moved out of Notes"). A
// thread's range runs the rows that start in it (Note [Whole rows]).
// Taken for an innermost extent of 2 to kShortRow, without cat pieces, while the body written out stays
// small (kShortRowStatements, so that compile time stays as it was), and with literal sizes only: a
// kernel with sizes as arguments has one text for every size of its class, a row of 3 or of 300.
constexpr int64_t kShortRow = 8, kShortRowStatements = 256;

// Note [Short rows through a tile]
// GCC vectorizes a short-row kernel's stores as interleaved stores only where an output's rows lie end to
// end (a row stride of `inner` elements). An output whose rows have gaps (the channels a kernel writes of a
// cat's wider result: 8 of 16) is stored lane by lane: with AVX-512, 16 extracts per store, which float32
// turns into a scatter but 16-bit types cannot, and which made GCC's RTL combiner take 9 s over one
// bfloat16 kernel of a GhostNet plan. Such outputs are written into a tile of kTileRows dense rows on the
// stack, copied out row by row (one move of the row's bytes) after the vector loop: the kernel compiled in
// 0.2 s and ran 2.5 times faster, and float32's scattered form 1.5 times faster (bench/RESULTS.md, "bfloat16
// compile time"). A 16-bit output whose rows do lie end to end goes through a tile too: its interleaved
// stores, each a narrowing of two vectors of floats, were most of the code of a bfloat16 batch_norm and
// relu over [12544, 8] (0.16 s to compile against 0.05 s through a tile), and the plan ran as fast.
constexpr int64_t kTileRows = 64;

// Note [Whole rows]
// A pointwise kernel takes a range of elements, [begin_, end_), which the launch splits across threads
// wherever its chunks fall, so that the row loop ran from a column to the row's end at a length known
// only at run time: GCC wrote each row's vector loop with its run-time checks and a chain of vectorized
// epilogues (vectors of 16, then 8, ... elements), the most code of a simple kernel and, in bfloat16,
// where every load widens and every store narrows, most of its compile time. A kernel whose rows are
// short and whose sizes are literals runs whole rows instead: those that start in its range, so that
// each row is run by exactly one chunk whatever the split, and every row loop has a literal trip count,
// which GCC vectorizes with no checks and at most one epilogue. A chunk runs at most one row more or
// less than its elements' share: kWholeRow elements, an eighth of the default grain. A GhostNet plan's
// source, compiled as one unit, took 4.2 s in bfloat16 and 2.4 s in float32 before, 3.5 and 1.7 s after
// (bench/RESULTS.md, "bfloat16 compile time").
constexpr int64_t kWholeRow = 4096;

// Whether output `kb` of a short-row kernel goes through a tile: its rows are dense, and have gaps or
// hold a 16-bit type.
bool tiled_output(const KernelBuffer& kb, size_t nd, int64_t inner) {
  return kb.is_output && kb.strides[nd - 1] == 1 && !kb.strides[nd - 2].is_symbolic() &&
         (kb.strides[nd - 2] != inner || dtype_size(kb.dtype) == 2);
}

bool short_rows(const KernelSpec& k, const KernelNumbers& z) {
  const size_t nd = k.sizes.size();
  if (nd < 2 || !k.pieces.empty() || z.arguments()) return false;
  const int64_t inner = k.sizes[nd - 1];
  return inner >= 2 && inner <= kShortRow && inner * static_cast<int64_t>(k.body.size() + k.buffers.size()) <= kShortRowStatements;
}

// The whole rows [fb_, fe_) of a short-row kernel (Note [Short rows]): a vector loop along dim nd - 2 per
// run of rows that lie in one index of the dims outside it, the row's elements written out.
void print_short_rows(const KernelSpec& k, std::string& s, const KernelNumbers& z) {
  const size_t nd = k.sizes.size();
  const int64_t inner = k.sizes[nd - 1];
  size_t first_out = 0;
  while (first_out < k.buffers.size() && !k.buffers[first_out].is_output) ++first_out;
  s += fmt::format("  for (I r_ = fb_; r_ < fe_;) {{\n    I n = {0} - r_ % {0};\n    if (n > fe_ - r_) n = fe_ - r_;\n",
                   z(k.sizes[nd - 2]));
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("    I off{} = 0;\n", b);
  s += "    {\n      I r = r_, c;\n";
  s += offsets_code(k, 0, nd - 1, {"r", "c", "off", false, false, z.fn()}, "      ");
  s += "    }\n";
  for (size_t b = 0; b < k.buffers.size(); ++b)
    s += fmt::format("    {}{}* __restrict__ r{} = p{} + off{};\n", k.buffers[b].is_output ? "" : "const ",
                     storage_type(k.buffers[b].dtype), b, b, b);
  // Note [Short rows through a tile]: outputs whose rows have gaps, or of 16 bits, are written to a tile
  // per kTileRows rows.
  std::vector<bool> tiled(k.buffers.size(), false);
  bool any_tiled = false;
  for (size_t b = first_out; b < k.buffers.size(); ++b) any_tiled |= tiled[b] = tiled_output(k.buffers[b], nd, inner);
  std::string ind = "      ";
  if (any_tiled) {
    s += fmt::format("    for (I j0_ = 0; j0_ < n; j0_ += {0}) {{\n      const I m_ = n - j0_ < {0} ? n - j0_ : {0};\n", kTileRows);
    for (size_t b = first_out; b < k.buffers.size(); ++b)
      if (tiled[b]) s += fmt::format("      {} tile{}_[{}];\n", storage_type(k.buffers[b].dtype), b, kTileRows * inner);
    s += "#pragma omp simd\n      for (I jj_ = 0; jj_ < m_; ++jj_) {\n        const I j = j0_ + jj_;\n";
    ind = "        ";
  } else {
    s += "#pragma omp simd\n    for (I j = 0; j < n; ++j) {\n";
  }
  for (int64_t c = 0; c < inner; ++c) {
    // Element c of row j in buffer b.
    auto ref = [&](size_t b) {
      const KernelBuffer& kb = k.buffers[b];
      if (tiled[b]) return fmt::format("tile{}_[jj_ * {} + {}]", b, inner, c);
      std::string at = index_expr("j", kb.strides[nd - 2], z);
      const int64_t step = c * static_cast<int64_t>(kb.strides[nd - 1]);  // literal sizes only
      if (step != 0) at = at == "0" ? std::to_string(step) : fmt::format("{} + {}", at, step);
      return fmt::format("r{}[{}]", b, at);
    };
    s += ind + "{\n";
    for (size_t b = 0; b < first_out; ++b)
      s += fmt::format("{}  const {} b{} = {};\n", ind, compute_c_type(k.buffers[b].dtype), b,
                       load_expr(k.buffers[b].dtype, load_ref(k, b, ref, z.args_fn())));
    for (size_t b = first_out; b < k.buffers.size(); ++b)
      s += fmt::format("{}  {} o{};\n", ind, compute_c_type(k.buffers[b].dtype), b - first_out);
    for (const Stmt& st : k.body) s += ind + "  " + print_stmt(st, z.fn()) + "\n";
    for (size_t b = first_out; b < k.buffers.size(); ++b)
      s += fmt::format("{}  {} = {};\n", ind, ref(b), store_output(k, b, b - first_out));
    s += ind + "}\n";
  }
  if (any_tiled) {
    s += "      }\n      for (I jj_ = 0; jj_ < m_; ++jj_) {\n";
    for (size_t b = first_out; b < k.buffers.size(); ++b)
      if (tiled[b])
        s += fmt::format("        __builtin_memcpy(r{0} + (j0_ + jj_) * {1}, tile{0}_ + jj_ * {2}, sizeof tile{0}_[0] * {2});\n", b,
                         static_cast<int64_t>(k.buffers[b].strides[nd - 2]), inner);
    s += "      }\n    }\n";
  } else {
    s += "    }\n";
  }
  s += "    r_ += n;\n  }\n";
}

void print_kernel(const KernelSpec& k, std::string& s, const KernelNumbers& z) {
  const char* I = k.index32 ? "int32_t" : "int64_t";
  size_t nd = k.sizes.size();
  const SymInt inner = k.sizes[nd - 1];
  const bool short_kernel = short_rows(k, z);
  // Note [Row-invariant values]: statements hoisted out of the element loop (pointwise kernels without
  // cat pieces or short rows): per row, and into tables per call.
  std::vector<Reach> reach = statement_reach(k);
  if (!k.pieces.empty() || short_kernel) reach.assign(k.body.size(), Reach::kElement);
  int64_t table_count = 0;
  for (size_t i = 0; i < k.body.size(); ++i) {
    if (reach[i] == Reach::kColumn && (inner > kMaxTable || !computes(*k.body[i].value)))
      reach[i] = Reach::kElement;  // a bare load or cast gains nothing from a table
    table_count += reach[i] == Reach::kColumn;
  }
  // The tables live on the stack of the thread running the kernel: at most kMaxTableBytes in all.
  const bool tables = table_count > 0 && table_count * inner * 8 <= kMaxTableBytes;
  if (!tables)  // without a table a column statement stays in the loop, as do its users
    for (size_t i = 0; i < k.body.size(); ++i)
      if (reach[i] == Reach::kColumn) reach[i] = Reach::kElement;
  {
    // A statement reading a variable demoted to the loop runs there too.
    std::set<std::string> in_loop;
    for (size_t i = 0; i < k.body.size(); ++i) {
      std::set<std::string> vs;
      vars_read(*k.body[i].value, &vs);
      for (const auto& v : vs)
        if (in_loop.count(v)) reach[i] = Reach::kElement;
      if (reach[i] == Reach::kElement && k.body[i].kind == Stmt::kLet) in_loop.insert(k.body[i].name);
    }
  }
  if (z.arguments()) {
    s += fmt::format("\n// group {}: {} dims, {} offsets\n", k.group, nd, I);
  } else {
    s += fmt::format("\n// group {}: {} elements as [", k.group, static_cast<int64_t>(k.numel));
    for (size_t d = 0; d < nd; ++d) s += (d ? "," : "") + std::to_string(static_cast<int64_t>(k.sizes[d]));
    s += fmt::format("], {} offsets\n", I);
  }
  size_t decl_at = 0;
  print_signature(k, s, &decl_at);
  print_buffer_pointers(k, s);
  size_t first_out = 0;
  while (first_out < k.buffers.size() && !k.buffers[first_out].is_output) ++first_out;
  // The loads of buffers the statements of reach `r` read, from the pointers `ptr<b>` at element `j`.
  auto print_loads = [&](const std::set<Reach>& rs, const char* ptr, const std::string& ind) {
    std::set<int> used;
    for (size_t i = 0; i < k.body.size(); ++i)
      if (rs.count(reach[i])) buffers_read(*k.body[i].value, &used);
    for (int b : used)
      s += fmt::format("{}const {} b{} = {};\n", ind, compute_c_type(k.buffers[b].dtype), b,
                       load_expr(k.buffers[b].dtype, fmt::format("{}{}[{}]", ptr, b, index_expr("j", k.buffers[b].strides[nd - 1], z))));
  };
  if (tables) {
    // With sizes as arguments the tables are sized by the row length read at run time (a variable-length
    // array, which GCC takes in C++), so that every row length that fits shares the text.
    const std::string table_len = z(inner);
    for (size_t i = 0; i < k.body.size(); ++i)
      if (reach[i] == Reach::kColumn)
        s += fmt::format("  {} h_{}[{}];\n", compute_c_type(k.body[i].type), k.body[i].name, table_len);
    s += "#pragma omp simd\n" + fmt::format("  for (I j = 0; j < {}; ++j) {{\n", table_len);
    print_loads({Reach::kColumn, Reach::kConstant}, "p", "    ");
    for (size_t i = 0; i < k.body.size(); ++i)
      if (reach[i] == Reach::kColumn || reach[i] == Reach::kConstant) {
        s += "    " + print_stmt(k.body[i], z.fn()) + "\n";
        if (reach[i] == Reach::kColumn) s += fmt::format("    h_{0}[j] = {0};\n", k.body[i].name);
      }
    s += "  }\n";
  }
  const std::string row_len = z(inner);
  // Note [Whole rows]: the rows that start in [begin_, end_), each with its literal length. Short rows
  // (literal sizes only) are always whole.
  const bool whole = !z.arguments() && static_cast<int64_t>(inner) <= kWholeRow;
  FJ_INTERNAL_ASSERT(whole || !short_kernel, "{}: short rows of {} elements not whole", k.name, row_len);
  if (whole) {
    s += fmt::format("  const I fb_ = (I)((begin_ + {0} - 1) / {0}), fe_ = (I)((end_ + {0} - 1) / {0});\n", row_len);
    if (short_kernel) {
      print_short_rows(k, s, z);
      s += "}\n";
      s.insert(decl_at, z.declarations());
      return;
    }
    s += fmt::format("  for (I row = fb_; row < fe_; ++row) {{\n    const I col = 0, n = {};\n", row_len);
  } else {
    s += "  I i = (I)begin_;\n  const I end = (I)end_;\n  while (i < end) {\n";
  }
  if (!whole) {
    if (nd > 1) s += fmt::format("    const I row = i / {0}, col = i - row * {0};\n", row_len);
    else s += "    const I row = 0, col = i;\n";
    s += fmt::format("    I n = {} - col;\n    if (n > end - i) n = end - i;\n", row_len);
  }
  // Offsets of the row: decompose row over the outer dims, innermost first.
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("    I off{} = 0;\n", b);
  if (nd > 1) {
    s += "    {\n      I r = row, c;\n";
    s += offsets_code(k, 0, nd - 1, {"r", "c", "off", false, false, z.fn()}, "      ");
    s += "    }\n";
  }
  // Row pointers of the buffers every element reads (a piece's own buffers are read in its loop).
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const auto& kb = k.buffers[b];
    if (kb.piece >= 0) continue;
    std::string ty = storage_type(kb.dtype);
    const SymInt& st = kb.strides[nd - 1];
    std::string cst = kb.is_output ? "" : "const ";
    s += fmt::format("    {}{}* __restrict__ r{} = p{} + off{}{};\n", cst, ty, b, b, b,
                     st == 0 || whole ? "" : " + " + index_expr("col", st, z));
  }
  // Row-invariant statements: once per row, before its loop (Note [Row-invariant values]).
  bool per_row = false;
  for (Reach r : reach) per_row = per_row || r == Reach::kRow || r == Reach::kConstant;
  std::set<int> hoisted_only;  // buffers read only by statements hoisted out of the element loop
  {
    std::set<int> all, in_loop;
    for (size_t i = 0; i < k.body.size(); ++i) {
      buffers_read(*k.body[i].value, &all);
      if (reach[i] == Reach::kElement) buffers_read(*k.body[i].value, &in_loop);
    }
    for (int b : all)
      if (!in_loop.count(b)) hoisted_only.insert(b);
  }
  // The loop over `n` elements of the row from the pointers `r<b>` (`s<b>` in a leaf piece's loop), running
  // leaf piece `leaf`'s code (-1: none) and the body.
  auto loop = [&](int leaf, const std::string& n, const std::string& ind) {
    const char* r = leaf >= 0 ? "s" : "r";
    if (per_row) {
      print_loads({Reach::kRow, Reach::kConstant}, r, ind);
      for (size_t i = 0; i < k.body.size(); ++i)
        if (reach[i] == Reach::kRow || reach[i] == Reach::kConstant) s += ind + print_stmt(k.body[i], z.fn()) + "\n";
    }
    for (size_t i = 0; i < k.body.size(); ++i)
      if (reach[i] == Reach::kColumn)
        s += fmt::format("{}const {}* __restrict__ hr_{} = h_{} + col;\n", ind, compute_c_type(k.body[i].type),
                         k.body[i].name, k.body[i].name);
    s += "#pragma omp simd\n" + ind + fmt::format("for (I j = 0; j < {}; ++j) {{\n", n);
    auto ref = [&](size_t b) { return fmt::format("{}{}[{}]", r, b, index_expr("j", k.buffers[b].strides[nd - 1], z)); };
    for (size_t b = 0; b < first_out; ++b) {
      const auto& kb = k.buffers[b];
      if (kb.piece >= 0 && !piece_on_path(k, kb.piece, leaf)) continue;
      if (hoisted_only.count(static_cast<int>(b))) continue;
      s += fmt::format("{}  const {} b{} = {};\n", ind, compute_c_type(kb.dtype), b, load_expr(kb.dtype, load_ref(k, b, ref, z.args_fn())));
    }
    for (size_t b = first_out; b < k.buffers.size(); ++b)
      s += fmt::format("{}  {} o{};\n", ind, compute_c_type(k.buffers[b].dtype), b - first_out);
    if (leaf >= 0)
      for (const auto& st : piece_statements(k, leaf)) s += ind + "  " + print_stmt(st, z.fn()) + "\n";
    for (size_t i = 0; i < k.body.size(); ++i) {
      const Stmt& st = k.body[i];
      if (reach[i] == Reach::kColumn)
        s += fmt::format("{}  const {} {} = hr_{}[j];\n", ind, compute_c_type(st.type), st.name, st.name);
      else if (reach[i] == Reach::kElement)
        s += ind + "  " + print_stmt(st, z.fn()) + "\n";
    }
    for (size_t b = first_out; b < k.buffers.size(); ++b) {
      const auto& kb = k.buffers[b];
      s += fmt::format("{}  {}{}[{}] = {};\n", ind, r, b, index_expr("j", kb.strides[nd - 1], z),
                       store_output(k, b, b - first_out));
    }
    s += ind + "}\n";
  };
  if (k.pieces.empty()) {
    loop(-1, "n", "    ");
  } else {
    // Note [Cats of unequal items]: the row's elements of each leaf piece. Along an outer dim a row lies
    // in one piece; along the innermost the pieces split the row.
    std::set<int> outer;
    for (const auto& p : k.pieces)
      if (p.dim != static_cast<int>(nd) - 1) outer.insert(p.dim);
    for (int d : outer)
      s += fmt::format("    const I pc{}_ = (row / {}) % {};\n", d, z(floor_div(k.inner_elements(d), inner)), z(k.sizes[d]));
    for (int leaf : k.piece_leaves()) {
      s += "    {\n      I lo_ = 0, hi_ = n;\n";
      std::string cond;
      for (int p : k.piece_path(leaf)) {
        const KernelPiece& pc = k.pieces[static_cast<size_t>(p)];
        if (pc.dim == static_cast<int>(nd) - 1)
          s += fmt::format("      if (lo_ < {0} - col) lo_ = {0} - col;\n      if (hi_ > {1} - col) hi_ = {1} - col;\n",
                           z(pc.start), z(pc.end));
        else
          cond += fmt::format("pc{0}_ >= {1} && pc{0}_ < {2} && ", pc.dim, z(pc.start), z(pc.end));
      }
      s += fmt::format("      if ({}lo_ < hi_) {{\n", cond);
      // The leaf's buffers: their offsets along each piece dim count from the piece's start.
      // The loop's pointers, at its first element: the leaf's buffers' offsets along each piece dim count
      // from the piece's start. (Pointers, not indices, in the loop: int32 offset arithmetic there, which
      // may wrap under -fwrapv, keeps the loop from vectorizing.)
      for (size_t b = 0; b < k.buffers.size(); ++b) {
        const auto& kb = k.buffers[b];
        const SymInt& st = kb.strides[nd - 1];
        const std::string cst = kb.is_output ? "" : "const ", ty = storage_type(kb.dtype);
        if (kb.piece < 0)
          s += fmt::format("        {}{}* __restrict__ s{} = r{}{};\n", cst, ty, b, b, st == 0 ? "" : " + " + index_expr("lo_", st, z));
        else if (piece_on_path(k, kb.piece, leaf))
          s += fmt::format("        {}{}* __restrict__ s{} = p{} + (off{} + (col + lo_) * {} - {});\n", cst, ty, b, b, b,
                           z(st), z(k.piece_shift(kb)));
      }
      loop(leaf, "hi_ - lo_", "        ");
      s += "      }\n    }\n";
    }
  }
  s += whole ? "  }\n" : "    i += n;\n  }\n";
  s += "}\n";
  s.insert(decl_at, z.declarations());
}

// A reduction pass's per-lane accumulators (Note [CPU reduction schedule]), declared and set to their
// identities: `a<i>` (with `ac<i>`, `ap<i>` for compensated sums), or Welford's `wm<i>`, `wq<i>`.
std::string lane_accumulators(const KernelPass& pass, int width) {
  std::string s;
  const size_t na = pass.accs.size();
  for (size_t i = 0; i < na; ++i) {
    const auto& a = pass.accs[i];
    const char* ty = compute_c_type(a.type);
    std::string id = reduction_identity(a.kind, a.type);
    if (a.kind == AccKind::kKahanSum)
      s += fmt::format("      {0} a{1}[{2}], ac{1}[{2}], ap{1}[{2}];\n      for (int l_ = 0; l_ < {2}; ++l_) "
                       "a{1}[l_] = ac{1}[l_] = ap{1}[l_] = 0;\n",
                       ty, i, width);
    else if (a.kind == AccKind::kWelford)
      s += fmt::format("      {0} wm{1}[{2}], wq{1}[{2}], wc{1} = 0, tm{1} = 0, tq{1} = 0, tn{1} = 0;\n"
                       "      for (int l_ = 0; l_ < {2}; ++l_) wm{1}[l_] = wq{1}[l_] = ({0})0;\n",
                       ty, i, width);
    else
      s += fmt::format("      {0} a{1}[{2}];\n      for (int l_ = 0; l_ < {2}; ++l_) a{1}[l_] = {3};\n", ty, i,
                       width, id);
  }
  return s;
}

// After a pass's loop: its lanes merged as a tree into `acc<acc_base + i>`.
std::string merge_lanes(const KernelPass& pass, int acc_base, int width) {
  std::string s;
  const size_t na = pass.accs.size();
  for (size_t i = 0; i < na; ++i) {
    const auto& a = pass.accs[i];
    int idx = acc_base + static_cast<int>(i);
    const char* ty = compute_c_type(a.type);
    if (a.kind == AccKind::kKahanSum) {
      // The lanes' compensated values and plain sums, each added up as a tree.
      s += fmt::format("      for (int l_ = 0; l_ < {0}; ++l_) a{1}[l_] -= ac{1}[l_];\n"
                       "      for (int w_ = {0} / 2; w_ > 0; w_ /= 2)\n"
                       "        for (int l_ = 0; l_ < w_; ++l_) {{ a{1}[l_] += a{1}[l_ + w_]; ap{1}[l_] += ap{1}[l_ + w_]; }}\n"
                       "      acc{2} = fj_kahan_value(a{1}[0], ({3})0, ap{1}[0]);\n",
                       width, i, idx, ty);
    } else if (a.kind == AccKind::kWelford) {
      s += fmt::format("      acc{0}.mean = tm{1}; acc{0}.m2 = tq{1}; acc{0}.n = tn{1};\n", idx, i);
      s += fmt::format("      for (int l_ = 0; l_ < {0}; ++l_) {{ fj_wf<{1}> w_; w_.mean = wm{2}[l_]; "
                       "w_.m2 = wq{2}[l_]; w_.n = wc{2}; acc{3} = fj_wf_merge(acc{3}, w_); }}\n",
                       width, ty, i, idx);
    } else {
      const char* op = is_sum(a.kind) ? "a{0}[l_] + a{0}[l_ + w_]"
                       : a.kind == AccKind::kProd ? "a{0}[l_] * a{0}[l_ + w_]"
                                                  : nullptr;
      std::string merge = op ? fmt::format(fmt::runtime(op), i)
                             : fmt::format("fj_red_{0}(a{1}[l_], a{1}[l_ + w_])", acc_kind_name(a.kind), i);
      s += fmt::format("      for (int w_ = {0} / 2; w_ > 0; w_ /= 2)\n        for (int l_ = 0; l_ < w_; ++l_) "
                       "a{1}[l_] = {2};\n      acc{3} = a{1}[0];\n",
                       width, i, merge, idx);
    }
  }
  return s;
}

// Note [CPU reduction schedule]
// Rows run in parallel over threads (the launch splits [0, rows)); each thread walks its rows one by one,
// so a row stays in its core's caches between passes. A pass with accumulators runs its loop in vectors of
// W lanes (16, or 8 when the pass computes in 8-byte types), each lane with accumulators of its own.
// Accuracy of sums, whatever the row's length: float32 sums (and means) add up in double ("dsum"), except
// sums of terms that cannot be negative (exp, squares), which cannot cancel: float lanes restarting per
// chunk of 1024 elements. float64 sums are compensated (fj_kahan_add) per chunk of 16 elements a lane
// ("ksum"), a plain sum kept alongside for eager's inf and NaN. Integer sums and products restart per chunk of 1024 elements. Lanes
// merge as a tree at the end (Welford's by Chan's formula). Elements past the last whole vector go to
// lane 0.
void print_reduction_kernel(const KernelSpec& k, std::string& s, const KernelNumbers& z) {
  const char* I = k.index32 ? "int32_t" : "int64_t";
  const size_t nd = k.sizes.size(), kd = static_cast<size_t>(k.kept_dims);
  size_t first_out = 0;
  while (first_out < k.buffers.size() && !k.buffers[first_out].is_output) ++first_out;
  s += fmt::format("\n// {}, {} passes, {} offsets\n", reduction_summary(k, !z.arguments()), k.passes.size(), I);
  size_t decl_at = 0;
  print_signature(k, s, &decl_at);
  print_buffer_pointers(k, s);
  const std::string row_len = z(k.row_len);
  s += fmt::format("  [[maybe_unused]] const I {} = {};\n", kRowLength, row_len);
  for (const auto& [var, ty] : k.scratch)
    s += fmt::format("  {0}* __restrict__ st_{1} = ({0}*)malloc(sizeof({0}) * {2});\n", compute_c_type(ty), var, row_len);
  s += "  for (int64_t row_ = begin_; row_ < end_; ++row_) {\n";
  s += "    I r_ = (I)row_, c_;\n";
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("    I roff{} = 0;\n", b);
  s += row_offsets_code(k, kd, "    ", z.fn());
  // Row bases: indexing them by the loop variables keeps the accesses linear for the vectorizer
  // (`roff + j + l` in a wrapping int32 is not).
  for (size_t b = 0; b < k.buffers.size(); ++b)
    s += fmt::format("    {0}{1}* __restrict__ q{2} = p{2} + roff{2};\n", k.buffers[b].is_output ? "" : "const ",
                     storage_type(k.buffers[b].dtype), b);
  auto ctype = [](DType t) { return std::string(compute_c_type(t)); };
  auto scratch_type = [&](const std::string& var) { return std::string(scratch_c_type(k, var)); };
  auto row_ref = [](size_t b) { return fmt::format("q{}[0]", b); };
  for (int b : k.row_loads)
    s += fmt::format("    const {} b{} = {};\n", ctype(k.buffers[b].dtype), b,
                     load_expr(k.buffers[b].dtype, load_ref(k, b, row_ref, z.args_fn())));
  for (const auto& st : k.row_prologue) s += "    " + print_stmt(st, z.fn()) + "\n";
  // Offsets of element e_ of the row, per buffer: `eoff<b>`.
  auto element_offsets = [&](const std::string& ind) {
    std::string t;
    if (nd - kd == 1) return t;
    t += ind + "I q_ = e_, d_;\n";
    for (size_t b = 0; b < k.buffers.size(); ++b) t += fmt::format("{}I eoff{} = 0;\n", ind, b);
    return t + offsets_code(k, kd, nd, {"q_", "d_", "eoff", false, false, z.fn()}, ind);
  };
  // Element e of the row in buffer b: `ref(b)`; in the vector loop, lane l_ of the vector at j_ (whose
  // bases `v<b>` are set before the loop).
  bool in_vector = false;
  auto ref = [&](size_t b) {
    if (nd - kd != 1) return fmt::format("q{0}[eoff{0}]", b);
    const SymInt& st = k.buffers[b].strides[nd - 1];
    if (st == 0) return fmt::format("q{}[0]", b);
    return in_vector ? fmt::format("v{}[{}]", b, index_expr("l_", st, z)) : fmt::format("q{}[{}]", b, index_expr("e_", st, z));
  };
  int acc_base = 0;
  for (const auto& pass : k.passes) {
    const size_t na = pass.accs.size();
    // 16 lanes, 8 when the pass computes in 8-byte types (float sums accumulate in double but keep 16).
    int width = 16;
    for (const auto& a : pass.accs)
      if (a.type == DType::kInt64 || (a.type == DType::kFloat64 && a.kind != AccKind::kDoubleSum)) width = 8;
    for (int b : pass.loads)
      if (dtype_size(k.buffers[b].dtype) == 8) width = 8;

    auto body = [&](const std::string& ind) {
      std::string t = element_offsets(ind);
      for (int b : pass.loads)
        t += fmt::format("{}const {} b{} = {};\n", ind, ctype(k.buffers[b].dtype), b,
                         load_expr(k.buffers[b].dtype, load_ref(k, b, ref, z.args_fn())));
      auto scratch = [&](const std::string& var) {
        return in_vector ? fmt::format("sv_{}[l_]", var) : fmt::format("st_{}[e_]", var);
      };
      for (const auto& var : pass.stash_in)
        t += fmt::format("{}const {} {} = {};\n", ind, scratch_type(var), var, scratch(var));
      for (const auto& st : pass.body) t += ind + print_stmt(st, z.fn()) + "\n";
      for (const auto& var : pass.stash_out) t += fmt::format("{}{} = {};\n", ind, scratch(var), var);
      for (size_t i = 0; i < na; ++i) {
        const auto& a = pass.accs[i];
        const std::string in = print_expr(*a.input, z.fn());
        const char* ty = compute_c_type(a.type);
        if (is_sum(a.kind)) t += fmt::format("{}s{}[l_] += {};\n", ind, i, in);
        else if (a.kind == AccKind::kProd) t += fmt::format("{}s{}[l_] *= {};\n", ind, i, in);
        else if (a.kind == AccKind::kMax || a.kind == AccKind::kMin)
          t += fmt::format("{0}a{1}[l_] = fj_red_{2}(a{1}[l_], {3});\n", ind, i, acc_kind_name(a.kind), in);
        else if (in_vector)  // every lane has seen wc<i> elements: one reciprocal per vector
          t += fmt::format("{0}{{ const {1} x_ = {2}; const {1} d_ = x_ - wm{3}[l_]; "
                           "wm{3}[l_] += d_ * wi{3}; wq{3}[l_] += d_ * (x_ - wm{3}[l_]); }}\n",
                           ind, ty, in, i);
        else  // the elements past the last whole vector
          t += fmt::format("{0}{{ const {1} x_ = {2}; tn{3} += ({1})1; const {1} d_ = x_ - tm{3}; "
                           "tm{3} += d_ / tn{3}; tq{3} += d_ * (x_ - tm{3}); }}\n",
                           ind, ty, in, i);
      }
      for (const auto& [b, var] : pass.stores)
        t += fmt::format("{}{} = {};\n", ind, ref(b), store_var(k, b, var, var));
      return t;
    };
    s += fmt::format("    // pass {}\n", &pass - &k.passes[0]);
    if (na == 0) {
      s += fmt::format("#pragma omp simd\n    for (I e_ = 0; e_ < {}; ++e_) {{\n", row_len);
      s += body("      ");
      s += "    }\n";
    } else {
      for (size_t i = 0; i < na; ++i) {
        const auto& a = pass.accs[i];
        const std::string ty = compute_c_type(a.type);
        s += fmt::format("    {} acc{};\n", a.kind == AccKind::kWelford ? "fj_wf<" + ty + ">" : ty, acc_base + i);
      }
      s += "    {\n";
      s += lane_accumulators(pass, width);
      // Chunks: a floating sum adds each chunk's lanes into its compensated total.
      int chunk = 1024;
      for (const auto& a : pass.accs)
        if (a.kind == AccKind::kKahanSum) chunk = 16 * width;
      s += fmt::format("      for (I j0_ = 0; j0_ < {0}; j0_ += {1}) {{\n", row_len, chunk);
      s += fmt::format("        const I je_ = {0} - j0_ < {1} ? {0} : j0_ + {1};\n", row_len, chunk);
      for (size_t i = 0; i < na; ++i) {
        const auto& a = pass.accs[i];
        if (is_sum(a.kind) || a.kind == AccKind::kProd)
          s += fmt::format("        {0} s{1}[{2}];\n        for (int l_ = 0; l_ < {2}; ++l_) s{1}[l_] = {3};\n",
                           compute_c_type(a.type), i, width, reduction_identity(a.kind, a.type));
      }
      s += fmt::format("        I j_ = j0_;\n        for (; j_ + {0} <= je_; j_ += {0}) {{\n", width);
      if (nd - kd == 1) {
        std::set<int> used(pass.loads.begin(), pass.loads.end());
        for (const auto& st : pass.stores) used.insert(st.first);
      for (int b : used)
          if (k.buffers[b].strides[nd - 1] != 0)
            s += fmt::format("          {0}{1}* __restrict__ v{2} = q{2} + (int64_t)j_ * {3};\n",
                             k.buffers[b].is_output ? "" : "const ", storage_type(k.buffers[b].dtype), b,
                             z(k.buffers[b].strides[nd - 1]));
      }
      for (const auto& var : pass.stash_in)
        s += fmt::format("          const {0}* __restrict__ sv_{1} = st_{1} + j_;\n", scratch_type(var), var);
      for (const auto& var : pass.stash_out)
        s += fmt::format("          {0}* __restrict__ sv_{1} = st_{1} + j_;\n", scratch_type(var), var);
      for (size_t i = 0; i < na; ++i)
        if (pass.accs[i].kind == AccKind::kWelford)
          s += fmt::format("          wc{0} += 1; const {1} wi{0} = ({1})1 / wc{0};\n", i, compute_c_type(pass.accs[i].type));
      s += fmt::format("#pragma omp simd\n          for (int l_ = 0; l_ < {}; ++l_) {{\n", width);
      s += "            const I e_ = j_ + l_;\n            (void)e_;\n";
      in_vector = true;
      s += body("            ");
      in_vector = false;
      s += "          }\n        }\n";
      s += "        for (; j_ < je_; ++j_) {\n          const int l_ = 0;\n          const I e_ = j_;\n";
      s += body("          ");
      s += "        }\n";
      for (size_t i = 0; i < na; ++i) {
        const auto& a = pass.accs[i];
        if (a.kind == AccKind::kKahanSum)
          s += fmt::format("#pragma omp simd\n        for (int l_ = 0; l_ < {0}; ++l_) {{ ap{1}[l_] += s{1}[l_]; "
                           "fj_kahan_add(a{1}[l_], ac{1}[l_], s{1}[l_]); }}\n",
                           width, i);
        else if (is_sum(a.kind) || a.kind == AccKind::kProd)
          s += fmt::format("        for (int l_ = 0; l_ < {0}; ++l_) a{1}[l_] {2}= s{1}[l_];\n", width, i,
                           a.kind == AccKind::kProd ? "*" : "+");
      }
      s += "      }\n";
      s += merge_lanes(pass, acc_base, width);
      s += "    }\n";
      acc_base += static_cast<int>(na);
    }
    for (const auto& st : pass.after) s += "    " + print_stmt(st, z.fn()) + "\n";
  }
  for (const auto& [b, var] : k.row_stores)
    s += fmt::format("    q{0}[0] = {1};\n", b, store_var(k, b, var, var));
  s += "  }\n";
  for (const auto& sc : k.scratch) s += fmt::format("  free(st_{});\n", sc.first);
  s += "}\n";
  s.insert(decl_at, z.declarations());
}

// The row values a reduction kernel defines (its prologue's and passes' `after` Lets), with their C types.
std::vector<std::pair<std::string, std::string>> row_value_decls(const KernelSpec& k) {
  std::vector<std::pair<std::string, std::string>> out;
  auto scan = [&](const std::vector<Stmt>& stmts) {
    for (const auto& st : stmts)
      if (st.kind == Stmt::kLet) out.emplace_back(st.name, compute_c_type(st.type));
  };
  scan(k.row_prologue);
  for (const auto& p : k.passes) scan(p.after);
  return out;
}

// The variables and buffers that statements (and accumulator inputs, and stored variables) read.
struct Reads {
  std::set<std::string> vars;
  std::set<int> buffers;
  void add(const Expr& e) {
    vars_read(e, &vars);
    buffers_read(e, &buffers);
  }
  void add(const std::vector<Stmt>& stmts) {
    for (const auto& st : stmts) add(*st.value);
  }
};

// Note [CPU column schedule]
// A column reduction walks a tile of up to kTile neighbouring rows at once: the loop over the row's
// elements is outside, the loop over the tile's rows inside and vectorized (contiguous loads), each row with
// its own accumulator (float32 sums in double, float64 sums compensated per 16 elements, products
// restarting every 16, float32 Welford in double: one running mean and M2 per row over the whole row, which
// in float lost 1e-4 of a 16385-element layer norm's variance where eager's lanes lose 1e-7). Row values are
// arrays over the tile; the `after` statements run once per row.
constexpr int kTile = 32;

// Note [Whole column tiles]
// As pointwise kernels run whole rows (Note [Whole rows]), a column kernel with literal sizes whose kept
// inner extent a tile height of 8 to kTile rows, a multiple of 8, divides runs the whole tiles of that
// height that start in its range of rows: every tile loop then has a literal trip count instead of one
// clipped at run time to the range and the extent, which GCC wrote with run-time checks and vectorized
// epilogues in each of the tile's loops (row values, accumulators, the element loop, the stores). The
// height is the largest such divisor (960 rows: 32; 120 and 72: 24); other extents keep clipped tiles.
// With it a GhostNet plan's source, compiled as one unit, took 1.9 s instead of 3.0 s in bfloat16 and
// 1.05 s instead of 1.7 s in float32 (its eight column kernels had half of bfloat16's difference).
int64_t whole_tile_rows(const SymInt& kin, const KernelNumbers& z) {
  if (z.arguments() || kin.is_symbolic()) return 0;
  for (int64_t t = kTile; t >= 8; t -= 8)
    if (static_cast<int64_t>(kin) % t == 0) return t;
  return 0;
}

// The type a column tile's Welford accumulator runs in: double for float32 (Note [CPU column schedule]).
const char* column_welford_type(const KernelAccumulator& a) {
  return a.type == DType::kFloat32 ? "double" : compute_c_type(a.type);
}

// A column tile's accumulators for one pass (Note [CPU column schedule]): one per row of the tile.
std::string tile_accumulators(const KernelPass& pass) {
  std::string s;
  const size_t na = pass.accs.size();
  for (size_t i = 0; i < na; ++i) {
    const auto& a = pass.accs[i];
    const char* ty = compute_c_type(a.type);
    if (a.kind == AccKind::kKahanSum)
      s += fmt::format("    {0} a{1}[{2}], ac{1}[{2}], ap{1}[{2}];\n    for (int r_ = 0; r_ < {2}; ++r_) a{1}[r_] = ac{1}[r_] = ap{1}[r_] = 0;\n",
                       ty, i, kTile);
    else if (a.kind == AccKind::kWelford)
      s += fmt::format("    {0} wm{1}[{2}], wq{1}[{2}], wc{1} = 0;\n    for (int r_ = 0; r_ < {2}; ++r_) wm{1}[r_] = wq{1}[r_] = 0;\n",
                       column_welford_type(a), i, kTile);
    else
      s += fmt::format("    {0} a{1}[{2}];\n    for (int r_ = 0; r_ < {2}; ++r_) a{1}[r_] = {3};\n", ty, i, kTile,
                       reduction_identity(a.kind, a.type));
  }
  return s;
}

// Per row of the tile, after the pass's loop: `acc<acc_base + i>` from the row's accumulators.
std::string tile_results(const KernelPass& pass, int acc_base) {
  std::string pre;
  const size_t na = pass.accs.size();
  for (size_t i = 0; i < na; ++i) {
    const auto& a = pass.accs[i];
    const size_t idx = acc_base + i;
    const char* ty = compute_c_type(a.type);
    if (a.kind == AccKind::kKahanSum)
      pre += fmt::format("      const {0} acc{1} = fj_kahan_value(a{2}[r_], ac{2}[r_], ap{2}[r_]);\n", ty, idx, i);
    else if (a.kind == AccKind::kWelford)
      pre += fmt::format("      fj_wf<{0}> acc{1}; acc{1}.mean = ({0})wm{2}[r_]; acc{1}.m2 = ({0})wq{2}[r_]; acc{1}.n = ({0})wc{2};\n",
                         ty, idx, i);
    else
      pre += fmt::format("      const {} acc{} = a{}[r_];\n", ty, idx, i);
  }
  return pre;
}

void print_column_kernel(const KernelSpec& k, std::string& s, const KernelNumbers& z) {
  const char* I = k.index32 ? "int32_t" : "int64_t";
  const size_t nd = k.sizes.size(), kd = static_cast<size_t>(k.kept_dims);
  const SymInt kin = k.sizes[kd - 1], L = k.row_len;
  auto ctype = [](DType t) { return std::string(compute_c_type(t)); };
  const auto rows = row_value_decls(k);
  auto scratch_type = [&](const std::string& var) { return std::string(scratch_c_type(k, var)); };
  const int64_t whole = whole_tile_rows(kin, z);  // Note [Whole column tiles]
  s += fmt::format("\n// {}, {} passes, column tiles of {} rows{}, {} offsets\n", reduction_summary(k, !z.arguments()),
                   k.passes.size(), whole ? whole : kTile, whole ? ", whole" : "", I);
  size_t decl_at = 0;
  print_signature(k, s, &decl_at);
  print_buffer_pointers(k, s);
  const std::string row_len = z(L), kept_inner = z(kin);
  s += fmt::format("  [[maybe_unused]] const I {} = {};\n", kRowLength, row_len);
  for (const auto& [var, ty] : k.scratch)
    s += fmt::format("  {0}* __restrict__ st_{1} = ({0}*)malloc(sizeof({0}) * {2} * {3});\n", compute_c_type(ty), var, row_len,
                     kTile);
  if (whole) {
    s += fmt::format("  for (int64_t row0_ = (begin_ + {0} - 1) / {0} * {0}; row0_ < end_; row0_ += {0}) {{\n", whole);
    s += fmt::format("    const int64_t kin_ = row0_ % {};\n    const int n_ = {};\n", kept_inner, whole);
  } else {
    s += "  for (int64_t row0_ = begin_; row0_ < end_;) {\n";
    s += fmt::format("    const int64_t kin_ = row0_ % {0};\n    int64_t n_ = {0} - kin_;\n", kept_inner);
    s += fmt::format("    if (n_ > {0}) n_ = {0};\n    if (n_ > end_ - row0_) n_ = end_ - row0_;\n", kTile);
  }
  s += fmt::format("    I r_ = (I)(row0_ / {}), c_;\n", kept_inner);
  for (size_t b = 0; b < k.buffers.size(); ++b)
    s += fmt::format("    I roff{} = (I)kin_ * {};\n", b, z(k.buffers[b].strides[kd - 1]));
  s += row_offsets_code(k, kd - 1, "    ", z.fn());
  for (size_t b = 0; b < k.buffers.size(); ++b)
    s += fmt::format("    {0}{1}* __restrict__ q{2} = p{2} + roff{2};\n", k.buffers[b].is_output ? "" : "const ",
                     storage_type(k.buffers[b].dtype), b);
  // Row buffers and row values: one per row of the tile.
  auto row_ref = [&](size_t b) { return fmt::format("q{}[r_ * {}]", b, z(k.buffers[b].strides[kd - 1])); };
  for (int b : k.row_loads)
    s += fmt::format("    {0} rb{1}[{2}];\n    for (int r_ = 0; r_ < n_; ++r_) rb{1}[r_] = {3};\n", ctype(k.buffers[b].dtype), b,
                     kTile, load_expr(k.buffers[b].dtype, load_ref(k, b, row_ref, z.args_fn())));
  for (const auto& [name, ty] : rows) s += fmt::format("    {} rv_{}[{}];\n", ty, name, kTile);
  // Declarations, inside a per-row loop, of the row buffers and row values that `reads` name.
  auto row_inputs = [&](const Reads& reads, const std::string& ind, const std::string& skip_from) {
    std::string t;
    for (int b : k.row_loads)
      if (reads.buffers.count(b)) t += fmt::format("{}const {} b{} = rb{}[r_];\n", ind, ctype(k.buffers[b].dtype), b, b);
    for (const auto& [name, ty] : rows) {
      if (name == skip_from) break;  // defined by the statements themselves from here on
      if (reads.vars.count(name)) t += fmt::format("{}const {} {} = rv_{}[r_];\n", ind, ty, name, name);
    }
    return t;
  };
  // Per-row statements (prologue, after): run for each row of the tile, saving what they define.
  auto per_row = [&](const std::vector<Stmt>& stmts, const std::string& pre) {
    if (stmts.empty()) return;
    Reads reads;
    reads.add(stmts);
    const std::string first_defined = stmts.front().kind == Stmt::kLet ? stmts.front().name : "";
    s += "    for (int r_ = 0; r_ < n_; ++r_) {\n" + pre;
    s += row_inputs(reads, "      ", first_defined);
    for (const auto& st : stmts) s += "      " + print_stmt(st, z.fn()) + "\n";
    for (const auto& [name, ty] : rows)
      for (const auto& st : stmts)
        if (st.kind == Stmt::kLet && st.name == name) s += fmt::format("      rv_{0}[r_] = {0};\n", name);
    s += "    }\n";
  };
  per_row(k.row_prologue, "");
  int acc_base = 0;
  for (const auto& pass : k.passes) {
    const size_t na = pass.accs.size();
    s += fmt::format("    {{  // pass {}\n", &pass - &k.passes[0]);
    s += tile_accumulators(pass);
    Reads reads;
    reads.add(pass.body);
    for (const auto& a : pass.accs) reads.add(*a.input);
    for (const auto& st : pass.stores) reads.vars.insert(st.second);
    s += fmt::format("    for (I j0_ = 0; j0_ < {0}; j0_ += 16) {{\n      const I je_ = {0} - j0_ < 16 ? {0} : j0_ + 16;\n", row_len);
    for (size_t i = 0; i < na; ++i)
      if (is_sum(pass.accs[i].kind) || pass.accs[i].kind == AccKind::kProd)
        s += fmt::format("      {0} s{1}[{2}];\n      for (int r_ = 0; r_ < {2}; ++r_) s{1}[r_] = {3};\n",
                         compute_c_type(pass.accs[i].type), i,
                         kTile, reduction_identity(pass.accs[i].kind, pass.accs[i].type));
    s += "      for (I e_ = j0_; e_ < je_; ++e_) {\n";
    for (size_t i = 0; i < na; ++i)
      if (pass.accs[i].kind == AccKind::kWelford)
        s += fmt::format("        wc{0} += 1; const {1} wi{0} = ({1})1 / wc{0};\n", i, column_welford_type(pass.accs[i]));
    s += "#pragma omp simd\n        for (int r_ = 0; r_ < n_; ++r_) {\n";
    const std::string ind = "          ";
    s += row_inputs(reads, ind, "");
    auto ref = [&](int b) {
      const auto& st = k.buffers[b].strides;
      std::string r = st[kd - 1] == 0 ? "" : st[kd - 1] == 1 ? "r_" : fmt::format("r_ * {}", z(st[kd - 1]));
      std::string e = st[nd - 1] == 0 ? "" : fmt::format("(int64_t)e_ * {}", z(st[nd - 1]));
      if (r.empty() && e.empty()) return fmt::format("q{}[0]", b);
      return fmt::format("q{}[{}{}{}]", b, r, !r.empty() && !e.empty() ? " + " : "", e);
    };
    for (int b : pass.loads)
      s += fmt::format("{}const {} b{} = {};\n", ind, ctype(k.buffers[b].dtype), b,
                       load_expr(k.buffers[b].dtype, load_ref(k, b, ref, z.args_fn())));
    for (const auto& var : pass.stash_in)
      s += fmt::format("{0}const {3} {1} = st_{1}[(int64_t)e_ * {2} + r_];\n", ind, var, kTile, scratch_type(var));
    for (const auto& st : pass.body) s += ind + print_stmt(st, z.fn()) + "\n";
    for (const auto& var : pass.stash_out) s += fmt::format("{0}st_{1}[(int64_t)e_ * {2} + r_] = {1};\n", ind, var, kTile);
    for (size_t i = 0; i < na; ++i) {
      const auto& a = pass.accs[i];
      const std::string in = print_expr(*a.input, z.fn());
      if (is_sum(a.kind)) s += fmt::format("{}s{}[r_] += {};\n", ind, i, in);
      else if (a.kind == AccKind::kProd) s += fmt::format("{}s{}[r_] *= {};\n", ind, i, in);
      else if (a.kind == AccKind::kMax || a.kind == AccKind::kMin)
        s += fmt::format("{0}a{1}[r_] = fj_red_{2}(a{1}[r_], {3});\n", ind, i, acc_kind_name(a.kind), in);
      else
        s += fmt::format("{0}{{ const {1} x_ = {2}; const {1} d_ = x_ - wm{3}[r_]; wm{3}[r_] += d_ * wi{3}; "
                         "wq{3}[r_] += d_ * (x_ - wm{3}[r_]); }}\n",
                         ind, column_welford_type(a), in, i);
    }
    for (const auto& [b, var] : pass.stores) s += fmt::format("{}{} = {};\n", ind, ref(b), store_var(k, b, var, var));
    s += "        }\n      }\n";
    for (size_t i = 0; i < na; ++i) {
      if (pass.accs[i].kind == AccKind::kKahanSum)
        s += fmt::format("#pragma omp simd\n      for (int r_ = 0; r_ < n_; ++r_) {{ ap{0}[r_] += s{0}[r_]; "
                         "fj_kahan_add(a{0}[r_], ac{0}[r_], s{0}[r_]); }}\n", i);
      else if (is_sum(pass.accs[i].kind) || pass.accs[i].kind == AccKind::kProd)
        s += fmt::format("      for (int r_ = 0; r_ < n_; ++r_) a{0}[r_] {1}= s{0}[r_];\n", i,
                         pass.accs[i].kind == AccKind::kProd ? "*" : "+");
    }
    s += "    }\n";
    // The pass's results and the row values after it, per row.
    const std::string pre = tile_results(pass, acc_base);
    acc_base += static_cast<int>(na);
    per_row(pass.after, pre);
    s += "    }\n";
  }
  for (const auto& [b, var] : k.row_stores)
    s += fmt::format("    for (int r_ = 0; r_ < n_; ++r_) q{0}[r_ * {1}] = {2};\n", b, z(k.buffers[b].strides[kd - 1]),
                     store_var(k, b, var, fmt::format("rv_{}[r_]", var)));
  s += whole ? "  }\n" : "    row0_ += n_;\n  }\n";
  for (const auto& sc : k.scratch) s += fmt::format("  free(st_{});\n", sc.first);
  s += "}\n";
  s.insert(decl_at, z.declarations());
}

}  // namespace

std::string print_cpu_source(std::vector<KernelSpec>& kernels, bool size_args) {
  std::string s = "// Generated by fusion_jit: CPU kernels of one plan.\n";
  s += kPrelude;
  s += kernel_hooks().prelude("cpu");  // empty but in tests (Note [Kernel hooks])
  for (auto& k : kernels) {
    k.args.clear();  // printed with literals: no arguments (with them: KernelNumbers sets them anew)
    k.arg_exprs.clear();
    const KernelNumbers z(size_args ? &k : nullptr);
    s += kKernelBreak;  // Note [One plan in several translation units]
    if (k.is_reduction() && reduction_is_column(k)) print_column_kernel(k, s, z);
    else if (k.is_reduction()) print_reduction_kernel(k, s, z);
    else print_kernel(k, s, z);
  }
  return s;
}

}  // namespace fusion_jit
