// The CUDA code printer: a plan's KernelSpecs as one CUDA C++ translation unit for NVRTC, one
// `extern "C" __global__` kernel per spec, taking one pointer per buffer (inputs, then outputs) and,
// with sizes as arguments, its numbers as one parameter (Note [CUDA size arguments]); otherwise sizes and
// strides are constants of the plan's signature.
//
// Schedule (pointwise): a grid-stride loop over the flattened iteration space. When every buffer's
// innermost stride is 0 or 1 and the sizes allow, a kernel also has a vector path: each thread handles
// `vector width` consecutive elements with one 128-bit load or store per contiguous buffer (one scalar
// load per broadcast buffer); the path is taken at run time when every contiguous buffer's pointer is
// aligned, and the elements past the last whole vector run through the scalar loop. The scalar body is
// the KernelSpec's, in one device function per kernel shared by both paths. Index math is int32 or
// int64 by KernelSpec::index32, the same rule as the CPU path. Deterministic: same specs, same text.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_spec.h"
#include "targets/cuda/cuda_schedule.h"

namespace fusion_jit {

// With sizes and strides as literals.
std::string print_cuda_source(const std::vector<KernelSpec>& kernels);
// With `size_args`, sizes and strides as arguments (Note [Sizes as kernel arguments]): each kernel's
// values are recorded in its `args`, in the order its code reads them. Without, `args` are cleared.
std::string print_cuda_source(std::vector<KernelSpec>& kernels, bool size_args);

}  // namespace fusion_jit
