// The CUDA Driver API, opened with dlopen at first use: libcuda.so.1, its entry points through
// cuGetProcAddress. Nothing here links a CUDA library, so the same build runs on machines without a GPU
// or a driver; asking for CUDA there throws fusion_jit::Error starting with "no CUDA driver found".
//
// Kernels run in the primary context of their device (the context torch's runtime uses), on the stream
// the caller passes (torch's current stream, from the adapter).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "targets/cuda/nvrtc.h"

namespace fusion_jit {

using CudaStream = void*;  // a CUstream

// True when libcuda.so.1 loads and cuInit succeeds; `why` receives the reason when not.
bool cuda_driver_available(std::string* why = nullptr);

// The CUDA version the driver supports, as major * 1000 + minor * 10 (13.0: 13000).
int cuda_driver_version();

struct CudaDeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
};
CudaDeviceInfo cuda_device_info(int device);

// A compiled binary loaded into one device's primary context; unloaded on destruction.
class CudaModule {
 public:
  CudaModule(const CudaBinary& binary, int device);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;
  // The kernel's handle (a CUfunction); throws naming it when the module has none.
  void* function(const std::string& name) const;
  // How many blocks of kCudaBlockSize threads of `function` an SM holds at once (the driver's occupancy
  // query: its registers and shared memory decide); 0 where the driver cannot say (Note [One wave of blocks]).
  int resident_blocks(void* function) const;
  int device() const { return device_; }

 private:
  void* module_ = nullptr;
  int device_ = 0;
};

// Launches `function` with `work_items` threads' worth of work (blocks of kCudaBlockSize, the grid capped
// at one wave of `blocks_per_sm` blocks on each of the device's SMs, 0 for a full SM's 2048 threads; the
// kernels loop over the rest) on `stream`. `args` points to each kernel argument, as cuLaunchKernel takes them.
void cuda_launch(void* function, int device, int64_t work_items, void** args, CudaStream stream,
                 int blocks_per_sm = 0);

}  // namespace fusion_jit
