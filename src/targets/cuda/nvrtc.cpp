#include "targets/cuda/nvrtc.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <regex>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

#ifndef FJ_CUDA_SEARCH_DIRS
#define FJ_CUDA_SEARCH_DIRS "/usr/local/cuda"
#endif

namespace fusion_jit {
namespace {

using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  void* handle = nullptr;
  std::string path, include_dir, error;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*GetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*GetSupportedArchs)(int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  int version = 0;
  std::vector<int> archs;
};

bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// The toolkit-like directories to look in, in order.
std::vector<std::string> search_dirs() {
  std::vector<std::string> dirs;
  if (!Options::get().cuda_home.empty()) dirs.push_back(Options::get().cuda_home);
  std::string d = FJ_CUDA_SEARCH_DIRS;
  size_t start = 0;
  while (start <= d.size()) {
    size_t end = d.find(':', start);
    if (end == std::string::npos) end = d.size();
    if (end > start) dirs.push_back(d.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

const Nvrtc& nvrtc() {
  static const Nvrtc* lib = [] {
    auto* n = new Nvrtc();
    std::vector<std::string> candidates;
    const auto dirs = search_dirs();
    if (!Options::get().cuda_home.empty()) candidates.push_back(dirs[0] + "/lib64/libnvrtc.so.13");
    candidates.push_back("libnvrtc.so.13");
    for (const auto& dir : dirs) {
      candidates.push_back(dir + "/lib/libnvrtc.so.13");
      candidates.push_back(dir + "/lib64/libnvrtc.so.13");
    }
    std::string tried;
    for (const auto& c : candidates) {
      if (c.find('/') != std::string::npos && !exists(c)) continue;
      n->handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (n->handle) {
        n->path = c;
        break;
      }
      tried += fmt::format("\n  {}: {}", c, dlerror());
    }
    for (const auto& dir : dirs)
      if (n->include_dir.empty() && exists(dir + "/include/cuda_fp16.h")) n->include_dir = dir + "/include";
    if (!n->handle) {
      n->error = "NVRTC (libnvrtc.so.13) not found; set FUSION_JIT_CUDA_HOME to a CUDA 13 toolkit" + tried;
      return n;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(n->handle, name));
      if (!fn && n->error.empty()) n->error = fmt::format("{} has no {}", n->path, name);
    };
    sym(n->Version, "nvrtcVersion");
    sym(n->GetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    sym(n->GetSupportedArchs, "nvrtcGetSupportedArchs");
    sym(n->CreateProgram, "nvrtcCreateProgram");
    sym(n->CompileProgram, "nvrtcCompileProgram");
    sym(n->GetProgramLogSize, "nvrtcGetProgramLogSize");
    sym(n->GetProgramLog, "nvrtcGetProgramLog");
    sym(n->GetCUBINSize, "nvrtcGetCUBINSize");
    sym(n->GetCUBIN, "nvrtcGetCUBIN");
    sym(n->GetPTXSize, "nvrtcGetPTXSize");
    sym(n->GetPTX, "nvrtcGetPTX");
    sym(n->DestroyProgram, "nvrtcDestroyProgram");
    sym(n->GetErrorString, "nvrtcGetErrorString");
    if (!n->error.empty()) return n;
    int major = 0, minor = 0;
    n->Version(&major, &minor);
    n->version = major * 1000 + minor * 10;
    int count = 0;
    n->GetNumSupportedArchs(&count);
    n->archs.resize(count);
    if (count > 0) n->GetSupportedArchs(n->archs.data());
    std::sort(n->archs.begin(), n->archs.end());
    log_info("NVRTC {}.{} from {}; headers from {}", major, minor, n->path,
             n->include_dir.empty() ? "(none found)" : n->include_dir);
    return n;
  }();
  return *lib;
}

const Nvrtc& checked() {
  const Nvrtc& n = nvrtc();
  FJ_CHECK(n.error.empty(), "{}", n.error);
  return n;
}

void check(const Nvrtc& n, nvrtcResult r, const char* what) {
  FJ_CHECK(r == 0, "NVRTC {} failed: {}", what, n.GetErrorString(r));
}

std::mutex g_mu;
NvrtcStats g_stats;

std::map<std::string, std::weak_ptr<const CudaBinary>>& binary_cache() {
  static auto* m = new std::map<std::string, std::weak_ptr<const CudaBinary>>();
  return *m;
}

int64_t to_int(const std::string& s) { return std::stoll(s); }

}  // namespace

const CudaKernelInfo* CudaBinary::kernel(const std::string& name) const {
  for (const auto& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

bool nvrtc_available(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (why) *why = n.error;
  return n.error.empty();
}

int nvrtc_version() { return checked().version; }

std::vector<int> nvrtc_supported_archs() { return checked().archs; }

std::string cuda_arch_for(int major, int minor) {
  const auto& archs = checked().archs;
  int sm = major * 10 + minor;
  if (std::find(archs.begin(), archs.end(), sm) != archs.end()) return fmt::format("sm_{}", sm);
  FJ_CHECK(!archs.empty() && sm > archs.front(), "a GPU of compute capability {}.{} is older than NVRTC {} supports "
           "(oldest: sm_{})", major, minor, nvrtc_version() / 1000, archs.empty() ? 0 : archs.front());
  return fmt::format("compute_{}", archs.back());
}

void check_cuda_arch(const std::string& arch) {
  const auto& archs = checked().archs;
  std::string known;
  for (int a : archs) known += (known.empty() ? "" : ", ") + fmt::format("sm_{}", a);
  std::smatch m;
  static const std::regex re("(sm|compute)_([0-9]+)");
  FJ_CHECK(std::regex_match(arch, m, re), "--arch {}: expected sm_XY or compute_XY (NVRTC knows {})", arch, known);
  int sm = std::stoi(m[2].str());
  FJ_CHECK(std::find(archs.begin(), archs.end(), sm) != archs.end(), "--arch {}: NVRTC {}.{} does not support it "
           "(it knows {})", arch, nvrtc_version() / 1000, nvrtc_version() % 1000 / 10, known);
}

std::string cuda_binary_cannot_run(const std::string& arch, int nvrtc_version, int major, int minor,
                                   int driver_version) {
  std::smatch m;
  static const std::regex re("(sm|compute)_([0-9]+)");
  if (!std::regex_match(arch, m, re)) return fmt::format("'{}' is not a CUDA architecture", arch);
  const int sm = std::stoi(m[2].str()), want_major = sm / 10, want_minor = sm % 10;
  const std::string gpu = fmt::format("this GPU is of compute capability {}.{}", major, minor);
  if (m[1].str() == "sm") {
    if (major != want_major || minor < want_minor)
      return fmt::format("a CUBIN for {} runs on GPUs of compute capability {}.{} to {}.9; {}", arch, want_major,
                         want_minor, want_major, gpu);
    return "";
  }
  if (major * 10 + minor < sm) return fmt::format("PTX for {} needs compute capability {}.{} or newer; {}", arch, want_major, want_minor, gpu);
  if (driver_version < nvrtc_version)
    return fmt::format("PTX from NVRTC {}.{} needs a driver for CUDA {}.{} or newer; this one supports CUDA {}.{}",
                       nvrtc_version / 1000, nvrtc_version % 1000 / 10, nvrtc_version / 1000, nvrtc_version % 1000 / 10,
                       driver_version / 1000, driver_version % 1000 / 10);
  return "";
}

std::vector<std::string> nvrtc_options(const std::string& arch) {
  const Nvrtc& n = checked();
  std::vector<std::string> o = {"--gpu-architecture=" + arch, "--std=c++17", "--ptxas-options=-v",
                                "--diag-suppress=177"};  // the prelude's unused functions
  if (!n.include_dir.empty()) o.push_back("--include-path=" + n.include_dir);
  return o;
}

std::vector<CudaKernelInfo> parse_ptxas_report(const std::string& log) {
  std::vector<CudaKernelInfo> out;
  static const std::regex entry("Compiling entry function '([^']+)'");
  static const std::regex frame("([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads");
  static const std::regex used("Used ([0-9]+) registers");
  static const std::regex smem("([0-9]+) bytes smem");
  size_t pos = 0;
  while (pos < log.size()) {
    size_t end = log.find('\n', pos);
    if (end == std::string::npos) end = log.size();
    std::string line = log.substr(pos, end - pos);
    pos = end + 1;
    std::smatch m;
    if (std::regex_search(line, m, entry)) {
      out.push_back(CudaKernelInfo{m[1].str()});
      continue;
    }
    if (out.empty()) continue;
    CudaKernelInfo& k = out.back();
    if (std::regex_search(line, m, frame)) {
      k.stack_bytes = to_int(m[1].str());
      k.spill_stores = to_int(m[2].str());
      k.spill_loads = to_int(m[3].str());
    }
    if (std::regex_search(line, m, used)) {
      k.registers = static_cast<int>(to_int(m[1].str()));
      if (std::regex_search(line, m, smem)) k.shared_bytes = to_int(m[1].str());
    }
  }
  return out;
}

NvrtcStats nvrtc_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_stats;
}

namespace {

// A binary as a cache payload: u8 is_ptx | u64 image length | image | log.
std::string serialize(const CudaBinary& b) {
  std::string s(1, b.is_ptx ? '\1' : '\0');
  uint64_t n = b.image.size();
  s.append(reinterpret_cast<const char*>(&n), 8);
  return s + b.image + b.log;
}

void deserialize(const std::string& s, CudaBinary* b) {
  uint64_t n = 0;
  FJ_INTERNAL_ASSERT(s.size() >= 9, "a cached CUDA binary of {} bytes", s.size());
  std::memcpy(&n, s.data() + 1, 8);
  FJ_INTERNAL_ASSERT(s.size() >= 9 + n, "a cached CUDA binary shorter than its image");
  b->is_ptx = s[0] != 0;
  b->image = s.substr(9, n);
  b->log = s.substr(9 + n);
}

// The kernel cache key of `source` compiled for `arch` by this NVRTC with our options.
std::string binary_key(const Nvrtc& n, const std::string& source, const std::string& arch,
                       const std::vector<std::string>& options) {
  std::string flags;
  for (const auto& o : options) flags += o + "\n";
  return cache_key({arch.rfind("compute_", 0) == 0 ? "ptx" : "cubin", source, fmt::format("nvrtc {}", n.version), flags, arch});
}

}  // namespace

bool cuda_source_compiled(const std::string& source, const std::string& arch) {
  if (!nvrtc_available()) return false;
  const std::string key = binary_key(checked(), source, arch, nvrtc_options(arch));
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = binary_cache().find(key);
    if (it != binary_cache().end() && !it->second.expired()) return true;
  }
  return !Options::get().is_disabled("cache") && KernelsCache::instance().contains(key);
}

std::shared_ptr<const CudaBinary> compile_cuda_source(const std::string& source, const std::string& arch) {
  const Nvrtc& n = checked();
  check_cuda_arch(arch);
  const Options& opt = Options::get();
  auto options = nvrtc_options(arch);
  const std::string key = binary_key(n, source, arch, options);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (auto b = binary_cache()[key].lock()) {
      g_stats.memory_hits++;
      return b;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto b = std::make_shared<CudaBinary>();
  b->arch = arch;
  b->key = key;
  // NVRTC compiles programs on several threads at once; the lock guards only the caches and the counters.
  auto compile = [&]() -> std::string {
    FJ_CHECK(!opt.assert_no_compile, "FUSION_JIT_ASSERT_NO_COMPILE is set, but CUDA kernels {} would be compiled",
             key.substr(0, 16));
    nvrtcProgram prog = nullptr;
    check(n, n.CreateProgram(&prog, source.c_str(), "fusion_jit_plan.cu", 0, nullptr, nullptr), "program creation");
    std::vector<const char*> argv;
    for (const auto& o : options) argv.push_back(o.c_str());
    nvrtcResult rc = n.CompileProgram(prog, static_cast<int>(argv.size()), argv.data());
    CudaBinary out;
    out.is_ptx = arch.rfind("compute_", 0) == 0;
    size_t size = 0;
    n.GetProgramLogSize(prog, &size);
    out.log.resize(size);
    if (size) n.GetProgramLog(prog, out.log.data());
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
    if (opt.dumps("log") && !out.log.empty())
      std::fprintf(stderr, "== NVRTC log (%s) ==\n%s\n", arch.c_str(), out.log.c_str());
    if (rc != 0) {
      n.DestroyProgram(&prog);
      std::string shown = out.log.size() > 8000 ? out.log.substr(0, 8000) + "\n[log truncated]" : out.log;
      FJ_CHECK(false, "NVRTC failed to compile CUDA kernels {} for {}: {}\n{}", key.substr(0, 16), arch,
               n.GetErrorString(rc), shown);
    }
    if (out.is_ptx) {
      n.GetPTXSize(prog, &size);
      out.image.resize(size);
      n.GetPTX(prog, out.image.data());
    } else {
      n.GetCUBINSize(prog, &size);
      out.image.resize(size);
      n.GetCUBIN(prog, out.image.data());
    }
    n.DestroyProgram(&prog);
    return serialize(out);
  };
  bool made = true;
  std::string payload = opt.is_disabled("cache") ? compile() : KernelsCache::instance().get_or_make(key, compile, &made);
  deserialize(payload, b.get());
  b->kernels = parse_ptxas_report(b->log);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  b->compile_ms = made ? ms : 0.0;
  log_info("{} CUDA kernels {} for {} in {:.0f} ms", made ? "compiled" : "loaded cached", key.substr(0, 16), arch, ms);
  std::lock_guard<std::mutex> g(g_mu);
  if (made) {
    g_stats.compiles++;
    g_stats.total_ms += ms;
  } else {
    g_stats.disk_hits++;
  }
  if (auto other = binary_cache()[key].lock()) return other;  // another thread made it meanwhile
  std::shared_ptr<const CudaBinary> result = b;
  binary_cache()[key] = result;
  return result;
}

}  // namespace fusion_jit
