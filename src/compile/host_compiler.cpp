#include "compile/host_compiler.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

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

}  // namespace

CompiledLibrary::CompiledLibrary(void* handle, std::string path, std::string key, double compile_ms)
    : handle_(handle), path_(std::move(path)), key_(std::move(key)), compile_ms_(compile_ms) {}

CompiledLibrary::~CompiledLibrary() {
  if (handle_) dlclose(handle_);
  if (!path_.empty()) std::remove(path_.c_str());
}

void* CompiledLibrary::symbol(const std::string& name) const {
  void* f = dlsym(handle_, name.c_str());
  FJ_CHECK(f != nullptr, "generated library {} has no function {}", path_, name);
  return f;
}

std::string host_compile_flags() {
  return "-std=c++17 -O3 -march=native -shared -fPIC -fopenmp-simd -fno-math-errno -fno-trapping-math -fwrapv "
         "-fno-semantic-interposition";
}

HostCompileStats host_compile_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_stats;
}

std::shared_ptr<CompiledLibrary> compile_cpu_source(const std::string& source) {
  const Options& opt = Options::get();
  std::string key = sha256_hex(opt.cxx + "\n" + host_compile_flags() + "\n" + source);
  std::lock_guard<std::mutex> g(g_mu);
  if (auto lib = library_cache()[key].lock()) {
    g_stats.memory_hits++;
    return lib;
  }
  FJ_CHECK(!opt.assert_no_compile,
           "FUSION_JIT_ASSERT_NO_COMPILE is set, but CPU kernels {} would be compiled", key.substr(0, 16));
  auto t0 = std::chrono::steady_clock::now();
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
  if (rc != 0) {
    FJ_CHECK(false, "host compiler failed (exit {}) on {}:\n{}\ncommand: {}", rc, src, out, cmd);
  }
  std::remove(src.c_str());
  void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  FJ_CHECK(h != nullptr, "cannot load generated library {}: {}", so, dlerror());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  g_stats.compiles++;
  g_stats.total_ms += ms;
  log_info("compiled CPU kernels {} in {:.0f} ms", key.substr(0, 16), ms);
  auto lib = std::make_shared<CompiledLibrary>(h, so, key, ms);
  library_cache()[key] = lib;
  return lib;
}

}  // namespace fusion_jit
