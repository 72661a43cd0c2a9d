// Running a compiled CPU kernel over its iteration space, split into chunks across threads.
#pragma once

#include <cstdint>
#include <functional>

namespace fusion_jit {

using CpuKernelFn = void (*)(void* const* buffers, int64_t begin, int64_t end);
// Calls fn(begin, end) over [0, n) in chunks of at least `grain` (torch's at::parallel_for in the adapter,
// so torch's thread settings hold).
using ParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)>;

// Runs `fn` over [0, numel): directly when numel <= grain, else through `pf`.
void launch_cpu_kernel(CpuKernelFn fn, void* const* buffers, int64_t numel, int64_t grain, const ParallelFor& pf);

}  // namespace fusion_jit
