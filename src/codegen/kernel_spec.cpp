// KernelSpec's own functions, and what the printers of every target share (codegen/kernel_spec.h).
#include "codegen/kernel_spec.h"

#include <atomic>

#include <fmt/format.h>

#include <functional>
#include <map>

#include "support/error.h"

namespace fusion_jit {
namespace {

KernelHooks g_kernel_hooks;
std::atomic<EagerCpuMath (*)()> g_eager_cpu_math_probe{nullptr};

}  // namespace

RuntimeDivider runtime_divider(int64_t divisor) {
  FJ_CHECK(divisor >= 1 && divisor <= INT32_MAX, "no run-time divider for {}", divisor);
  const uint64_t d = static_cast<uint64_t>(divisor);
  RuntimeDivider r;
  while ((uint64_t{1} << r.shift) < d) ++r.shift;
  const uint64_t magic = ((uint64_t{1} << 32) * ((uint64_t{1} << r.shift) - d)) / d + 1;
  FJ_INTERNAL_ASSERT(magic <= UINT32_MAX, "divider {}: magic {}", divisor, magic);
  r.magic = static_cast<uint32_t>(magic);
  return r;
}

int64_t arg_value_of(ArgOf of, int64_t v) {
  switch (of) {
    case ArgOf::kValue: return v;
    case ArgOf::kDividerMagic: return runtime_divider(v).magic;
    case ArgOf::kDividerShift: return runtime_divider(v).shift;
  }
  throw Error(fmt::format("an argument of kind {}", static_cast<int>(of)));
}

std::vector<int64_t> arg_values(const KernelSpec& k, const SymBindings& bindings) {
  FJ_INTERNAL_ASSERT(k.arg_exprs.size() == k.args.size(), "{}: {} argument expressions for {} arguments", k.name,
                     k.arg_exprs.size(), k.args.size());
  FJ_INTERNAL_ASSERT(k.arg_of.empty() || k.arg_of.size() == k.args.size(), "{}: {} argument kinds for {} arguments",
                     k.name, k.arg_of.size(), k.args.size());
  std::vector<int64_t> out;
  out.reserve(k.args.size());
  for (size_t i = 0; i < k.arg_exprs.size(); ++i) {
    const int64_t v = k.arg_exprs[i].evaluate(bindings);
    out.push_back(k.arg_of.empty() ? v : arg_value_of(k.arg_of[i], v));
  }
  return out;
}

void evaluate_numbers(KernelSpec* k, const SymBindings& bindings) {
  auto at = [&](SymInt& v) { v = SymInt(v.evaluate(bindings)); };
  auto all = [&](SymSizes& s) {
    for (SymInt& v : s) at(v);
  };
  k->args = arg_values(*k, bindings);
  for (SymInt& v : k->arg_exprs) at(v);
  all(k->sizes);
  at(k->numel);
  for (KernelBuffer& b : k->buffers) {
    all(b.strides);
    at(b.extent);
    at(b.offset);
    at(b.gather_stride);
    at(b.gather_rows);
  }
  for (KernelPiece& p : k->pieces) {
    at(p.start);
    at(p.end);
  }
  at(k->rows);
  at(k->row_len);
}

void set_kernel_hooks(KernelHooks hooks) { g_kernel_hooks = std::move(hooks); }
const KernelHooks& kernel_hooks() { return g_kernel_hooks; }

std::vector<int> KernelSpec::piece_path(int p) const {
  std::vector<int> path;
  for (; p >= 0; p = pieces.at(static_cast<size_t>(p)).parent) path.insert(path.begin(), p);
  return path;
}

std::vector<int> KernelSpec::piece_leaves() const {
  std::vector<bool> parent(pieces.size(), false);
  for (const auto& p : pieces)
    if (p.parent >= 0) parent[static_cast<size_t>(p.parent)] = true;
  std::vector<int> leaves;
  for (size_t p = 0; p < pieces.size(); ++p)
    if (!parent[p]) leaves.push_back(static_cast<int>(p));
  return leaves;
}

SymInt KernelSpec::piece_shift(const KernelBuffer& b) const {
  if (b.piece < 0) return 0;
  std::map<int, SymInt> start;  // dim -> the deepest piece's start along it
  for (int p : piece_path(b.piece)) start[pieces[static_cast<size_t>(p)].dim] = pieces[static_cast<size_t>(p)].start;
  SymInt shift = 0;
  for (const auto& [d, s] : start) shift += s * b.strides.at(static_cast<size_t>(d));
  return shift;
}

SymInt KernelSpec::inner_elements(int dim) const {
  SymInt n = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < sizes.size(); ++d) n *= sizes[d];
  return n;
}

std::string load_expr(DType t, const std::string& ref) {
  if (t == DType::kFloat16) return "fj_h2f(" + ref + ")";
  if (t == DType::kBFloat16) return "fj_bf2f(" + ref + ")";
  return ref;
}

std::string load_ref(const KernelSpec& k, size_t b, const std::function<std::string(size_t)>& ref,
                     const NumberFn& number) {
  const KernelBuffer& kb = k.buffers.at(b);
  std::string r = ref(b);
  if (kb.gather < 0) return r;
  FJ_INTERNAL_ASSERT(!r.empty() && r.back() == ']', "{}: buffer {} is read as {}", k.name, b, r);
  auto n = [&](const SymInt& v) {
    return number ? "(long long)" + number(v) : std::to_string(static_cast<int64_t>(v)) + "LL";
  };
  return fmt::format("{} + fj_gather_row((long long)({}), {}) * {}]", r.substr(0, r.size() - 1),
                     ref(static_cast<size_t>(kb.gather)), n(kb.gather_rows), n(kb.gather_stride));
}

