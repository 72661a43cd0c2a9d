// Targets: what differs per device, behind one interface.
//
// A target owns
//  - its lowering policy: where the device's eager kernels compute differently and the generated code must
//    follow (which scalars are rounded to float16/bfloat16 before the arithmetic, which erf and gelu, pow's
//    special cases, how float sums accumulate, which values a reduction keeps between passes);
//  - its printer and preludes: the kernels of one plan as one source;
//  - its schedule, which the printer and the launcher share (CUDA: threads per row, vector width, grid);
//  - compiling that source into an Artifact (a shared object, a CUBIN or PTX), kept in the kernel cache;
//  - loading an artifact's kernels for a device and launching them.
// Lowering (lowering.cpp) is given the target of the group's device; the driver, the runtime and the
// torch adapter go through this interface and branch on no device. The implementations live in
// targets/<name>/; targets/targets.h finds a device's target.
//
// Adding a target: a folder targets/<name>/ with a class implementing Target (and its Artifact and
// LoadedKernels), and one line in target_for (targets/targets.cpp). docs/howto.md says more.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"
#include "cost/cost_model.h"
#include "ir/op_table.h"

namespace fusion_jit {

// batch_norm in inference: x * alpha + beta (alpha = w / sqrt(var + eps), beta = b - mean * alpha), or
// ((x - mean) * invstd) * w + b.
enum class BatchNormForm { kScaleShift, kNormalize };

struct KernelSpec;

// An element value of a reduction kernel that a later pass needs again (Target::may_keep_between_passes).
struct KeptValue {
  DType dtype;
  bool expensive;     // its op is flagged expensive (exp, erf, ...)
  int element_loads;  // the element buffers it reads, directly or through the values it is made of
};

// Calls fn(begin, end) over [0, n) in chunks of at least `grain`.
using ParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)>;

// What the caller of a plan (the torch adapter) gives each launch.
struct LaunchContext {
  // Host targets split their kernels with it: torch's at::parallel_for, so that torch's thread settings
  // hold.
  ParallelFor parallel_for;
  int64_t grain = 32768;  // elements per chunk (the FUSION_JIT_CPU_GRAIN option)
  // The stream a kernel on (device, index) is launched on: torch's current stream (a CUstream for CUDA).
  std::function<void*(Device device, int index)> stream;
};

// One target's compiled source: a shared object, a CUBIN or PTX. Shared by the plans built from the same
// source, immutable once made.
class Artifact {
 public:
  virtual ~Artifact() = default;
  // Milliseconds its compiler took; 0 when it came from a cache.
  virtual double compile_ms() const = 0;
  // False when kernel `name` is known to be missing (a damaged or foreign object that loaded): its group
  // then runs through ATen. A target that learns this only when loading says true.
  virtual bool has_kernel(const std::string& name) const = 0;
  // The compiler's figures for kernel `name` (registers, spills, shared memory, ...), in a fixed order;
  // empty when the compiler reports none.
  virtual std::vector<std::pair<std::string, int64_t>> kernel_report(const std::string& name) const { return {}; }
  // The binary as tools write it out, and its file name ("plan.cubin"); an empty name when there is none
  // to write.
  virtual std::string image_file_name() const { return ""; }
  virtual const std::string& image() const {
    static const std::string none;
    return none;
  }
};

// An artifact's kernels loaded for one device (a loaded library's functions, a module in the device's
// context), ready to launch.
class LoadedKernels {
 public:
  virtual ~LoadedKernels() = default;
  // Launches the i-th of the kernels Target::load was given, over `buffers` (the spec's, in order).
  virtual void launch(size_t i, void* const* buffers, const LaunchContext& ctx) const = 0;
};

