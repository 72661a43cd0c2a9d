#include "codegen/cuda_printer.h"

#include <fmt/format.h>

#include <algorithm>

namespace fusion_jit {
namespace {

const char* kPrelude =
#include "codegen/cuda_prelude.inc"
    ;
const char* kHalfPrelude =
#include "codegen/cuda_prelude_half.inc"
    ;
const char* kCommonPrelude =
#include "codegen/common_prelude.inc"
    ;
// 128-bit (or narrower) vectors of N elements, aligned to their size.
const char* kVector = "template <class T, int N> struct alignas(sizeof(T) * N) fj_vec { T v[N]; };\n";

std::string storage_type(DType t) {
  if (t == DType::kFloat16) return "__half";
  if (t == DType::kBFloat16) return "__nv_bfloat16";
  return dtype_c_type(t);
}

std::string compute_type(DType t) { return is_reduced_float(t) ? "float" : dtype_c_type(t); }


bool uses_reduced_floats(const KernelSpec& k) {
  for (const auto& b : k.buffers)
    if (is_reduced_float(b.dtype)) return true;
  for (const auto& line : k.body)
    if (line.find("fj_round_") != std::string::npos) return true;
  return false;
}

size_t first_output(const KernelSpec& k) {
  size_t f = 0;
  while (f < k.buffers.size() && !k.buffers[f].is_output) ++f;
  return f;
}

// `offK = ...` for every buffer, from the flat index `i` (an I), decomposed over the dims.
void print_offsets(const KernelSpec& k, const std::string& indent, std::string& s) {
  size_t nd = k.sizes.size();
  s += indent + "I r_ = i, c_;\n";
  for (size_t b = 0; b < k.buffers.size(); ++b) s += fmt::format("{}I off{} = 0;\n", indent, b);
  for (size_t d = nd; d-- > 0;) {
    bool used = false;
    for (const auto& b : k.buffers) used = used || b.strides[d] != 0;
    if (d > 0 && used) s += fmt::format("{0}c_ = r_ % {1}; r_ /= {1};\n", indent, k.sizes[d]);
    else if (d > 0) s += fmt::format("{}r_ /= {};\n", indent, k.sizes[d]);
    else if (used) s += indent + "c_ = r_;\n";
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      int64_t st = k.buffers[b].strides[d];
      if (st == 1) s += fmt::format("{}off{} += c_;\n", indent, b);
      else if (st != 0) s += fmt::format("{}off{} += c_ * {};\n", indent, b, st);
    }
  }
}

// The call of the body function with loaded values `in(b)` and output variables `out(b)`.
template <class In, class Out>
std::string body_call(const KernelSpec& k, In in, Out out) {
  std::string args;
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    args += args.empty() ? "" : ", ";
    args += k.buffers[b].is_output ? out(b) : load_expr(k.buffers[b].dtype, in(b));
  }
  return fmt::format("{}_body({});", k.name, args);
}

