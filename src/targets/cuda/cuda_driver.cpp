#include "targets/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "support/error.h"
#include "support/log.h"
#include "targets/cuda/cuda_schedule.h"

namespace fusion_jit {
namespace {

// The few Driver API types and constants used, as cuda.h (CUDA 13.0) defines them.
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kCudaVersion = 12000;  // the ABI version of the entry points asked for

// What launches need of a device, found once: its primary context (retained for the process) and SM count.
struct DeviceState {
  CUcontext ctx = nullptr;
  int sm_count = 1;
};

struct Driver {
  void* handle = nullptr;
  std::string error;
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DriverGetVersion)(int*) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t) = nullptr;  // optional
  std::mutex mu;
  std::map<int, DeviceState> states;  // by device (device_state)
  std::map<int, CudaDeviceInfo> infos;
};

Driver& driver() {
  static Driver* d = [] {
    auto* d = new Driver();
    d->handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->handle) {
      d->error = fmt::format("no CUDA driver found (libcuda.so.1: {})", dlerror());
      return d;
    }
    using GetProc2 = CUresult (*)(const char*, void**, int, uint64_t, int*);
    using GetProc1 = CUresult (*)(const char*, void**, int, uint64_t);
    auto gp2 = reinterpret_cast<GetProc2>(dlsym(d->handle, "cuGetProcAddress_v2"));
    auto gp1 = reinterpret_cast<GetProc1>(dlsym(d->handle, "cuGetProcAddress"));
    if (!gp2 && !gp1) {
      d->error = "no CUDA driver found (libcuda.so.1 has no cuGetProcAddress: the driver predates CUDA 11.3)";
      return d;
    }
    auto sym = [&](auto& fn, const char* name) {
      void* p = nullptr;
      int status = 0;
      CUresult r = gp2 ? gp2(name, &p, kCudaVersion, 0, &status) : gp1(name, &p, kCudaVersion, 0);
      if (r != 0 || !p) {
        if (d->error.empty()) d->error = fmt::format("no CUDA driver found (libcuda.so.1 has no {}, error {})", name, r);
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    sym(d->Init, "cuInit");
    sym(d->DriverGetVersion, "cuDriverGetVersion");
    sym(d->DeviceGetCount, "cuDeviceGetCount");
    sym(d->DeviceGet, "cuDeviceGet");
    sym(d->DeviceGetAttribute, "cuDeviceGetAttribute");
    sym(d->DeviceGetName, "cuDeviceGetName");
    sym(d->DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(d->CtxSetCurrent, "cuCtxSetCurrent");
    sym(d->ModuleLoadData, "cuModuleLoadData");
    sym(d->ModuleUnload, "cuModuleUnload");
    sym(d->ModuleGetFunction, "cuModuleGetFunction");
    sym(d->LaunchKernel, "cuLaunchKernel");
    sym(d->GetErrorString, "cuGetErrorString");
    if (!d->error.empty()) return d;
    sym(d->OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    d->error.clear();  // without it, launches assume a full wave of blocks (cuda_grid_blocks)
    CUresult r = d->Init(0);
    if (r != 0) {
      const char* msg = nullptr;
      d->GetErrorString(r, &msg);
      d->error = fmt::format("no CUDA device usable: cuInit failed: {}", msg ? msg : "unknown error");
    }
    return d;
  }();
  return *d;
}

Driver& checked() {
  Driver& d = driver();
  FJ_CHECK(d.error.empty(), "{}", d.error);
  return d;
}

void check(Driver& d, CUresult r, const std::string& what) {
  if (r == 0) return;
  const char* msg = nullptr;
  d.GetErrorString(r, &msg);
  FJ_CHECK(false, "CUDA driver: {} failed: {} (error {})", what, msg ? msg : "unknown error", r);
}

const DeviceState& device_state(Driver& d, int device) {
  std::lock_guard<std::mutex> g(d.mu);
  auto it = d.states.find(device);
  if (it != d.states.end()) return it->second;
  CUdevice dev = 0;
  DeviceState st;
  check(d, d.DeviceGet(&dev, device), fmt::format("cuDeviceGet({})", device));
  check(d, d.DevicePrimaryCtxRetain(&st.ctx, dev), fmt::format("retaining the primary context of cuda:{}", device));
  check(d, d.DeviceGetAttribute(&st.sm_count, kAttrMultiprocessorCount, dev), "cuDeviceGetAttribute");
  return d.states.emplace(device, st).first->second;
}

// Makes the device's primary context current on this thread.
const DeviceState& make_current(Driver& d, int device) {
  const DeviceState& st = device_state(d, device);
  check(d, d.CtxSetCurrent(st.ctx), "cuCtxSetCurrent");
  return st;
}

}  // namespace

bool cuda_driver_available(std::string* why) {
  Driver& d = driver();
  if (why) *why = d.error;
  return d.error.empty();
}

int cuda_driver_version() {
  Driver& d = checked();
  int v = 0;
  check(d, d.DriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

CudaDeviceInfo cuda_device_info(int device) {
  Driver& d = checked();
  std::lock_guard<std::mutex> g(d.mu);
  auto it = d.infos.find(device);
  if (it != d.infos.end()) return it->second;
  int count = 0;
  check(d, d.DeviceGetCount(&count), "cuDeviceGetCount");
  FJ_CHECK(device >= 0 && device < count, "cuda:{}: no such device ({} CUDA devices)", device, count);
  CUdevice dev = 0;
  check(d, d.DeviceGet(&dev, device), fmt::format("cuDeviceGet({})", device));
  CudaDeviceInfo info;
  char name[256] = {0};
  check(d, d.DeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
  info.name = name;
  check(d, d.DeviceGetAttribute(&info.major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
  check(d, d.DeviceGetAttribute(&info.minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
  check(d, d.DeviceGetAttribute(&info.sm_count, kAttrMultiprocessorCount, dev), "cuDeviceGetAttribute");
  d.infos[device] = info;
  return info;
}

CudaModule::CudaModule(const CudaBinary& binary, int device) : device_(device) {
  Driver& d = checked();
  make_current(d, device);
  CUmodule m = nullptr;
  check(d, d.ModuleLoadData(&m, binary.image.c_str()),
        fmt::format("loading the {} kernels {} on cuda:{}", binary.arch, binary.key.substr(0, 16), device));
  module_ = m;
}

CudaModule::~CudaModule() {
  Driver& d = driver();
  if (module_ && d.error.empty()) d.ModuleUnload(static_cast<CUmodule>(module_));
}

void* CudaModule::function(const std::string& name) const {
  Driver& d = checked();
  CUfunction f = nullptr;
  check(d, d.ModuleGetFunction(&f, static_cast<CUmodule>(module_), name.c_str()), "cuModuleGetFunction(" + name + ")");
  return f;
}

int CudaModule::resident_blocks(void* function) const {
  Driver& d = checked();
  int blocks = 0;
  if (!d.OccupancyMaxActiveBlocksPerMultiprocessor ||
      d.OccupancyMaxActiveBlocksPerMultiprocessor(&blocks, static_cast<CUfunction>(function), kCudaBlockSize, 0) != 0)
    return 0;
  return std::max(blocks, 0);
}

void cuda_launch(void* function, int device, int64_t work_items, void** args, CudaStream stream, int blocks_per_sm) {
  if (work_items <= 0) return;
  Driver& d = checked();
  const DeviceState& st = make_current(d, device);
  const int64_t blocks = cuda_grid_blocks(work_items, st.sm_count, blocks_per_sm);
  check(d,
        d.LaunchKernel(static_cast<CUfunction>(function), static_cast<unsigned>(blocks), 1, 1, kCudaBlockSize, 1, 1,
                       0, static_cast<CUstream>(stream), args, nullptr),
        "cuLaunchKernel");
}

}  // namespace fusion_jit
