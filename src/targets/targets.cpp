#include "targets/targets.h"

#include "support/error.h"

namespace fusion_jit {

// Defined in each target's folder.
const Target& cpu_target();
const Target& cuda_target();

const std::vector<const Target*>& all_targets() {
  // The registration: one entry per target.
  static const std::vector<const Target*> targets{&cpu_target(), &cuda_target()};
  return targets;
}

const Target& target_for(Device device) {
  for (const Target* t : all_targets())
    if (t->device() == device) return *t;
  FJ_CHECK(false, "no target for device {}", static_cast<int>(device));
  return *all_targets().front();
}

const Target* target_named(const std::string& name) {
  for (const Target* t : all_targets())
    if (name == t->name()) return t;
  return nullptr;
}

}  // namespace fusion_jit
