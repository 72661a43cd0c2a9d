#include "targets/cpu/host_compiler.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <cstring>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

std::mutex g_mu;
HostCompileStats g_stats;

// Keys being compiled, each with the mutex that its compile holds (under g_mu).
std::map<std::string, std::shared_ptr<std::mutex>>& compiles_in_flight() {
  static auto* m = new std::map<std::string, std::shared_ptr<std::mutex>>();
  return *m;
}

std::map<std::string, std::weak_ptr<CompiledLibrary>>& library_cache() {
  static auto* m = new std::map<std::string, std::weak_ptr<CompiledLibrary>>();
  return *m;
}

// A private directory for one compile ($TMPDIR/fusion_jit-XXXXXX, 0700), removed with everything in it
// when the compile ends, whether it succeeded or threw.
class CompileDir {
 public:
  CompileDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fusion_jit-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    FJ_CHECK(::mkdtemp(buf.data()) != nullptr, "cannot create a temporary directory {}: {}", tmpl, std::strerror(errno));
    path_ = buf.data();
  }
  ~CompileDir() {
    // The compiler writes plain files here (the source, the shared object, nothing nested).
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ::unlinkat(::dirfd(d), e->d_name, 0);
      ::closedir(d);
    }
    if (::rmdir(path_.c_str()) != 0) log_warn("cannot remove the temporary directory {}: {}", path_, std::strerror(errno));
  }
  CompileDir(const CompileDir&) = delete;
  CompileDir& operator=(const CompileDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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

// The first 16 hex digits of SHA-256 of the file at `path` ("" when it cannot be read).
std::string file_fingerprint(const std::string& path) {
  std::ifstream bin(path, std::ios::binary);
  if (!bin) return "";
  std::string bytes((std::istreambuf_iterator<char>(bin)), {});
  return sha256_hex(bytes).substr(0, 16);
}

// Where the shell finds `word` (command -v), or "".
std::string resolve_command(const std::string& word) {
  std::string path;
  if (run_command("command -v " + shell_quote(word), &path) != 0) return "";
  path = path.substr(0, path.find('\n'));
  return path.empty() || path[0] != '/' ? "" : path;
}

// Commands that run the next word of the command line as the compiler.
bool is_wrapper(const std::string& path) {
  static const std::set<std::string> wrappers{"ccache", "sccache", "distcc", "icecc", "env", "nice", "nohup", "time"};
  return wrappers.count(path.substr(path.rfind('/') + 1)) > 0;
}

}  // namespace

std::string host_compiler_identity(const std::string& cxx) {
  static std::mutex mu;
  static std::map<std::string, std::string> known;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = known.find(cxx);
    if (it != known.end()) return it->second;
  }
  std::istringstream words_in(cxx);
  std::vector<std::string> words;
  for (std::string w; words_in >> w;) words.push_back(w);
  std::string id = "command: " + cxx;
  // The version as the command prints it, run as the compile runs it (unquoted: the shell splits words).
  std::string version;
  run_command(cxx + " --version", &version);
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  id += " | version: " + version;
  // The binaries that compile: the first word, and after each wrapper the first word that is no option
  // and no VAR=VALUE and that the shell finds.
  for (size_t i = 0; i < words.size();) {
    std::string path = resolve_command(words[i]);
    id += " | " + words[i] + ": " + (path.empty() ? "not found" : path + " " + file_fingerprint(path));
    if (path.empty() || !is_wrapper(path)) break;
    size_t next = i + 1;
    while (next < words.size() && (words[next][0] == '-' || words[next].find('=') != std::string::npos ||
                                   resolve_command(words[next]).empty()))
      ++next;
    i = next;
  }
  std::lock_guard<std::mutex> g(mu);
  known[cxx] = id;
  return id;
}

// The host CPU's ISA (-march=native code crashes on another CPU): model and feature flags.
const std::string& host_isa() { return host_cpu_identity(); }

