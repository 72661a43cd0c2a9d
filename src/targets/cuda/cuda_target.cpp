// The CUDA target: CUDA C++ for NVRTC (cuda_printer.cpp and the cuda_prelude*.inc files) with the schedule
// of cuda_schedule.h, compiled by NVRTC (nvrtc.h) to a CUBIN or PTX, loaded and launched through the
// CUDA Driver API (cuda_driver.h) on the stream the caller gives.
#include <fmt/format.h>

#include <regex>

#include "codegen/kernel_spec.h"
#include "codegen/target.h"
#include "support/error.h"
#include "support/hash.h"
#include "targets/cuda/cuda_driver.h"
#include "targets/cuda/cuda_printer.h"
#include "targets/cuda/nvrtc.h"

namespace fusion_jit {
namespace {

class CudaArtifact final : public Artifact {
 public:
  explicit CudaArtifact(std::shared_ptr<const CudaBinary> binary) : binary_(std::move(binary)) {}
  double compile_ms() const override { return binary_->compile_ms; }
  // A module's functions are known only once it is loaded.
  bool has_kernel(const std::string&) const override { return true; }
  std::vector<std::pair<std::string, int64_t>> kernel_report(const std::string& name) const override {
    const CudaKernelInfo* info = binary_->kernel(name);
    if (!info) return {};
    return {{"registers", info->registers},       {"shared_bytes", info->shared_bytes},
            {"stack_bytes", info->stack_bytes},   {"spill_stores", info->spill_stores},
            {"spill_loads", info->spill_loads}};
  }
  std::string image_file_name() const override { return binary_->is_ptx ? "plan.ptx" : "plan.cubin"; }
  const std::string& image() const override { return binary_->image; }
  const CudaBinary& binary() const { return *binary_; }

 private:
  std::shared_ptr<const CudaBinary> binary_;
};

class CudaKernels final : public LoadedKernels {
 public:
  CudaKernels(const CudaBinary& binary, const std::vector<const KernelSpec*>& kernels, int device)
      : module_(binary, device), device_(device) {
    for (const KernelSpec* k : kernels) {
      void* f = module_.function(k->name);
      kernels_.push_back({f, module_.resident_blocks(f), cuda_work_items(*k), k->buffers.size(), k->args});
    }
  }
  void launch(size_t i, void* const* buffers, const LaunchContext& ctx) const override {
    const Kernel& k = kernels_[i];
    // cuLaunchKernel takes the address of each argument: of each buffer pointer, then of the sizes
    // (Note [CUDA size arguments]: one fj_sizes<N> parameter, whose bytes are the N values of `sizes`).
    std::vector<void*> args(k.buffers + (k.sizes.empty() ? 0 : 1));
    for (size_t j = 0; j < k.buffers; ++j) args[j] = const_cast<void**>(&buffers[j]);
    if (!k.sizes.empty()) args[k.buffers] = const_cast<int64_t*>(k.sizes.data());
    cuda_launch(k.function, device_, k.work_items, args.data(), ctx.stream(Device::kCUDA, device_), k.blocks_per_sm);
  }

 private:
  struct Kernel {
    void* function;
    int blocks_per_sm;   // Note [One wave of blocks]
    int64_t work_items;  // threads with work (cuda_work_items), for this plan's sizes
    size_t buffers;
    std::vector<int64_t> sizes;  // the kernel's size arguments (KernelSpec::args)
  };
  CudaModule module_;
  int device_;
  std::vector<Kernel> kernels_;
};

class CudaTarget final : public Target {
 public:
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::kCUDA; }
  // Every promoting argument is rounded (the CPU's exceptions were not checked against CUDA's kernels).
  bool rounds_argument(const OpInfo&, size_t, const Value*, const Value*, bool promoting) const override {
    return promoting;
  }
  std::string math_fn(const std::string& fn, DType) const override { return fn; }
  std::string gelu_fn(const Node&, DType) const override { return "gelu"; }
  bool pow_uses_sqrt(DType) const override { return true; }
  // Eager's CUDA batch_norm normalizes in float for every layout (Normalization.cuh,
  // batch_norm_elementwise); its contiguous kernel multiplies by w before invstd (rounding only).
  BatchNormForm batch_norm_form(const Node&) const override { return BatchNormForm::kNormalize; }
  AccKind float_sum(DType, bool) const override { return AccKind::kKahanSum; }
  // In registers: only rows a thread holds whole, two values at most; a cheap value where it reads two
  // element buffers or more (Note [Values kept in registers between passes], cuda_printer.cpp).
  bool may_keep_between_passes(const KernelSpec& k, const KeptValue& v, size_t kept, int64_t*) const override {
    return cuda_row_in_registers(k) && kept < 2 && (v.expensive || v.element_loads >= 2);
  }

