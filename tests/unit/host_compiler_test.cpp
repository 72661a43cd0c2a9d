// The host compiler: its identity in cache keys, a cached library that does not load, temporary files.
#include <gtest/gtest.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <thread>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/hash.h"
#include "targets/cpu/host_compiler.h"

namespace fusion_jit {
namespace {

std::string make_temp_dir() {
  char tmpl[] = "/tmp/fj-host-compiler-test-XXXXXX";
  return ::mkdtemp(tmpl);
}

void remove_tree(const std::string& dir) { std::system(("rm -rf '" + dir + "'").c_str()); }

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

std::string shell_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// "PATH FINGERPRINT" of a command as the identity names it.
std::string fingerprint_of(const std::string& command) {
  std::string path = shell_output("command -v " + command);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  return path + " " + sha256_hex(bytes).substr(0, 16);
}

// Issue 13 item 9: the identity was a constant per process, taken from FUSION_JIT_CXX quoted as one word,
// so `env g++`, `ccache g++` or `g++ -fno-plt` fingerprinted nothing real and a changed compiler behind a
// wrapper was served the old kernels.
TEST(HostCompiler, TheCompilerIdentityComesFromTheCommandActuallyRun) {
  const std::string gpp = fingerprint_of("g++");
  ASSERT_NE(gpp.find("/"), std::string::npos) << "g++ is needed";
  const std::string plain = host_compiler_identity("g++");
  const std::string no_plt = host_compiler_identity("g++ -fno-plt");
  const std::string env = host_compiler_identity("env g++");
  const std::string env_var = host_compiler_identity("env LC_ALL=C g++");
  std::set<std::string> ids{plain, no_plt, env, env_var};
  EXPECT_EQ(ids.size(), 4u) << "each command has its own identity";
  for (const std::string& id : ids) {
    EXPECT_NE(id.find("g++: " + gpp), std::string::npos) << "the real compiler's binary is fingerprinted: " << id;
    EXPECT_NE(id.find("version: g++"), std::string::npos) << "g++'s own --version: " << id;
  }
  EXPECT_NE(no_plt.find("command: g++ -fno-plt"), std::string::npos) << no_plt;
  EXPECT_NE(env.find("env: " + fingerprint_of("env")), std::string::npos) << env;
  if (!shell_output("command -v ccache").empty()) {
    const std::string ccache = host_compiler_identity("ccache g++");
    EXPECT_NE(ccache.find("ccache: " + fingerprint_of("ccache")), std::string::npos) << ccache;
    EXPECT_NE(ccache.find("g++: " + gpp), std::string::npos) << ccache;
  }
  EXPECT_NE(host_compiler_identity("no-such-compiler-fj").find("not found"), std::string::npos);
  // And so the cache keys differ.
  const std::string src = "extern \"C\" int fj_identity_probe() { return 1; }\n";
  std::set<std::string> keys{cpu_source_cache_key(src, "g++"), cpu_source_cache_key(src, "g++ -fno-plt"),
                             cpu_source_cache_key(src, "env g++"), cpu_source_cache_key(src, "ccache g++")};
  EXPECT_EQ(keys.size(), 4u);
  EXPECT_EQ(cpu_source_cache_key(src, "g++"), cpu_source_cache_key(src, "g++")) << "and are stable";
}

// Issue 13 item 8: a cached shared object that passes the checksum but that dlopen refuses was an error
// for the whole signature, on every run, until the cache was cleared by hand.
TEST(HostCompiler, ACachedLibraryThatDlopenRefusesIsRemovedAndRebuiltOnce) {
  const std::string dir = make_temp_dir();
  const std::string previous = KernelsCache::instance().dir();
  KernelsCache::use_dir(dir);
  const std::string src = "extern \"C\" int fj_rebuilt_after_a_bad_entry() { return 42; }\n";
  const std::string key = cpu_source_cache_key(src);
  KernelsCache::instance().put(key, "well framed, checksummed, and no shared object");
  const HostCompileStats before = host_compile_stats();
  testing::internal::CaptureStderr();
  std::shared_ptr<CompiledLibrary> lib;
  EXPECT_NO_THROW(lib = compile_cpu_source(src));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(lib);
  EXPECT_EQ(reinterpret_cast<int (*)()>(lib->symbol("fj_rebuilt_after_a_bad_entry"))(), 42);
  const HostCompileStats after = host_compile_stats();
  EXPECT_EQ(after.compiles, before.compiles + 1) << "compiled once";
  EXPECT_EQ(after.disk_hits, before.disk_hits);
  EXPECT_NE(err.find(key.substr(0, 16) + " from the kernel cache cannot be loaded"), std::string::npos) << err;
  EXPECT_NE(err.find("compiled again"), std::string::npos) << err;
  auto entry = KernelsCache::instance().get(key);
  ASSERT_TRUE(entry.has_value()) << "the rebuilt library was put back";
  EXPECT_EQ(entry->substr(0, 4), "\x7f" "ELF");
  if (!previous.empty()) KernelsCache::use_dir(previous);
  remove_tree(dir);
}

TEST(HostCompiler, FindSymbolIsNullForAMissingFunction) {
  auto lib = compile_cpu_source("extern \"C\" int fj_find_symbol_probe() { return 7; }\n");
  ASSERT_NE(lib->find_symbol("fj_find_symbol_probe"), nullptr);
  EXPECT_EQ(lib->find_symbol("fj_no_such_kernel"), nullptr);
  EXPECT_THROW(lib->symbol("fj_no_such_kernel"), Error);
}

// Issue 13 item 15: every compiling process left a $TMPDIR/fusion_jit-XXXXXX behind.
TEST(HostCompiler, EachCompileRemovesItsTemporaryDirectory) {
  const std::string tmp = make_temp_dir();
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  // A source no cache has seen: it is compiled for real.
  const std::string unique = "// " + std::to_string(::getpid()) + " " + std::to_string(::time(nullptr)) + "\n";
  EXPECT_NO_THROW(compile_cpu_source(unique + "extern \"C\" int fj_tmpdir_probe_ok() { return 1; }\n"));
  EXPECT_THROW(compile_cpu_source("this is not C++ (fj_tmpdir_probe)"), Error);
  if (old) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  EXPECT_TRUE(entries_of(tmp).empty()) << "left in TMPDIR: " << (entries_of(tmp).empty() ? "" : entries_of(tmp)[0]);
  remove_tree(tmp);
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// Issue 13 item 10: the host compiler held its process-wide mutex across the kernel cache's wait for
// another process's lock on a key (up to 300 s), so every other compile of the process waited too.
TEST(HostCompiler, AWaitOnAnotherProcessLockBlocksNoOtherKey) {
  const std::string dir = make_temp_dir();
  const std::string previous = KernelsCache::instance().dir();
  KernelsCache::use_dir(dir);
  const std::string stamp = std::to_string(::getpid()) + "_" + std::to_string(std::time(nullptr));
  const std::string held_src = "extern \"C\" int fj_held_" + stamp + "() { return 1; }\n";
  const std::string free_src = "extern \"C\" int fj_free_" + stamp + "() { return 2; }\n";
  // Another process holds the first key's lock: an flock through a descriptor of our own conflicts with
  // the cache's own descriptor just as another process's would.
  const std::string key = cpu_source_cache_key(held_src);
  const std::string shard = dir + "/v1/" + key.substr(0, 2);
  ASSERT_EQ(std::system(("mkdir -p -m 0700 '" + shard + "'").c_str()), 0);
  int fd = ::open((shard + "/" + key + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto held = std::async(std::launch::async, [&] { return compile_cpu_source(held_src); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first compile now waits for the lock
  auto other = std::async(std::launch::async, [&] { return compile_cpu_source(free_src); });
  const bool other_done = other.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  const bool held_waiting = held.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  ::flock(fd, LOCK_UN);
  ::close(fd);
  EXPECT_TRUE(other_done) << "a compile of another key waited for the held key";
  EXPECT_TRUE(held_waiting) << "the held key did not wait for its lock";
  EXPECT_EQ(reinterpret_cast<int (*)()>(other.get()->symbol("fj_free_" + stamp))(), 2);
  EXPECT_EQ(reinterpret_cast<int (*)()>(held.get()->symbol("fj_held_" + stamp))(), 1);
  if (!previous.empty()) KernelsCache::use_dir(previous);
  remove_tree(dir);
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// A plan-like source: a prelude with a static helper, then `n` kernels of growing length, each after a
// kernel break; kernel i returns helper(i) and names itself with `stamp`.
std::string plan_source(int n, const std::string& stamp, int bad = -1) {
  std::string s = "// prelude " + stamp + "\nstatic inline int fj_helper(int x) { return 3 * x + 1; }\n";
  for (int i = 0; i < n; ++i) {
    s += kKernelBreak;
    s += "// " + std::string(static_cast<size_t>(i) * 40, 'x') + "\n";
    s += i == bad ? "this kernel is not C++\n"
                  : "extern \"C\" int fj_unit_" + stamp + "_" + std::to_string(i) + "() { return fj_helper(" +
                        std::to_string(i) + "); }\n";
  }
  return s;
}

// Note [One plan in several translation units]: every kernel in exactly one unit, each unit the prelude and
// its kernels in their order, the units balanced by length, never more units than kernels or jobs.
TEST(HostCompiler, APlanIsSplitIntoBalancedTranslationUnits) {
  const std::string src = plan_source(7, "split");
  const std::string prelude = src.substr(0, src.find(kKernelBreak));
  EXPECT_EQ(translation_units(src, 1), std::vector<std::string>{src});
  EXPECT_EQ(translation_units("int f() { return 1; }\n", 4).size(), 1u) << "no breaks: one unit";
  EXPECT_EQ(translation_units(plan_source(1, "one"), 4).size(), 1u) << "one kernel: one unit";
  EXPECT_EQ(translation_units(plan_source(2, "two"), 4).size(), 2u) << "no more units than kernels";
  for (int jobs : {2, 3}) {
    const std::vector<std::string> units = translation_units(src, jobs);
    ASSERT_EQ(units.size(), static_cast<size_t>(jobs));
    EXPECT_EQ(translation_units(src, jobs), units) << "deterministic";
    std::vector<int> seen(7, 0);
    size_t longest = 0, shortest = SIZE_MAX;
    for (const std::string& u : units) {
      EXPECT_EQ(u.rfind(prelude, 0), 0u) << "each unit starts with the prelude";
      int last = -1;
      for (int i = 0; i < 7; ++i) {
        const size_t at = u.find("fj_unit_split_" + std::to_string(i) + "()");
        if (at == std::string::npos) continue;
        ++seen[i];
        EXPECT_GT(static_cast<int>(at), last) << "kernels keep their order within a unit";
        last = static_cast<int>(at);
      }
      longest = std::max(longest, u.size() - prelude.size());
      shortest = std::min(shortest, u.size() - prelude.size());
    }
    EXPECT_EQ(seen, std::vector<int>(7, 1)) << jobs << " units";
    // Greedy by length: the units differ by at most the longest kernel's text.
    EXPECT_LE(longest - shortest, 6 * 40 + 120u) << jobs << " units";
  }
}

// The units of one plan compile at once into one library; a unit that fails fails the compile, with the
// compiler's message, and leaves no library behind.
TEST(HostCompiler, TheUnitsOfAPlanLinkIntoOneLibraryAndAFailingUnitFailsTheCompile) {
  const std::string stamp = std::to_string(::getpid()) + "_" + std::to_string(std::time(nullptr));
  const HostCompileStats before = host_compile_stats();
  auto lib = compile_cpu_source(plan_source(5, stamp));
  const HostCompileStats after = host_compile_stats();
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(reinterpret_cast<int (*)()>(lib->symbol("fj_unit_" + stamp + "_" + std::to_string(i)))(), 3 * i + 1);
  EXPECT_EQ(after.compiles, before.compiles + 1);
  EXPECT_GE(after.units - before.units, 1);
  try {
    compile_cpu_source(plan_source(5, stamp + "_bad", 3));
    ADD_FAILURE() << "a unit that does not compile must fail the compile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this kernel is not C++"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("host compiler failed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusion_jit
