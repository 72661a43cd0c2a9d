// The Target interface's defaults (codegen/target.h).
#include "codegen/target.h"

#include <fmt/format.h>

#include "support/error.h"

namespace fusion_jit {

std::vector<PackagedImage> Target::package_images(const std::string&, const std::vector<std::string>&) const {
  detail::throw_error(fmt::format("the {} target's kernels cannot be packaged yet", name()));
}

std::string Target::cannot_load(const PackagedImage&) const {
  return fmt::format("this fusion_jit loads no packaged {} kernels", name());
}

std::shared_ptr<const Artifact> Target::load_image(const PackagedImage& image) const {
  detail::throw_error(fmt::format("cannot load packaged {} kernels ({}): {}", name(), image.variant, cannot_load(image)));
}

}  // namespace fusion_jit
