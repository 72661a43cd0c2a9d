#include "compile/host_compiler.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <cstring>
#include <vector>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

std::mutex g_mu;
HostCompileStats g_stats;

std::map<std::string, std::weak_ptr<CompiledLibrary>>& library_cache() {
  static auto* m = new std::map<std::string, std::weak_ptr<CompiledLibrary>>();
  return *m;
}

// A private directory for this process's shared objects.
const std::string& work_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fusion_jit-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    FJ_CHECK(mkdtemp(buf.data()) != nullptr, "cannot create a temporary directory at {}", tmpl);
    return std::string(buf.data());
  }();
  return dir;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; returns its exit status and what it printed.
int run_command(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  FJ_CHECK(p != nullptr, "cannot run the host compiler: {}", cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// The host compiler's identity for cache keys: its path, `--version` line and a fingerprint of its binary.
const std::string& compiler_identity() {
  static const std::string id = [] {
    const std::string& cxx = Options::get().cxx;
    std::string path, version;
    run_command("command -v " + shell_quote(cxx), &path);
    run_command(shell_quote(cxx) + " --version", &version);
    path = path.substr(0, path.find('\n'));
    version = version.substr(0, version.find('\n'));
    std::ifstream bin(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(bin)), {});
    return path + " | " + version + " | " + sha256_hex(bytes).substr(0, 16);
  }();
  return id;
}

// The host CPU's ISA (-march=native code crashes on another CPU): model and feature flags.
const std::string& host_isa() {
  static const std::string isa = [] {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(f, line) && (model.empty() || flags.empty())) {
      if (model.empty() && line.rfind("model name", 0) == 0) model = line;
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
    return model + " | " + sha256_hex(flags).substr(0, 16);
  }();
  return isa;
}

// Loads a shared object from memory (a memfd: no file to clean up, works where the cache is noexec).
// Loads the image through an in-memory file; *fd receives it (open while the library is loaded).
void* load_shared_object(const std::string& image, const std::string& key, int* fd_out) {
  int fd = ::memfd_create(("fj_" + key.substr(0, 16)).c_str(), MFD_CLOEXEC);
  FJ_CHECK(fd >= 0, "cannot create an in-memory file for kernels {}: {}", key.substr(0, 16), std::strerror(errno));
  size_t done = 0;
  while (done < image.size()) {
    ssize_t n = ::write(fd, image.data() + done, image.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  void* h = done == image.size() ? dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  std::string err = h ? "" : (done == image.size() ? dlerror() : "short write");
  if (!h) ::close(fd);
  FJ_CHECK(h != nullptr, "cannot load compiled kernels {}: {}", key.substr(0, 16), err);
  *fd_out = fd;
  return h;
}

}  // namespace

CompiledLibrary::CompiledLibrary(void* handle, int fd, std::string key, double compile_ms)
    : handle_(handle), fd_(fd), key_(std::move(key)), compile_ms_(compile_ms) {}

CompiledLibrary::~CompiledLibrary() {
  if (handle_) dlclose(handle_);
  if (fd_ >= 0) ::close(fd_);
}

void* CompiledLibrary::symbol(const std::string& name) const {
  void* f = dlsym(handle_, name.c_str());
  FJ_CHECK(f != nullptr, "compiled kernels {} have no function {}", key_.substr(0, 16), name);
  return f;
}

std::string host_compile_flags() {
  return "-std=c++17 -O3 -march=native -shared -fPIC -fopenmp-simd -fno-math-errno -fwrapv "
         "-fno-semantic-interposition";
}

HostCompileStats host_compile_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_stats;
}

std::shared_ptr<CompiledLibrary> compile_cpu_source(const std::string& source) {
  const Options& opt = Options::get();
  const std::string key = cache_key({"cpu-so", source, compiler_identity(), host_compile_flags(), host_isa()});
  std::lock_guard<std::mutex> g(g_mu);
  if (auto lib = library_cache()[key].lock()) {
    g_stats.memory_hits++;
    return lib;
  }
  auto t0 = std::chrono::steady_clock::now();
  // Compiles to a private file and returns the shared object's bytes.
  auto compile = [&]() -> std::string {
    FJ_CHECK(!opt.assert_no_compile,
             "FUSION_JIT_ASSERT_NO_COMPILE is set, but CPU kernels {} would be compiled", key.substr(0, 16));
    std::string base = work_dir() + "/" + key.substr(0, 24);
    std::string src = base + ".cpp", so = base + ".so";
    {
      std::ofstream f(src);
      f << source;
      FJ_CHECK(f.good(), "cannot write generated source {}", src);
    }
    std::string cmd = opt.cxx + " " + host_compile_flags() + " " + shell_quote(src) + " -o " + shell_quote(so) +
                      " -lmvec -lm";
    std::string out;
    int rc = run_command(cmd, &out);
    if (opt.dumps("log") && !out.empty()) std::fprintf(stderr, "== host compiler log ==\n%s", out.c_str());
    if (rc != 0) FJ_CHECK(false, "host compiler failed (exit {}) on {}:\n{}\ncommand: {}", rc, src, out, cmd);
    std::remove(src.c_str());
    std::ifstream f(so, std::ios::binary);
    std::string image((std::istreambuf_iterator<char>(f)), {});
    std::remove(so.c_str());
    FJ_CHECK(!image.empty(), "the host compiler wrote no shared object {}", so);
    g_stats.compiles++;
    return image;
  };
  bool made = true;
  std::string image = opt.is_disabled("cache") ? compile() : KernelsCache::instance().get_or_make(key, compile, &made);
  if (!made) g_stats.disk_hits++;
  int fd = -1;
  void* h = load_shared_object(image, key, &fd);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (made) {
    g_stats.total_ms += ms;
    log_info("compiled CPU kernels {} in {:.0f} ms", key.substr(0, 16), ms);
  } else {
    log_info("loaded CPU kernels {} from the kernel cache in {:.1f} ms", key.substr(0, 16), ms);
  }
  auto lib = std::make_shared<CompiledLibrary>(h, fd, key, made ? ms : 0.0);
  library_cache()[key] = lib;
  return lib;
}

}  // namespace fusion_jit
