// The CPU code printer: a plan's KernelSpecs as one C++ translation unit, one extern "C" function per
// kernel: `void NAME(void* const* buffers, int64_t begin, int64_t end)` computes the elements
// [begin, end) of the flattened iteration space. Deterministic: the same specs give the same text.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_spec.h"

namespace fusion_jit {

std::string print_cpu_source(const std::vector<KernelSpec>& kernels);

}  // namespace fusion_jit
