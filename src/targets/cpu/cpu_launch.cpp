#include "targets/cpu/cpu_launch.h"

namespace fusion_jit {

void launch_cpu_kernel(CpuKernelFn fn, void* const* buffers, const int64_t* args, int64_t numel, int64_t grain,
                       const ParallelFor& pf) {
  if (numel <= 0) return;
  if (numel <= grain || !pf) {
    fn(buffers, args, 0, numel);
    return;
  }
  pf(numel, grain, [&](int64_t b, int64_t e) { fn(buffers, args, b, e); });
}

}  // namespace fusion_jit
