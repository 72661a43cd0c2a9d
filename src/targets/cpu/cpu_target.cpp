// The CPU target: C++ for the host compiler (cpu_printer.cpp, cpu_prelude.inc), lowered to follow eager's
// CPU kernels (ATen's vectorized float math, its scalar handling of float16/bfloat16), compiled into a
// shared object by the host compiler (host_compiler.h) and run over index ranges split across torch's
// threads (cpu_launch.h).
#include <fmt/format.h>

#include <algorithm>

#include "codegen/kernel_spec.h"
#include "codegen/target.h"
#include "support/error.h"
#include "targets/cpu/cpu_launch.h"
#include "targets/cpu/cpu_printer.h"
#include "targets/cpu/host_compiler.h"

namespace fusion_jit {
namespace {

// ATen's TensorIterator::is_scalar(arg): the operand's stride is 0 in every dim of the op's shape that
// is not 1 (a wrapped number, a 0-dim or one-element tensor, or one expanded in every dim).
bool eager_is_scalar(const Value* v, const Value* out) {
  const TensorType& t = v->tensor_type();
  const TensorType& o = out->tensor_type();
  int64_t off = o.dim() - t.dim();
  for (int64_t d = 0; d < o.dim(); ++d) {
    int64_t k = d - off;
    if (o.sizes[d] != 1 && k >= 0 && t.sizes[k] != 1 && t.strides[k] != 0) return false;
  }
  return true;
}

class CpuArtifact final : public Artifact {
 public:
  explicit CpuArtifact(std::shared_ptr<CompiledLibrary> library) : library_(std::move(library)) {}
  double compile_ms() const override { return library_->compile_ms(); }
  bool has_kernel(const std::string& name) const override { return library_->find_symbol(name) != nullptr; }
  const CompiledLibrary& library() const { return *library_; }

 private:
  std::shared_ptr<CompiledLibrary> library_;
};

class CpuKernels final : public LoadedKernels {
 public:
  CpuKernels(std::shared_ptr<const Artifact> keep, const std::vector<const KernelSpec*>& kernels) {
    const CompiledLibrary& lib = static_cast<const CpuArtifact&>(*keep).library();
    for (const KernelSpec* k : kernels) {
      Kernel e;
      e.fn = reinterpret_cast<CpuKernelFn>(lib.symbol(k->name));
      // Elementwise kernels take element ranges; reductions take row ranges, about `grain` elements each.
      e.range = k->is_reduction() ? k->rows : k->numel;
      e.row_len = k->is_reduction() ? std::max<int64_t>(k->row_len, 1) : 1;
      e.args = k->args;
      kernels_.push_back(std::move(e));
    }
    keep_ = std::move(keep);
  }
  void launch(size_t i, void* const* buffers, const LaunchContext& ctx) const override {
    const Kernel& k = kernels_[i];
    launch_cpu_kernel(k.fn, buffers, k.args.data(), k.range, std::max<int64_t>(1, ctx.grain / k.row_len),
                      ctx.parallel_for);
  }

 private:
  struct Kernel {
    CpuKernelFn fn = nullptr;
    int64_t range = 0, row_len = 1;
    std::vector<int64_t> args;  // Note [Sizes as kernel arguments]
  };
  std::shared_ptr<const Artifact> keep_;  // the library stays loaded while its functions may run
  std::vector<Kernel> kernels_;
};

class CpuTarget final : public Target {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::kCPU; }

  // Eager's CPU kernel for a float16/bfloat16 result rounds operands and the Scalars that take part in
  // promotion (ATen wraps them in tensors and TensorIterator casts those), masked_fill's value, and
  // add/sub/rsub's alpha (the ufunc kernel takes alpha.to<scalar_t>()). It does not round the scalar
  // second operand of mul and div (every rounding mode): BinaryOpsKernel.cpp takes `iter.is_scalar(2) &&
  // isReducedFloatingType(dtype)` -> `iter.original_scalar_value<opmath_t>(2)`, the value before the cast
  // (a double 0.001 becomes (float)0.001, not float16's 0.0010004); nor lerp's Scalar weight
  // (weight.to<opmath_t>()); nor the other non-promoting Scalars (addcmul's value, leaky_relu's slope).
  bool rounds_argument(const OpInfo& op, size_t i, const Value* v, const Value* out, bool promoting) const override {
    const std::string& fn = op.kernel_fn;
    if ((fn == "mul" || fn == "div") && i == 1 && (!v || eager_is_scalar(v, out))) return false;
    if (fn == "lerp" && i == 2 && !v) return false;
    if ((fn == "add" || fn == "sub" || fn == "rsub") && i == 2 && !v) return true;  // alpha
    return promoting;
  }

  std::string math_fn(const std::string& fn, DType out) const override {
    // Eager's CPU erf of float16/bfloat16 computes in float through Vectorized<float>::erf, an
    // Abramowitz-Stegun polynomial (1.5e-7 absolute error; tiny inputs give 0), not libm's erff.
    if (fn == "erf" && is_reduced_float(out)) return "erf_as";
    return fn;
  }

  // float32, float16 and bfloat16 gelu: eager's oneDNN call for a contiguous input of more than one
  // element where it takes the dtype (NaN at +-inf), its own loop otherwise (+inf at +inf), EagerCpuMath.
  // Both through the polynomial erf of ATen's vectorized loop, which libmvec's erff would make three
  // times slower here. float64: the plain formula. A channels-last input counts as contiguous: in a
  // channels-last plan (Note [Channels-last plans]) it is NCHW in the model eager runs. (A model given
  // channels-last inputs by its caller therefore gets NaN at +inf where eager gives +inf.)
  std::string gelu_fn(const Node& n, DType out) const override {
    if (compute_dtype(out) != DType::kFloat32) return "gelu";
    const TensorType& in = n.args().at(0).value->tensor_type();
    const bool onednn = eager_cpu_math().gelu_onednn(in.dtype) && contiguous_in_some_format(in) && in.sym_numel() > 1;
    return onednn ? "gelu_as" : "gelu_poly";
  }