void print_kernel(const KernelSpec& k, std::string& s) {
  const char* I = k.index32 ? "int" : "long long";
  size_t nd = k.sizes.size();
  const int vec = cuda_vector_width(k);
  const size_t fo = first_output(k);
  s += fmt::format("\n// group {}: {} elements as [", k.group, k.numel);
  for (size_t d = 0; d < nd; ++d) s += (d ? "," : "") + std::to_string(k.sizes[d]);
  s += fmt::format("], {} offsets, vector width {}\n", k.index32 ? "int32" : "int64", vec);
  // The scalar body as a device function.
  std::string params;
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    params += params.empty() ? "" : ", ";
    const auto& kb = k.buffers[b];
    params += kb.is_output ? fmt::format("{}& o{}", compute_type(kb.dtype), b - fo)
                           : fmt::format("const {} b{}", compute_type(kb.dtype), b);
  }
  s += fmt::format("FJ_INLINE void {}_body({}) {{\n", k.name, params);
  for (const auto& line : k.body) s += "  " + line + "\n";
  s += "}\n";
  // The kernel.
  params.clear();
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const auto& kb = k.buffers[b];
    params += params.empty() ? "" : ", ";
    params += fmt::format("{}{}* __restrict__ p{}", kb.is_output ? "" : "const ", storage_type(kb.dtype), b);
  }
  s += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, {}) {}({}) {{\n", kCudaBlockSize,
                   kCudaMinBlocksPerSm, k.name, params);
  s += fmt::format("  typedef {} I;\n", I);
  s += "  const long long tid_ = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n";
  s += "  const long long stride_ = (long long)gridDim.x * blockDim.x;\n";
  s += "  long long first_ = tid_;  // the scalar loop's first element\n";
  auto decl_out = [&](const std::string& indent) {
    for (size_t b = fo; b < k.buffers.size(); ++b)
      s += fmt::format("{}{} o{};\n", indent, compute_type(k.buffers[b].dtype), b - fo);
  };
  if (vec > 1) {
    const int64_t nvec = k.numel / vec;
    std::string aligned;
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      if (k.buffers[b].strides[nd - 1] != 1) continue;
      aligned += aligned.empty() ? "" : " | ";
      aligned += fmt::format("((unsigned long long)p{} % {})", b, vec * dtype_size(k.buffers[b].dtype));
    }
    s += fmt::format("  if (({}) == 0) {{\n", aligned);
    s += fmt::format("    for (long long v_ = tid_; v_ < {}LL; v_ += stride_) {{\n", nvec);
    s += fmt::format("      const I i = (I)(v_ * {});\n", vec);
    print_offsets(k, "      ", s);
    for (size_t b = 0; b < fo; ++b) {
      const auto& kb = k.buffers[b];
      if (kb.strides[nd - 1] == 1)
        s += fmt::format("      const fj_vec<{0}, {1}> x{2} = *(const fj_vec<{0}, {1}>*)(p{2} + off{2});\n",
                         storage_type(kb.dtype), vec, b);
      else
        s += fmt::format("      const {0} x{1} = p{1}[off{1}];\n", storage_type(kb.dtype), b);
    }
    for (size_t b = fo; b < k.buffers.size(); ++b)
      s += fmt::format("      fj_vec<{}, {}> y{};\n", storage_type(k.buffers[b].dtype), vec, b);
    // One body per element, written out: a loop indexing the vectors would leave them in local memory
    // wherever the unroller gives up.
    for (int e = 0; e < vec; ++e) {
      s += "      {\n";
      decl_out("        ");
      s += "        " +
           body_call(
               k,
               [&](size_t b) {
                 return k.buffers[b].strides[nd - 1] == 1 ? fmt::format("x{}.v[{}]", b, e) : fmt::format("x{}", b);
               },
               [&](size_t b) { return fmt::format("o{}", b - fo); }) +
           "\n";
      for (size_t b = fo; b < k.buffers.size(); ++b)
        s += fmt::format("        y{}.v[{}] = {};\n", b, e, store_expr(k.buffers[b].dtype, fmt::format("o{}", b - fo)));
      s += "      }\n";
    }
    for (size_t b = fo; b < k.buffers.size(); ++b)
      s += fmt::format("      *(fj_vec<{0}, {1}>*)(p{2} + off{2}) = y{2};\n", storage_type(k.buffers[b].dtype), vec, b);
    s += "    }\n";
    s += fmt::format("    first_ = {}LL + tid_;\n  }}\n", nvec * vec);
  }
  s += fmt::format("  for (long long e_ = first_; e_ < {}LL; e_ += stride_) {{\n", k.numel);
  s += "    const I i = (I)e_;\n";
  print_offsets(k, "    ", s);
  decl_out("    ");
  s += "    " +
       body_call(k, [&](size_t b) { return fmt::format("p{0}[off{0}]", b); },
                 [&](size_t b) { return fmt::format("o{}", b - fo); }) +
       "\n";
  for (size_t b = fo; b < k.buffers.size(); ++b)
    s += fmt::format("    p{0}[off{0}] = {1};\n", b, store_expr(k.buffers[b].dtype, fmt::format("o{}", b - fo)));
  s += "  }\n}\n";
}

}  // namespace

int cuda_vector_width(const KernelSpec& k) {
  size_t nd = k.sizes.size();
  int64_t widest = 0;
  for (const auto& b : k.buffers) {
    int64_t st = b.strides[nd - 1];
    if (st != 0 && st != 1) return 1;
    if (st == 1) widest = std::max<int64_t>(widest, dtype_size(b.dtype));
  }
  for (const auto& b : k.buffers)
    if (b.is_output && b.strides[nd - 1] != 1) return 1;  // outputs are written whole
  if (widest == 0) return 1;
  int vec = static_cast<int>(std::min<int64_t>(8, 16 / widest));
  if (vec < 2 || k.numel < 2 * vec) return 1;
  if (nd > 1 && k.sizes[nd - 1] % vec != 0) return 1;
  // Every contiguous buffer's rows must start on a vector boundary.
  for (const auto& b : k.buffers) {
    if (b.strides[nd - 1] != 1) continue;
    for (size_t d = 0; d + 1 < nd; ++d)
      if (b.strides[d] % vec != 0) return 1;
  }
  return vec;
}

int64_t cuda_work_items(const KernelSpec& k) {
  int vec = cuda_vector_width(k);
  return (k.numel + vec - 1) / vec;
}

std::string print_cuda_source(const std::vector<KernelSpec>& kernels) {
  std::string s = "// Generated by fusion_jit: CUDA kernels of one plan.\n";
  s += kPrelude;
  bool half = false;
  for (const auto& k : kernels) half = half || uses_reduced_floats(k);
  if (half) s += kHalfPrelude;
  s += kCommonPrelude;
  s += kVector;
  for (const auto& k : kernels) print_kernel(k, s);
  return s;
}

}  // namespace fusion_jit
