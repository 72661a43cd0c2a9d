// KernelSpec: a fusion group as a device-neutral kernel description.
//
// The iteration space is the group's shape, with its dims reordered by the first output's strides
// (outermost first) and adjacent dims merged where every buffer allows, so that the innermost loop runs
// over unit strides whenever the layouts permit. Each buffer has a stride per iteration dim: broadcast
// dims have stride 0, per-channel arguments (batch_norm's) a stride only on the channel dim.
// The body is straight-line scalar code over fj_* functions of the printers' preludes: it reads the
// buffer values `b<k>` (already converted to their compute type) and assigns the outputs `o<k>`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusion/fusion.h"

namespace fusion_jit {

struct KernelBuffer {
  const Value* value = nullptr;
  DType dtype = DType::kFloat32;
  bool is_output = false;
  std::vector<int64_t> strides;  // per iteration dim, in elements
  int64_t extent = 0;            // elements reachable from the data pointer
};

struct KernelSpec {
  std::string name;                 // fj_kernel_<group>
  int group = 0;
  Device device = Device::kCPU;     // the target: the device of the group's outputs
  std::vector<int64_t> sizes;       // iteration space after reordering and merging, at least one dim
  int64_t numel = 0;
  bool index32 = true;              // int32 offsets suffice for every buffer
  std::vector<KernelBuffer> buffers;  // argument order: inputs, then outputs
  std::vector<std::string> body;    // statements
};

KernelSpec make_kernel_spec(const FusionGroup& group);

// For the printers: a buffer element `ref` of dtype `t` loaded into its compute type (float for f16 and
// bf16, through the preludes' fj_h2f / fj_bf2f), and a compute-type value `v` converted for storing.
std::string load_expr(DType t, const std::string& ref);
std::string store_expr(DType t, const std::string& v);

// The device a group's kernel runs on (its first output's).
Device group_device(const FusionGroup& group);

// Known bugs that the fuzzer's self-test plants in code generation, to prove that the fuzzer catches
// each. Only tests set them; everything else leaves them false.
struct PlantedBugs {
  bool left_aligned_broadcast = false;  // a lower-rank input is aligned left (only where sizes agree)
  bool int32_always = false;            // int32 offsets even where an extent needs int64
  bool maximum_drops_nan = false;       // maximum and clamp without their NaN checks
  bool bf16_truncates = false;          // float -> bfloat16 truncates instead of rounding to nearest even
};
PlantedBugs& planted_bugs_for_tests();

}  // namespace fusion_jit
