// The CUDA target: CUDA C++ for NVRTC (cuda_printer.cpp and the cuda_prelude*.inc files), with the
// schedule of cuda_printer.h.
#include "codegen/cuda/cuda_printer.h"
#include "codegen/kernel_spec.h"
#include "codegen/target.h"

namespace fusion_jit {
namespace {

class CudaTarget final : public Target {
 public:
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::kCUDA; }
  // Every promoting argument is rounded (the CPU's exceptions were not checked against CUDA's kernels).
  bool rounds_argument(const OpInfo&, size_t, const Value*, const Value*, bool promoting) const override {
    return promoting;
  }
  std::string math_fn(const std::string& fn, DType) const override { return fn; }
  bool pow_uses_sqrt(DType) const override { return true; }
  AccKind float_sum(DType, bool) const override { return AccKind::kKahanSum; }
  // In registers: only rows a thread holds whole, two values at most.
  bool may_keep_between_passes(const KernelSpec& k, DType, size_t kept, int64_t*) const override {
    return cuda_row_in_registers(k) && kept < 2;
  }
  std::string print_source(const std::vector<KernelSpec>& kernels) const override { return print_cuda_source(kernels); }
};

}  // namespace

const Target& cuda_target() {
  static const CudaTarget t;
  return t;
}

}  // namespace fusion_jit