namespace {

// Loads a shared object from memory (a memfd: no file to clean up, works where the cache is noexec).
// Returns the handle and sets *fd_out to the in-memory file (open while the library is loaded), or returns
// nullptr and sets *error.
void* load_shared_object(const std::string& image, const std::string& key, int* fd_out, std::string* error) {
  int fd = ::memfd_create(("fj_" + key.substr(0, 16)).c_str(), MFD_CLOEXEC);
  FJ_CHECK(fd >= 0, "cannot create an in-memory file for kernels {}: {}", key.substr(0, 16), std::strerror(errno));
  size_t done = 0;
  while (done < image.size()) {
    ssize_t n = ::write(fd, image.data() + done, image.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  void* h = done == image.size() ? dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!h) {
    const char* why = done == image.size() ? dlerror() : nullptr;
    *error = why ? why : "short write";
    ::close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return h;
}

// The compiler command as it reads from the compile directory: a first word that is a relative path
// (./bin/g++) made absolute against this process's directory, quoted. Words after it are left as written
// (docs/options.md: relative paths there would be read from the compile directory).
std::string from_any_directory(const std::string& cxx) {
  const size_t start = cxx.find_first_not_of(' ');
  if (start == std::string::npos) return cxx;
  const size_t end = std::min(cxx.find(' ', start), cxx.size());
  const std::string first = cxx.substr(start, end - start);
  // Absolute, found on PATH, VAR=VALUE, quoted or ~: the shell resolves it the same from anywhere.
  if (first[0] == '/' || first[0] == '~' || first[0] == '\'' || first[0] == '"' ||
      first.find('/') == std::string::npos || first.find('=') != std::string::npos)
    return cxx;
  char cwd[4096];
  FJ_CHECK(::getcwd(cwd, sizeof cwd) != nullptr, "cannot read the working directory: {}", std::strerror(errno));
  return cxx.substr(0, start) + shell_quote(std::string(cwd) + "/" + first) + cxx.substr(end);
}

// A line naming this CPU that survives the preprocessor (a compiler cache may hash the preprocessed
// source, where comments are gone): a string in the object, named by nothing.
std::string isa_marker() {
  std::string isa;
  for (char c : host_isa()) {
    if (c == '"' || c == '\\') isa += '\\';
    isa += c;
  }
  return "static const char fj_compiled_for[] __attribute__((used)) = \"" + isa + "\";\n";
}

}  // namespace

// Note [One plan in several translation units]
// A plan's source is a prelude and its kernels, each after a line kKernelBreak (cpu_printer.cpp). GCC
// compiles one translation unit on one core: a plan of a hundred kernels kept one core busy for seconds
// while the others waited. The kernels are split into units, as many as FUSION_JIT_COMPILE_JOBS (by
// default the CPUs this process may run on) and never more than the kernels; each unit is the prelude and
// its share of the kernels, balanced by the length of their text (the longest first, each to the unit with
// the least so far; kernels keep their order within a unit). The units compile at once and their objects
// link into one shared object. A unit's text depends only on its kernels, so a compiler cache answers the
// units it has seen. A source without breaks (written before them, or by hand) is one unit.
std::vector<std::string> translation_units(const std::string& source, int jobs) {
  const std::string brk = kKernelBreak;
  std::vector<size_t> at;
  for (size_t p = source.find(brk); p != std::string::npos; p = source.find(brk, p + brk.size())) at.push_back(p);
  const size_t units = std::min(at.size(), static_cast<size_t>(std::max(jobs, 1)));
  if (units <= 1) return {source};
  const std::string prelude = source.substr(0, at[0]);
  std::vector<std::pair<size_t, size_t>> kernels;  // [begin, end) of each kernel's text
  for (size_t i = 0; i < at.size(); ++i) kernels.push_back({at[i], i + 1 < at.size() ? at[i + 1] : source.size()});
  std::vector<size_t> order(kernels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto len = [&](size_t i) { return kernels[i].second - kernels[i].first; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len(a) > len(b); });
  std::vector<size_t> load(units, 0);
  std::vector<std::vector<size_t>> members(units);
  for (size_t i : order) {
    const size_t u = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[u] += len(i);
    members[u].push_back(i);
  }
  std::vector<std::string> out;
  for (auto& m : members) {
    std::sort(m.begin(), m.end());
    std::string text = prelude;
    for (size_t i : m) text.append(source, kernels[i].first, len(i));
    out.push_back(std::move(text));
  }
  return out;
}

namespace {

// The CPUs this process may run on (at least 1).
int usable_cpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// Compiles `source` for `march` in a temporary directory of its own and returns the shared object's bytes;
// `key` names it in messages.
//
// Note [The host compile in two steps]: each translation unit is compiled to an object, then the objects
// are linked, all inside the compile directory under fixed names. A compiler cache in FUSION_JIT_CXX
// (ccache g++) caches only compiles that are not links, and keys them by the input's path as written: the
// same unit gives the same command, and the cache answers it, whichever temporary directory this compile
// has. Code for -march=native starts with a string naming this CPU's ISA (isa_marker), which a compiler
// cache hashes with the rest whether it hashes the source or its preprocessed form. The tests run with
// ccache where it is installed, so a kernel whose source has not changed is compiled once per machine, not
// once per run. The split costs nothing measurable (bench/RESULTS.md).
std::string compile_image(const std::string& source, const std::string& key, const std::string& march) {
  const Options& opt = Options::get();
  FJ_CHECK(!opt.assert_no_compile,
           "FUSION_JIT_ASSERT_NO_COMPILE is set, but CPU kernels {} would be compiled", key.substr(0, 16));
  CompileDir dir;
  const std::vector<std::string> units =
      translation_units(source, opt.compile_jobs > 0 ? opt.compile_jobs : usable_cpus());
  const std::string so = dir.path() + "/kernels.so";
  std::vector<std::string> names;
  for (size_t u = 0; u < units.size(); ++u) {
    names.push_back(units.size() == 1 ? "kernels" : "kernels" + std::to_string(u));
    const std::string src = dir.path() + "/" + names.back() + ".cpp";
    std::ofstream f(src);
    // -march=native means this CPU: say which, so that a compiler cache shared by other CPUs tells them apart.
    if (march == "native") f << isa_marker();
    f << units[u];
    FJ_CHECK(f.good(), "cannot write generated source {}", src);
  }
  const std::string cxx = from_any_directory(opt.cxx);
  const std::string flags = host_compile_flags(march);
  std::string compiles, objects;
  if (names.size() == 1) {
    compiles = cxx + " " + flags + " -c kernels.cpp -o kernels.o";
  } else {
    // All units at once; the link waits for every one and runs only if each succeeded.
    compiles = "{ ";
    for (size_t u = 0; u < names.size(); ++u)
      compiles += fmt::format("{} {} -c {}.cpp -o {}.o & p{}=$!; ", cxx, flags, names[u], names[u], u);
    compiles += "s=0; ";
    for (size_t u = 0; u < names.size(); ++u) compiles += fmt::format("wait $p{} || s=1; ", u);
    compiles += "[ $s = 0 ]; }";
  }
  for (const auto& n : names) objects += " " + n + ".o";
  std::string cmd = "(cd " + shell_quote(dir.path()) + " && " + compiles + " && " + cxx + " -shared" + objects +
                    " -o kernels.so -lmvec -lm)";
  std::string out;
  int rc = run_command(cmd, &out);
  if (opt.dumps("log") && !out.empty()) std::fprintf(stderr, "== host compiler log ==\n%s", out.c_str());
  if (rc != 0)
    FJ_CHECK(false, "host compiler failed (exit {}) on kernels {} ({} translation unit{}):\n{}\ncommand: {}", rc,
             key.substr(0, 16), units.size(), units.size() == 1 ? "" : "s", out, cmd);
  std::ifstream f(so, std::ios::binary);
  std::string image((std::istreambuf_iterator<char>(f)), {});
  FJ_CHECK(!image.empty(), "the host compiler wrote no shared object {}", so);
  std::lock_guard<std::mutex> g(g_mu);
  g_stats.compiles++;
  g_stats.units += static_cast<int64_t>(units.size());
  return image;
}

}  // namespace

CompiledLibrary::CompiledLibrary(void* handle, int fd, std::string key, double compile_ms)
    : handle_(handle), fd_(fd), key_(std::move(key)), compile_ms_(compile_ms) {}

CompiledLibrary::~CompiledLibrary() {
  if (handle_) dlclose(handle_);
  if (fd_ >= 0) ::close(fd_);
}

void* CompiledLibrary::find_symbol(const std::string& name) const { return dlsym(handle_, name.c_str()); }

void* CompiledLibrary::symbol(const std::string& name) const {
  void* f = find_symbol(name);
  FJ_CHECK(f != nullptr, "compiled kernels {} have no function {}", key_.substr(0, 16), name);
  return f;
}

std::string host_compile_flags(const std::string& march) {
  return "-std=c++17 -O3 -march=" + march + " -shared -fPIC -fopenmp-simd -fno-math-errno -fwrapv "
         "-fno-semantic-interposition -fno-tree-pre -fno-thread-jumps";
}

std::string host_compile_flags() { return host_compile_flags("native"); }

HostCompileStats host_compile_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_stats;
}

std::string cpu_source_cache_key(const std::string& source, const std::string& cxx, const std::string& march) {
  // Code for -march=native runs on this CPU only; code for a named level runs wherever that level does.
  return cache_key({"cpu-so", source, host_compiler_identity(cxx), host_compile_flags(march),
                    march == "native" ? host_isa() : std::string("any CPU of ") + march});
}

std::string cpu_source_cache_key(const std::string& source, const std::string& cxx) {
  return cpu_source_cache_key(source, cxx, "native");
}

std::string cpu_source_cache_key(const std::string& source) { return cpu_source_cache_key(source, Options::get().cxx); }

bool cpu_source_compiled(const std::string& source) {
  const std::string key = cpu_source_cache_key(source);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = library_cache().find(key);
    if (it != library_cache().end() && !it->second.expired()) return true;
  }
  return !Options::get().is_disabled("cache") && KernelsCache::instance().contains(key);
}