  // The SM count is not asked of the device: plans stay the same on every GPU of the class.
  DeviceDescription machine(int) const override { return cuda_gpu_description(); }

  std::string print_source(std::vector<KernelSpec>& kernels, bool size_args) const override {
    return print_cuda_source(kernels, size_args);
  }

  bool device_present(std::string* why) const override { return cuda_driver_available(why); }
  std::string device_arch(int index) const override {
    const CudaDeviceInfo info = cuda_device_info(index);
    return cuda_arch_for(info.major, info.minor);
  }
  void check_arch(const std::string& arch) const override { check_cuda_arch(arch); }
  std::shared_ptr<const Artifact> compile(const std::string& source, const std::string& arch) const override {
    return std::make_shared<CudaArtifact>(compile_cuda_source(source, arch));
  }
  bool compiled(const std::string& source, const std::string& arch) const override {
    return cuda_source_compiled(source, arch);
  }

  // Note [Packaged binaries]: a CUBIN per architecture, newest first, then PTX for the newest, which the
  // driver compiles for GPUs newer than every CUBIN. Packaged plans run on cuda:0.
  std::vector<std::string> default_package_variants() const override { return {"sm_90", "sm_80", "compute_90"}; }
  std::vector<PackagedImage> package_images(const std::string& source, const std::vector<std::string>& variants) const override {
    std::vector<PackagedImage> out;
    const std::string nvrtc = fmt::format("NVRTC {}", nvrtc_version());
    for (const std::string& v : variants) {
      check_cuda_arch(v);
      out.push_back(PackagedImage{v, fmt::format("{} ({})", v, nvrtc), compile_cuda_source(source, v)->image});
    }
    return out;
  }
  std::string cannot_load(const PackagedImage& image) const override {
    std::string why;
    if (!cuda_driver_available(&why)) return why;
    try {
      const CudaDeviceInfo gpu = cuda_device_info(0);
      std::smatch m;
      static const std::regex re("NVRTC ([0-9]+)");
      const int built_by = std::regex_search(image.requires, m, re) ? std::stoi(m[1].str()) : 0;
      return cuda_binary_cannot_run(image.variant, built_by, gpu.major, gpu.minor, cuda_driver_version());
    } catch (const Error& e) {
      return e.what();
    }
  }
  std::shared_ptr<const Artifact> load_image(const PackagedImage& image) const override {
    const std::string why = cannot_load(image);
    FJ_CHECK(why.empty(), "cannot load packaged CUDA kernels ({}): {}", image.variant, why);
    auto b = std::make_shared<CudaBinary>();
    b->arch = image.variant;
    b->is_ptx = image.variant.rfind("compute_", 0) == 0;
    b->image = image.bytes;
    b->key = sha256_hex(image.bytes);
    return std::make_shared<CudaArtifact>(std::move(b));
  }

  std::unique_ptr<LoadedKernels> load(const std::shared_ptr<const Artifact>& artifact, const std::vector<const KernelSpec*>& kernels,
                                      int index) const override {
    return std::make_unique<CudaKernels>(static_cast<const CudaArtifact&>(*artifact).binary(), kernels, index);
  }

  std::string explain_kernel(const KernelSpec& ks, const Artifact* artifact, const std::string& arch) const override {
    std::string s;
    if (ks.is_reduction())
      s = fmt::format("cuda {} ({}): {} rows of {}, {} threads per row{}, {}, {} offsets", ks.name, arch, ks.rows.str(),
                      ks.row_len.str(), cuda_threads_per_row(ks), reduction_is_column(ks) ? " (column tile)" : "",
                      cuda_row_in_registers(ks) ? fmt::format("{} elements per thread in registers", cuda_elements_per_thread(ks))
                                                : std::string("rows read once per pass"),
                      ks.index32 ? "int32" : "int64");
    else
      s = fmt::format("cuda {} ({}): {} elements, vector width {}, {} offsets", ks.name, arch, ks.numel.str(),
                      cuda_vector_width(ks), ks.index32 ? "int32" : "int64");
    const CudaKernelInfo* info =
        artifact ? static_cast<const CudaArtifact*>(artifact)->binary().kernel(ks.name) : nullptr;
    if (info)
      s += fmt::format(", {} registers, {} B shared, {} B stack, spills {} B stored / {} B loaded", info->registers,
                       info->shared_bytes, info->stack_bytes, info->spill_stores, info->spill_loads);
    return s;
  }
};

}  // namespace

const Target& cuda_target() {
  static const CudaTarget t;
  return t;
}

}  // namespace fusion_jit
