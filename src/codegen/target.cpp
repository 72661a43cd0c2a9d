#include "codegen/target.h"

#include "support/error.h"

namespace fusion_jit {

const Target& target_for(Device device) {
  switch (device) {
    case Device::kCPU: return cpu_target();
    case Device::kCUDA: return cuda_target();
  }
  FJ_CHECK(false, "no code generation target for device {}", static_cast<int>(device));
  return cpu_target();
}

}  // namespace fusion_jit
