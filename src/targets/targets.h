// The targets: which one serves a device, and each by name. Registering a target is its entry in the
// table of targets.cpp; nothing else in the library names a target.
#pragma once

#include <string>
#include <vector>

#include "codegen/target.h"

namespace fusion_jit {

// Every registered target.
const std::vector<const Target*>& all_targets();
// The target of a device. Throws fusion_jit::Error for a device no target handles.
const Target& target_for(Device device);
// The target called `name` ("cpu", "cuda"), or nullptr.
const Target* target_named(const std::string& name);

}  // namespace fusion_jit
