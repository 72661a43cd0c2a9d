#include "targets/cuda/cuda_schedule.h"

#include <algorithm>
#include <cstdint>

#include "codegen/kernel_spec.h"
#include "support/error.h"

namespace fusion_jit {

int cuda_vector_width(const KernelSpec& k) {
  if (k.is_reduction() || has_gathers(k)) return 1;  // a gathered row need not start on a vector boundary
  if (!k.pieces.empty()) return 1;  // an element's piece is chosen per element
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
  // Divisibility, as SymInts: a shape class's kernel keeps its vector path where a guard on the sizes'
  // residues holds (Note [Symbolic sizes]) rather than fixing them.
  if (nd > 1 && mod(k.sizes[nd - 1], vec) != 0) return 1;
  // Every contiguous buffer's rows must start on a vector boundary.
  for (const auto& b : k.buffers) {
    if (b.strides[nd - 1] != 1) continue;
    for (size_t d = 0; d + 1 < nd; ++d)
      if (mod(b.strides[d], vec) != 0) return 1;
  }
  return vec;
}

int64_t cuda_work_items(const KernelSpec& k) {
  if (k.is_reduction()) {  // one block per group of rows
    const int rb = kCudaBlockSize / cuda_threads_per_row(k);
    return (k.rows + rb - 1) / rb * kCudaBlockSize;
  }
  int vec = cuda_vector_width(k);
  return (k.numel + vec - 1) / vec;
}

int cuda_threads_per_row(const KernelSpec& k) {
  if (reduction_is_column(k)) return kCudaColumnThreads;
  return k.row_len <= 512 ? 32 : 256;
}
int64_t cuda_elements_per_thread(const KernelSpec& k) {
  const int t = cuda_threads_per_row(k);
  int64_t n = 1;
  while (n * t < k.row_len) n *= 2;
  return n;
}
bool cuda_row_in_registers(const KernelSpec& k) { return cuda_elements_per_thread(k) <= kCudaRowRegisters; }

CudaDivider cuda_divider(int64_t divisor) { return runtime_divider(divisor); }

uint32_t cuda_divide(uint32_t n, const CudaDivider& d) {
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * d.magic) >> 32);
  return static_cast<uint32_t>((static_cast<uint64_t>(hi) + n) >> d.shift);
}

int64_t cuda_grid_blocks(int64_t work_items, int sm_count, int blocks_per_sm) {
  const int64_t per_sm = blocks_per_sm > 0 ? blocks_per_sm : 2048 / kCudaBlockSize;  // one full wave
  const int64_t blocks = (work_items + kCudaBlockSize - 1) / kCudaBlockSize;
  return std::max<int64_t>(1, std::min<int64_t>(blocks, per_sm * std::max(1, sm_count)));
}

}  // namespace fusion_jit