// Note [Packaged binaries]
// A package (torch/package.h) carries each target's source compiled once per variant, most specific first:
// for the host, "native" (-march=native, the machine it was built on) and portable -march levels such as
// "x86-64-v2"; `requires` says what the loading machine must be or have (for "native", the builder's CPU
// model and feature flags, as the kernel cache keys them; for a level, that level). The loader takes the
// first variant this machine can run and loads it with no compiler and no cache. For CUDA, a CUBIN per
// architecture ("sm_90", "sm_80": each runs on its major version's GPUs from its minor on), newest first,
// then PTX ("compute_90") for GPUs newer than all of them; `requires` names the NVRTC that made it (PTX needs
// a driver at least as new).
struct PackagedImage {
  std::string variant;
  std::string requires;
  std::string bytes;
};

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
  // The prelude function family that computes gelu node `n` (erf form) for a result of dtype `out`: on
  // the CPU it depends on the input's layout (EagerCpuMath).
  virtual std::string gelu_fn(const Node& n, DType out) const = 0;
  // Whether pow with a literal exponent of 0.5 or -0.5 becomes sqrt / rsqrt for a result of dtype `out`.
  virtual bool pow_uses_sqrt(DType out) const = 0;
  // Which formula this device's eager uses for inference batch_norm node `n` (Note [batch_norm's
  // formulas], lowering.cpp): they differ by rounding, by cancellation and by where NaN comes out.
  virtual BatchNormForm batch_norm_form(const Node& n) const = 0;
  // How a floating sum accumulating in `acc` (float32 or float64) adds up; `non_negative`: its terms
  // cannot be negative (they cannot cancel).
  virtual AccKind float_sum(DType acc, bool non_negative) const = 0;
  // Whether a reduction kernel may keep one more element value `v` between passes (instead of computing
  // it again), `kept` values being kept already; `budget` is the target's own account (bytes of scratch
  // left, starting at kScratchStart).
  static constexpr int64_t kScratchStart = 256 * 1024;
  virtual bool may_keep_between_passes(const KernelSpec& k, const KeptValue& v, size_t kept, int64_t* budget) const = 0;
  // What the policy depends on besides the library's own code (eager's math on this machine), for the plan
  // cache's key; "" when nothing.
  virtual std::string policy_key() const { return ""; }

  // ---- Cost ----
  // The machine the fuser's cost model plans for: device `index` of this target.
  virtual DeviceDescription machine(int index) const = 0;

  // ---- Printing ----
  // The kernels of one plan as one source for this target's compiler. With `size_args`, a target that
  // can prints sizes and strides as kernel arguments and records their values in each kernel's `args`
  // (Note [Sizes as kernel arguments], kernel_spec.h); else it prints literals and leaves `args` empty.
  virtual std::string print_source(std::vector<KernelSpec>& kernels, bool size_args) const = 0;

  // ---- Compiling ----
  // Whether device `index` can be asked for its architecture (a driver is there); `why` receives the
  // reason when not. Plan cache keys of a device that cannot be asked hold no architecture.
  virtual bool device_present(std::string* why = nullptr) const = 0;
  // The architecture to compile for device `index` ("sm_90"; "" for a target with one, as the host).
  // Throws fusion_jit::Error when the device cannot be asked.
  virtual std::string device_arch(int index) const = 0;
  // Checks an architecture given by the user; throws fusion_jit::Error naming the valid ones.
  virtual void check_arch(const std::string& arch) const = 0;
  // Compiles `source` for `arch` (or finds it in the caches). Throws fusion_jit::Error with the compiler's
  // log when that fails, and when FUSION_JIT_ASSERT_NO_COMPILE is set and a compile would be needed.
  virtual std::shared_ptr<const Artifact> compile(const std::string& source, const std::string& arch) const = 0;
  // Whether compile(source, arch) would find it in the caches rather than run the compiler.
  virtual bool compiled(const std::string& source, const std::string& arch) const { return false; }

  // ---- Launching ----
  // Loads `kernels` (specs whose code `artifact` holds) for device `index`; what it returns keeps the
  // artifact alive. Throws fusion_jit::Error naming the kernel or the device when that fails.
  virtual std::unique_ptr<LoadedKernels> load(const std::shared_ptr<const Artifact>& artifact, const std::vector<const KernelSpec*>& kernels,
                                              int index) const = 0;
  // One line (no newline) on how kernel `k` runs, for explain: its schedule and, given its artifact, its
  // compiler's report; "" when there is nothing beyond the fusion plan's own line.
  virtual std::string explain_kernel(const KernelSpec& k, const Artifact* artifact, const std::string& arch) const = 0;

  // ---- Ahead-of-time packages (Note [Packaged binaries], torch/package.h) ----
  // The variants a package carries by default ("native", "x86-64-v2" for the host); empty: the target
  // cannot be packaged.
  virtual std::vector<std::string> default_package_variants() const { return {}; }
  // `source` compiled as each of `variants`, in the order given (the loader takes the first this machine
  // can run). Throws fusion_jit::Error naming a variant the target does not know, or the compiler's log.
  virtual std::vector<PackagedImage> package_images(const std::string& source, const std::vector<std::string>& variants) const;
  // Why this machine cannot run `image`, or "" when it can.
  virtual std::string cannot_load(const PackagedImage& image) const;
  // `image` as an Artifact, with no compiler and no cache; throws fusion_jit::Error when it cannot be loaded.
  virtual std::shared_ptr<const Artifact> load_image(const PackagedImage& image) const;
};

}  // namespace fusion_jit