  // ATen's CPU kernel skips the sqrt/rsqrt special cases for float16 (pow(-inf, 0.5) is +inf there,
  // sqrt(-inf) NaN in float32 and bfloat16).
  bool pow_uses_sqrt(DType out) const override { return out != DType::kFloat16; }

  // Eager's CPU batch_norm (Normalization.cpp) takes its scale-and-shift kernel when the input is
  // contiguous in some memory format and weight, bias and statistics are contiguous; otherwise its
  // TensorIterator loop. (That loop computes in the statistics' dtype: float16/bfloat16 statistics round
  // every step, where the kernel computes in float, as accurate or more: the tolerance rule's float64
  // reference judges the difference.)
  BatchNormForm batch_norm_form(const Node& n) const override {
    bool contiguous = contiguous_in_some_format(n.args().at(0).value->tensor_type());
    for (size_t i = 1; i < 5 && i < n.args().size(); ++i)
      if (n.args()[i].is_value()) contiguous = contiguous && n.args()[i].value->tensor_type().is_contiguous();
    return contiguous ? BatchNormForm::kScaleShift : BatchNormForm::kNormalize;
  }

  // float32 sums add up in double, as exact as eager's cascade sum or more, except sums of terms that
  // cannot cancel (softmax's exps, rms_norm's squares): float lanes keep those accurate and cost less.
  AccKind float_sum(DType acc, bool non_negative) const override {
    if (acc == DType::kFloat32) return non_negative ? AccKind::kSum : AccKind::kDoubleSum;
    return AccKind::kKahanSum;
  }

  // Expensive values, in a scratch row per thread, within about a core's L2 share (a cheap value is
  // computed again from the cache's lines sooner than it is stored and read back).
  bool may_keep_between_passes(const KernelSpec& k, const KeptValue& v, size_t, int64_t* budget) const override {
    if (!v.expensive) return false;
    // At the row length's hint, with no guard: the scratch row is allocated per call from the row length
    // the kernel reads, so the source computes the same values at any length; the budget only prices it.
    const int64_t bytes = k.row_len.hint() * static_cast<int64_t>(dtype_size(compute_dtype(v.dtype)));
    if (bytes > *budget) return false;
    *budget -= bytes;
    return true;
  }

  std::string policy_key() const override { return "eager cpu math " + eager_cpu_math().key(); }

  DeviceDescription machine(int) const override { return host_cpu_description(); }

  std::string print_source(std::vector<KernelSpec>& kernels, bool size_args) const override {
    return print_cpu_source(kernels, size_args);
  }

  // The host is always there, and it is its own architecture (the cache keys of compiled objects name
  // its ISA).
  bool device_present(std::string*) const override { return true; }
  std::string device_arch(int) const override { return ""; }
  void check_arch(const std::string& arch) const override {
    FJ_CHECK(arch.empty(), "the cpu target compiles for this host only, not for '{}'", arch);
  }
  std::shared_ptr<const Artifact> compile(const std::string& source, const std::string& arch) const override {
    check_arch(arch);
    return std::make_shared<CpuArtifact>(compile_cpu_source(source));
  }

  bool compiled(const std::string& source, const std::string& arch) const override {
    return arch.empty() && cpu_source_compiled(source);
  }

  // Note [Packaged binaries]: "native" needs the builder's CPU (model and feature flags, as the kernel
  // cache's key of native code); an x86-64 level runs on any CPU that has it.
  std::vector<std::string> default_package_variants() const override { return {"native", "x86-64-v2"}; }
  std::vector<PackagedImage> package_images(const std::string& source, const std::vector<std::string>& variants) const override {
    std::vector<PackagedImage> out;
    for (const std::string& v : variants)
      out.push_back(PackagedImage{v, v == "native" ? host_isa() : v, cpu_library_image(source, v)});
    return out;
  }
  std::string cannot_load(const PackagedImage& image) const override {
    if (image.variant != "native") return cpu_cannot_run(image.requires);
    if (image.requires == host_isa()) return "";
    return fmt::format("native code for another CPU ({}; this one is {})", image.requires, host_isa());
  }
  std::shared_ptr<const Artifact> load_image(const PackagedImage& image) const override {
    std::string why = cannot_load(image);
    FJ_CHECK(why.empty(), "cannot load packaged CPU kernels ({}): {}", image.variant, why);
    return std::make_shared<CpuArtifact>(load_cpu_library_image(image.bytes, "a package's " + image.variant + " code"));
  }

  std::unique_ptr<LoadedKernels> load(const std::shared_ptr<const Artifact>& artifact, const std::vector<const KernelSpec*>& kernels,
                                      int) const override {
    return std::make_unique<CpuKernels>(artifact, kernels);
  }

  std::string explain_kernel(const KernelSpec& ks, const Artifact*, const std::string&) const override {
    if (!ks.is_reduction()) return "";
    return fmt::format("cpu {}: {} rows of {}, {} pass{}, {}{}", ks.name, ks.rows.str(), ks.row_len.str(), ks.passes.size(),
                       ks.passes.size() == 1 ? "" : "es",
                       reduction_is_column(ks) ? "column tiles of up to 32 rows vectorized across rows"
                                               : "rows over threads, 16 lanes per row",
                       ks.scratch.empty() ? "" : fmt::format(", {} value(s) kept in a scratch row", ks.scratch.size()));
  }
};

}  // namespace

const Target& cpu_target() {
  static const CpuTarget t;
  return t;
}

}  // namespace fusion_jit
