// The CPU code printer: a plan's KernelSpecs as one C++ translation unit, one extern "C" function per
// kernel: `void NAME(void* const* buffers, const int64_t* z, int64_t begin, int64_t end)` computes the
// elements (or rows) [begin, end) of the flattened iteration space; `z` holds the kernel's `args`, the
// numbers it reads at run time (Note [Sizes as kernel arguments], codegen/kernel_spec.h). Deterministic: the
// same specs give the same text.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_spec.h"

namespace fusion_jit {

// With `size_args`, sizes, strides, row lengths and piece bounds other than 0 and 1 are read from `z`, and
// each kernel's `args` are set to their values; else they are literals and `args` is empty.
std::string print_cpu_source(std::vector<KernelSpec>& kernels, bool size_args = false);

}  // namespace fusion_jit