std::shared_ptr<CompiledLibrary> compile_cpu_source(const std::string& source) {
  const Options& opt = Options::get();
  const std::string key = cpu_source_cache_key(source);
  // g_mu guards the tables and counters only; it is never held across a compile or a wait on another
  // process's cache lock. One compile per key: threads asking for the same key wait on its own mutex.
  std::shared_ptr<std::mutex> key_mu;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (auto lib = library_cache()[key].lock()) {
      g_stats.memory_hits++;
      return lib;
    }
    auto& slot = compiles_in_flight()[key];
    if (!slot) slot = std::make_shared<std::mutex>();
    key_mu = slot;
  }
  std::lock_guard<std::mutex> one_compile(*key_mu);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (auto lib = library_cache()[key].lock()) {  // made by the thread this one waited for
      g_stats.memory_hits++;
      return lib;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto compile = [&] { return compile_image(source, key, "native"); };
  const bool use_cache = !opt.is_disabled("cache");
  bool made = true;
  std::string image = use_cache ? KernelsCache::instance().get_or_make(key, compile, &made) : compile();
  int fd = -1;
  std::string error;
  void* h = load_shared_object(image, key, &fd, &error);
  if (!h && !made) {
    // It passed the checksum, so the cache stored what some process gave it; it is still no library
    // this process can load (another loader, a foreign libc): remove it and compile once more.
    log_warn("CPU kernels {} from the kernel cache cannot be loaded ({}); removed from the cache and compiled again",
             key.substr(0, 16), error);
    KernelsCache& cache = KernelsCache::instance();
    cache.erase(key);
    image = compile();
    made = true;
    cache.put(key, image);
    h = load_shared_object(image, key, &fd, &error);
  }
  FJ_CHECK(h != nullptr, "cannot load compiled kernels {}: {}", key.substr(0, 16), error);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto lib = std::make_shared<CompiledLibrary>(h, fd, key, made ? ms : 0.0);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!made) g_stats.disk_hits++;
    if (made) g_stats.total_ms += ms;
    library_cache()[key] = lib;
    compiles_in_flight().erase(key);
  }
  if (made) {
    log_info("compiled CPU kernels {} in {:.0f} ms", key.substr(0, 16), ms);
  } else {
    log_info("loaded CPU kernels {} from the kernel cache in {:.1f} ms", key.substr(0, 16), ms);
  }
  return lib;
}