bool has_gathers(const KernelSpec& k) {
  for (const auto& b : k.buffers)
    if (b.gather >= 0) return true;
  return false;
}

bool piece_on_path(const KernelSpec& k, int piece, int leaf) {
  for (int p = leaf; p >= 0; p = k.pieces.at(static_cast<size_t>(p)).parent)
    if (p == piece) return true;
  return false;
}

std::vector<Stmt> piece_statements(const KernelSpec& k, int leaf) {
  std::vector<Stmt> out;
  for (int p = leaf; p >= 0; p = k.pieces.at(static_cast<size_t>(p)).parent) {
    const KernelPiece& pc = k.pieces[static_cast<size_t>(p)];
    out.insert(out.end(), pc.body.begin(), pc.body.end());
    out.push_back(Stmt::let(pc.var, pc.type, pc.value, "aten::cat"));
  }
  return out;
}

std::string store_expr(DType t, const std::string& v) {
  if (t == DType::kFloat16) return "fj_f2h(" + v + ")";
  if (t == DType::kBFloat16) return "fj_f2bf(" + v + ")";
  return "(" + std::string(dtype_c_type(t)) + ")(" + v + ")";
}

std::string reduction_identity(AccKind kind, DType type) {
  const char* ty = compute_c_type(type);
  if (is_sum(kind) || kind == AccKind::kWelford) return fmt::format("(({})0)", ty);
  if (kind == AccKind::kProd) return fmt::format("(({})1)", ty);
  const bool max = kind == AccKind::kMax;
  switch (type) {
    case DType::kFloat32: return max ? "(-FJ_INFF)" : "FJ_INFF";
    case DType::kFloat64: return max ? "(-FJ_INF)" : "FJ_INF";
    case DType::kInt64: return max ? "(-9223372036854775807LL - 1)" : "9223372036854775807LL";
    case DType::kInt32: return max ? "(-2147483647 - 1)" : "2147483647";
    case DType::kInt16: return max ? "((int16_t)-32768)" : "((int16_t)32767)";
    case DType::kInt8: return max ? "((int8_t)-128)" : "((int8_t)127)";
    case DType::kUInt8: return max ? "((uint8_t)0)" : "((uint8_t)255)";
    default: break;
  }
  FJ_INTERNAL_ASSERT(false, "no {} identity for {}", acc_kind_name(kind), dtype_name(type));
  return "";
}

std::string reduction_summary(const KernelSpec& k, bool sizes) {
  const size_t kd = static_cast<size_t>(k.kept_dims);
  if (!sizes) return fmt::format("group {}: {} kept and {} reduced dims", k.group, kd, k.sizes.size() - kd);
  std::string s = fmt::format("group {}: {} rows of {} elements as [", k.group, static_cast<int64_t>(k.rows),
                              static_cast<int64_t>(k.row_len));
  for (size_t d = 0; d < k.sizes.size(); ++d)
    s += (d ? (d == kd ? " | " : ",") : "") + std::to_string(static_cast<int64_t>(k.sizes[d]));
  return s + "]";
}

std::string offsets_code(const KernelSpec& k, size_t lo, size_t hi, const OffsetNames& n, const std::string& indent) {
  auto num = [&](const SymInt& v) {
    return n.number && v != 0 && v != 1 ? n.number(v) : std::to_string(static_cast<int64_t>(v));
  };
  std::string s;
  for (size_t d = hi; d-- > lo;) {
    bool used = false;
    for (const auto& b : k.buffers) used = used || b.strides[d] != 0;
    const bool coord = used || !n.skip_unused_dims;
    const std::string divided = d > lo && n.divide ? n.divide(n.index, coord ? n.coord : "", k.sizes[d]) : "";
    if (!divided.empty()) {
      s += indent + divided + "\n";
    } else if (d > lo && coord) {
      const std::string size = num(k.sizes[d]);
      s += fmt::format("{0}{1} = {2} % {3}; {2} /= {3};\n", indent, n.coord, n.index, size);
    } else if (d > lo) {
      s += fmt::format("{}{} /= {};\n", indent, n.index, num(k.sizes[d]));
    } else if (coord) {
      s += fmt::format("{}{} = {};\n", indent, n.coord, n.index);
    }
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      const SymInt& st = k.buffers[b].strides[d];
      if (st == 1 && n.short_unit_stride) s += fmt::format("{}{}{} += {};\n", indent, n.offset, b, n.coord);
      else if (st != 0) s += fmt::format("{}{}{} += {} * {};\n", indent, n.offset, b, n.coord, num(st));
    }
  }
  return s;
}

std::string row_offsets_code(const KernelSpec& k, size_t dims, const std::string& indent,
                             const NumberFn& number) {
  return offsets_code(k, 0, dims, {"r_", "c_", "roff", false, false, number}, indent) + indent + "(void)c_;\n";
}

bool reduction_is_column(const KernelSpec& k) {
  const size_t nd = k.sizes.size(), kd = static_cast<size_t>(k.kept_dims);
  if (!k.is_reduction() || nd - kd != 1 || k.sizes[kd - 1] < 2) return false;
  for (const auto& b : k.buffers)  // the first input that varies along the row
    if (!b.is_output && b.strides[nd - 1] != 0) return b.strides[kd - 1] == 1 && sym_abs(b.strides[nd - 1]) > 1;
  return false;
}

void set_eager_cpu_math_probe(EagerCpuMath (*probe)()) { g_eager_cpu_math_probe = probe; }

const EagerCpuMath& eager_cpu_math() {
  static const EagerCpuMath m = [] {
    auto probe = g_eager_cpu_math_probe.load();
    return probe ? probe() : EagerCpuMath{};
  }();
  return m;
}

}  // namespace fusion_jit
