// NVRTC: a CUDA plan's source to a CUBIN (or PTX) for one GPU architecture, with no GPU needed.
//
// libnvrtc.so.13 is opened with dlopen at first use, from FUSION_JIT_CUDA_HOME/lib64 if set, else from
// the loader's path, torch's nvidia packages or /usr/local/cuda; the directory whose include/ holds
// cuda_fp16.h is passed to NVRTC for kernels that use float16 or bfloat16. Each compile asks ptxas for
// its per-kernel report (registers, stack, spills, shared memory), parsed into CudaKernelInfo.
// Binaries are kept in memory and in the on-disk kernel cache (kernels_cache/) by the SHA-256 of source,
// options, architecture and NVRTC version: the same source is compiled once per process, and a restarted
// process loads it from disk without NVRTC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fusion_jit {

struct CudaKernelInfo {
  std::string name;
  int registers = 0;
  int64_t shared_bytes = 0;  // static shared memory
  int64_t stack_bytes = 0;   // stack frame
  int64_t spill_stores = 0;  // bytes
  int64_t spill_loads = 0;   // bytes
};

struct CudaBinary {
  std::string arch;   // "sm_90" (CUBIN) or "compute_90" (PTX, JIT-compiled by the driver)
  bool is_ptx = false;
  std::string image;  // the CUBIN or the PTX text
  std::string log;    // NVRTC's program log (ptxas's report included)
  std::vector<CudaKernelInfo> kernels;
  std::string key;    // SHA-256 of what determined it
  double compile_ms = 0;  // 0 when it came from a cache

  const CudaKernelInfo* kernel(const std::string& name) const;
};

struct NvrtcStats {
  int64_t compiles = 0;     // NVRTC programs compiled in this process
  int64_t memory_hits = 0;  // sources found already compiled
  int64_t disk_hits = 0;    // binaries loaded from the kernel cache
  double total_ms = 0;
};

// True when libnvrtc can be opened; `why` receives the reason when not.
bool nvrtc_available(std::string* why = nullptr);
// NVRTC's version as major * 1000 + minor * 10 (13.0: 13000). Throws when NVRTC is missing.
int nvrtc_version();
// The SM versions NVRTC can build CUBINs for, as 75, 80, ..., ascending.
std::vector<int> nvrtc_supported_archs();
// The architecture to build for a device of compute capability major.minor: "sm_XY" when NVRTC knows it,
// else PTX for the newest architecture it knows ("compute_XY"), which the driver compiles. Throws for
// devices older than any NVRTC supports.
std::string cuda_arch_for(int major, int minor);
// Checks an architecture name given by the user ("sm_90", "compute_90"); throws naming the valid ones.
void check_cuda_arch(const std::string& arch);

// Why a GPU of compute capability major.minor whose driver supports CUDA `driver_version` cannot run a
// binary built for `arch` by NVRTC `nvrtc_version` (versions as major * 1000 + minor * 10), or "". A CUBIN
// ("sm_XY") runs on the GPUs of its major version from its minor on (8.0's on 8.6 and 8.9, not on 9.0);
// PTX ("compute_XY") on every GPU from X.Y on, compiled by a driver that reads NVRTC's PTX version.
std::string cuda_binary_cannot_run(const std::string& arch, int nvrtc_version, int major, int minor,
                                   int driver_version);

// Compiles (or finds) `source` for `arch`. Throws fusion_jit::Error with NVRTC's log when it fails, and
// when FUSION_JIT_ASSERT_NO_COMPILE is set and a compile would be needed.
std::shared_ptr<const CudaBinary> compile_cuda_source(const std::string& source, const std::string& arch);
// Whether compile_cuda_source(source, arch) would find it in memory or in the kernel cache (false
// without NVRTC).
bool cuda_source_compiled(const std::string& source, const std::string& arch);
NvrtcStats nvrtc_stats();
// The options passed to NVRTC for `arch` (the include directory included), for display and cache keys.
std::vector<std::string> nvrtc_options(const std::string& arch);

// Parses ptxas's verbose report (NVRTC's program log) into one entry per kernel, in report order.
std::vector<CudaKernelInfo> parse_ptxas_report(const std::string& log);

}  // namespace fusion_jit