std::string cpu_library_image(const std::string& source, const std::string& march) {
  FJ_CHECK(march == "native" || march.rfind("x86-64", 0) == 0,
           "unknown CPU code variant '{}': give native or an x86-64 level (x86-64, x86-64-v2, x86-64-v3, x86-64-v4)",
           march);
  const std::string key = cpu_source_cache_key(source, Options::get().cxx, march);
  auto compile = [&] { return compile_image(source, key, march); };
  if (Options::get().is_disabled("cache")) return compile();
  return KernelsCache::instance().get_or_make(key, compile);
}

std::shared_ptr<CompiledLibrary> load_cpu_library_image(const std::string& image, const std::string& name) {
  int fd = -1;
  std::string error;
  const std::string key = sha256_hex(image);
  void* h = load_shared_object(image, key, &fd, &error);
  FJ_CHECK(h != nullptr, "cannot load the CPU kernels of {}: {}", name, error);
  return std::make_shared<CompiledLibrary>(h, fd, key, 0.0);
}

std::string cpu_cannot_run(const std::string& march) {
  __builtin_cpu_init();
  if (march == "native") return "";  // the caller compares host_isa()
  if (march == "x86-64") return "";
  if (march == "x86-64-v2") return __builtin_cpu_supports("x86-64-v2") ? "" : "this CPU lacks x86-64-v2";
  if (march == "x86-64-v3") return __builtin_cpu_supports("x86-64-v3") ? "" : "this CPU lacks x86-64-v3 (AVX2, FMA)";
  if (march == "x86-64-v4") return __builtin_cpu_supports("x86-64-v4") ? "" : "this CPU lacks x86-64-v4 (AVX-512)";
  return "unknown CPU code variant '" + march + "'";
}

}  // namespace fusion_jit
