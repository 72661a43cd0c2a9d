// Lowering: a fusion group as a KernelSpec (codegen/kernel_spec.h) under the policy of the Target of its
// device (codegen/target.h): its buffers and their strides, the group's code as kernel IR (Note [Kernel
// IR]; Note [Reduction kernels], Note [Gathered loads], Note [Cats of unequal items]), its iteration dims
// ordered by the first output's strides and merged (the one dim-merge routine), and the index width (the
// one index-width rule). The test-only KernelHooks (Note [Kernel hooks]) see its kernels.
#pragma once

#include "codegen/kernel_spec.h"
#include "fusion/fusion.h"

namespace fusion_jit {

class Target;

// Lowers `group` under the policy of `target`, the target of the group's device (targets/targets.h).
KernelSpec make_kernel_spec(const FusionGroup& group, const Target& target);

// The device a group's kernel runs on (its first output's).
Device group_device(const FusionGroup& group);

}  // namespace fusion_jit
