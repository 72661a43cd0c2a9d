// Code generation targets: what differs per device, behind one interface.
//
// A target owns
//  - its lowering policy: where the device's eager kernels compute differently and the generated code must
//    follow (which scalars are rounded to float16/bfloat16 before the arithmetic, which erf and gelu, pow's
//    special cases, how float sums accumulate, which values a reduction keeps between passes);
//  - its printer and preludes: the kernels of one plan as one source (codegen/<target>/);
//  - its schedule, which the printer and the launcher share (CUDA: codegen/cuda/cuda_printer.h).
// Lowering (kernel_spec.cpp) asks the target of the group's device and branches on no device itself.
// Compiling a source into an artifact and launching it are still done by compile/ (host compiler, NVRTC)
// and runtime/ (CPU launch, CUDA Driver API); docs/howto.md says what a new target adds there.
//
// Adding a target: a folder codegen/<name>/ with a class implementing Target, and one line in
// target_for (target.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"
#include "ir/op_table.h"

namespace fusion_jit {

struct KernelSpec;

class Target {
 public:
  virtual ~Target() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual Device device() const = 0;

  // ---- Lowering policy ----
  // Whether eager rounds argument `i` of `op` (`v`: the value, null for a literal) to a float16/bfloat16
  // result's dtype before the arithmetic; `promoting` is whether it takes part in type promotion.
  virtual bool rounds_argument(const OpInfo& op, size_t i, const Value* v, const Value* out, bool promoting) const = 0;
  // The prelude function family that computes `fn` (the op table's kernel function) for a result of dtype
  // `out`: `fn` itself, or a variant that follows this device's eager ("erf_as", "gelu_erf", ...).
  virtual std::string math_fn(const std::string& fn, DType out) const = 0;
  // Whether pow with a literal exponent of 0.5 or -0.5 becomes sqrt / rsqrt for a result of dtype `out`.
  virtual bool pow_uses_sqrt(DType out) const = 0;
  // How a floating sum accumulating in `acc` (float32 or float64) adds up; `non_negative`: its terms
  // cannot be negative (they cannot cancel).
  virtual AccKind float_sum(DType acc, bool non_negative) const = 0;
  // Whether a reduction kernel may keep one more element value of dtype `t` between passes (instead of
  // computing it again), `kept` values being kept already; `budget` is the target's own account (bytes
  // of scratch left, starting at kScratchStart).
  static constexpr int64_t kScratchStart = 256 * 1024;
  virtual bool may_keep_between_passes(const KernelSpec& k, DType t, size_t kept, int64_t* budget) const = 0;

  // ---- Printing ----
  // The kernels of one plan as one source for this target's compiler.
  virtual std::string print_source(const std::vector<KernelSpec>& kernels) const = 0;
};

// The target of a device. Throws fusion_jit::Error for a device no target handles.
const Target& target_for(Device device);

// The targets, defined in their folders.
const Target& cpu_target();
const Target& cuda_target();

}  // namespace fusion_jit
