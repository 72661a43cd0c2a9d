// Running a compiled CPU kernel over its iteration space, split into chunks across threads.
#pragma once

#include <cstdint>

#include "codegen/target.h"

namespace fusion_jit {

// `args`: the kernel's KernelSpec::args (Note [Sizes as kernel arguments]).
using CpuKernelFn = void (*)(void* const* buffers, const int64_t* args, int64_t begin, int64_t end);

// Runs `fn` over [0, numel): directly when numel <= grain, else through `pf`.
void launch_cpu_kernel(CpuKernelFn fn, void* const* buffers, const int64_t* args, int64_t numel, int64_t grain,
                       const ParallelFor& pf);

}  // namespace fusion_jit
