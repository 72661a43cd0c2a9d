// The CUDA target's schedule: every launch-geometry decision of a CUDA kernel, in one place that the
// lowering (what a reduction keeps in registers), the printer (loops, vector paths) and the launcher
// (grid size) share.
#pragma once

#include <cstdint>

#include "codegen/kernel_spec.h"

namespace fusion_jit {

struct KernelSpec;

constexpr int kCudaBlockSize = 256;
// __launch_bounds__'s minimum resident blocks per SM. 1 leaves ptxas free to use as many registers as a
// kernel's body needs: without the minimum, sm_90's ptxas aimed at full occupancy (32 registers) and
// spilled batch_norm's chain; with 4 (64 registers) long fused chains of transcendental ops spilled.
// Elementwise kernels are memory-bound and use 128-bit accesses, so fewer resident warps cost little.
constexpr int kCudaMinBlocksPerSm = 1;

// Elements per thread on the vector path; 1 when the kernel has no vector path.
int cuda_vector_width(const KernelSpec& k);
// Threads that have work on the kernel's main path (whole vectors, or elements); the launch sizes the
// grid from it and the device's SM count.
int64_t cuda_work_items(const KernelSpec& k);

// The CUDA schedule of a reduction kernel (Note [CUDA reduction schedule] in cuda_printer.cpp): threads
// per row (a warp for rows up to 512 elements, a block of 256 otherwise, kCudaColumnThreads for column
// reductions), elements each thread handles (rounded up to a power of two: the unrolled loop's trip
// count, printed into the kernel, so that rows of lengths in (n/2, n] elements per thread share one
// kernel when sizes are arguments; the loop skips the elements past the row), and whether those stay in
// registers across the passes (at most kCudaRowRegisters per thread).
constexpr int64_t kCudaRowRegisters = 16;
constexpr int kCudaColumnThreads = 8;
int cuda_threads_per_row(const KernelSpec& k);
int64_t cuda_elements_per_thread(const KernelSpec& k);
bool cuda_row_in_registers(const KernelSpec& k);

// Note [Run-time dividers]
// With sizes as arguments a kernel's offsets divide the flat index by sizes known only at run time; a
// hardware integer division is a long instruction sequence, where a constant divisor is a multiply and
// a shift. As ATen's IntDivider does for its own kernels, the host computes for each divisor d (at most
// 2^31 - 1) a magic number m and a shift s, passed with the sizes, and the kernel divides an int32 index
// n (below 2^31) as (umulhi(n, m) + n) >> s (the prelude's fj_udiv): exact for every such n and d.
// (The computation is codegen's runtime_divider, which a shape class's kernel arguments derive from a
// size at each size: KernelSpec::arg_of.)
using CudaDivider = RuntimeDivider;
CudaDivider cuda_divider(int64_t divisor);
// The quotient fj_udiv computes, on the host (for tests).
uint32_t cuda_divide(uint32_t n, const CudaDivider& d);

// Blocks of kCudaBlockSize threads to launch for `work_items` (cuda_work_items) on a device with
// `sm_count` SMs: enough for the work, capped at one full wave of resident blocks (the kernels loop over
// the rest): `blocks_per_sm` of the kernel's (its registers decide; 0: unknown, a full SM's 2048 threads).
//
// Note [One wave of blocks]
// A kernel of more than 32 registers per thread does not fit 8 blocks of 256 threads on an SM (65536
// registers): at 39, 6 fit. A grid of 8 blocks per SM then runs as a wave of 6 and a tail of 2 per SM,
// the tail leaving most of the GPU idle; the dynamic softmax (39 registers, its literal twin 30) took 1.2x
// its twin's time on an H200. The driver's occupancy query (CudaModule::resident_blocks), made once per
// kernel when its module loads, gives the blocks per SM; the grid is one wave of those.
int64_t cuda_grid_blocks(int64_t work_items, int sm_count, int blocks_per_sm = 0);

}  // namespace fusion_jit
