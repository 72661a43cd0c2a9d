// kernels_cache: framed entries, corruption, eviction, and processes racing, dying, and meeting
// read-only or full directories (the last two in a private mount namespace: tests run as root, which
// permission bits do not stop).
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "kernels_cache/kernels_cache.h"

namespace fusion_jit {
namespace {

// Temporary cache directories, removed when the test program ends (children leave with _exit).
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (const auto& d : dirs) std::system(("rm -rf '" + d + "'").c_str());
  }
} g_temp_dirs;

std::string temp_dir() {
  char tmpl[] = "/tmp/fj-cache-test-XXXXXX";
  std::string d = ::mkdtemp(tmpl);
  g_temp_dirs.dirs.push_back(d);
  return d;
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

std::string payload(int i, size_t n = 1000) {
  std::string p(n, '\0');
  for (size_t k = 0; k < n; ++k) p[k] = static_cast<char>((k * 31 + i * 7) & 0xff);
  return p;
}

std::string key_of(int i) { return cache_key({"test", "source " + std::to_string(i), "cc 1", "-O2", "x86"}); }

int count_files(const std::string& dir, const std::string& part) {
  std::string cmd = "find '" + dir + "' -name '*" + part + "*' | wc -l";
  FILE* p = ::popen(cmd.c_str(), "r");
  int n = 0;
  if (p && std::fscanf(p, "%d", &n) != 1) n = -1;
  if (p) ::pclose(p);
  return n;
}

TEST(KernelsCache, RoundTripCountersAndLayout) {
  KernelsCache c(temp_dir(), 1 << 20);
  const std::string k = key_of(1);
  EXPECT_FALSE(c.get(k).has_value());
  c.put(k, payload(1));
  auto got = c.get(k);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, payload(1));
  auto s = c.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.writes, 1);
  auto entries = c.list(true);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, k);
  EXPECT_EQ(entries[0].path, c.dir() + "/v1/" + k.substr(0, 2) + "/" + k + ".fjk");
  EXPECT_TRUE(entries[0].valid);
  struct stat st;
  ASSERT_EQ(::stat((c.dir() + "/v1").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(count_files(c.dir(), ".tmp."), 0);
}

TEST(KernelsCache, EachFieldOfTheKeyChangesIt) {
  CacheKeyParts base{"cpu-so", "src", "g++ 12.2 abc", "-O3", "avx512"};
  std::set<std::string> keys{cache_key(base)};
  for (int f = 0; f < 5; ++f) {
    CacheKeyParts p = base;
    std::string* fields[] = {&p.kind, &p.source, &p.compiler, &p.flags, &p.target};
    *fields[f] += "x";
    keys.insert(cache_key(p));
  }
  EXPECT_EQ(keys.size(), 6u);
  // Field boundaries matter: "ab"+"c" is not "a"+"bc".
  CacheKeyParts a{"k", "ab", "c", "", ""}, b{"k", "a", "bc", "", ""};
  EXPECT_NE(cache_key(a), cache_key(b));
  KernelsCache c(temp_dir(), 1 << 20);
  c.put(cache_key(base), "x");
  for (const auto& k : keys) {
    if (k != cache_key(base)) {
      EXPECT_FALSE(c.get(k).has_value());
    }
  }
}

TEST(KernelsCache, TruncatedEntriesAreCountedRemovedAndRebuilt) {
  KernelsCache c(temp_dir(), 1 << 20);
  const std::string k = key_of(2);
  c.put(k, payload(2));
  const std::string path = c.list()[0].path, whole = read(path);
  int n = 0;
  for (size_t len : {size_t{0}, size_t{3}, size_t{12}, size_t{80}, whole.size() / 2, whole.size() - 1}) {
    write(path, whole.substr(0, len));
    EXPECT_FALSE(c.get(k).has_value()) << "truncated at " << len;
    EXPECT_EQ(c.stats().corrupt, ++n);
    EXPECT_NE(::access(path.c_str(), F_OK), 0) << "a corrupt entry is removed";
    bool made = false;
    EXPECT_EQ(c.get_or_make(k, [] { return payload(2); }, &made), payload(2));
    EXPECT_TRUE(made) << "and rebuilt";
  }
}

TEST(KernelsCache, FlippedBytesAreCaught) {
  KernelsCache c(temp_dir(), 1 << 20);
  const std::string k = key_of(3);
  std::mt19937 rng(3);
  for (int round = 0; round < 50; ++round) {
    c.put(k, payload(3));
    const std::string path = c.list()[0].path;
    std::string f = read(path);
    size_t at = std::uniform_int_distribution<size_t>(0, f.size() - 1)(rng);
    f[at] = static_cast<char>(f[at] ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
    write(path, f);
    EXPECT_FALSE(c.get(k).has_value()) << "byte " << at << " flipped";
  }
  EXPECT_EQ(c.stats().corrupt, 50);
}

TEST(KernelsCache, SwappedEntriesAreCaughtByTheKeyInside) {
  KernelsCache c(temp_dir(), 1 << 20);
  c.put(key_of(4), payload(4));
  c.put(key_of(5), payload(5));
  std::map<std::string, std::string> path;
  for (const auto& e : c.list()) path[e.key] = e.path;
  std::string a = read(path[key_of(4)]), b = read(path[key_of(5)]);
  write(path[key_of(4)], b);
  write(path[key_of(5)], a);
  EXPECT_FALSE(c.get(key_of(4)).has_value());
  EXPECT_FALSE(c.get(key_of(5)).has_value());
  EXPECT_EQ(c.stats().corrupt, 2);
}

TEST(KernelsCache, EvictionKeepsTheCacheUnderItsCapLeastRecentlyUsedFirst) {
  const int64_t cap = 20 * 1100;
  KernelsCache c(temp_dir(), cap);
  c.put(key_of(100), payload(100));
  const time_t base = ::time(nullptr) - 1000;
  for (int i = 0; i < 60; ++i) {
    c.put(key_of(i), payload(i));
    // Entry i was last used at base + i (file times have 1 s steps: set them rather than sleep).
    struct timespec t[2] = {{base + i, 0}, {base + i, 0}};
    for (const auto& e : c.list())
      if (e.key == key_of(i)) ::utimensat(AT_FDCWD, e.path.c_str(), t, 0);
    ASSERT_TRUE(c.get(key_of(100)).has_value()) << "the entry in use stays";
    int64_t total = 0;
    for (const auto& e : c.list()) total += e.bytes;
    EXPECT_LE(total, cap) << "after " << i + 1 << " puts";
  }
  EXPECT_GT(c.stats().evictions, 0);
  EXPECT_FALSE(c.get(key_of(0)).has_value()) << "the oldest went first";
  EXPECT_TRUE(c.get(key_of(59)).has_value());
  c.prune(0);
  EXPECT_TRUE(c.list().empty());
}

// Children report failures through their exit status.
int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(KernelsCache, EightProcessesRacingOnOneKeyCompileItOnce) {
  const std::string dir = temp_dir();
  const std::string log = dir + "/compiles.log";
  const int kProcs = 8, kRounds = 12;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      KernelsCache c(dir, 64 << 20);
      for (int r = 0; r < kRounds; ++r) {
        std::string got = c.get_or_make(key_of(1000 + r), [&] {
          std::ofstream(log, std::ios::app) << r << "\n";
          std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a slow compiler
          return payload(r, 100000);
        });
        if (got != payload(r, 100000)) ::_exit(1);
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) EXPECT_EQ(wait_child(k), 0);
  std::map<int, int> compiles;
  std::ifstream f(log);
  for (int r; f >> r;) compiles[r]++;
  for (int r = 0; r < kRounds; ++r) EXPECT_EQ(compiles[r], 1) << "round " << r;
  EXPECT_EQ(count_files(dir, ".tmp."), 0) << "no temporary file left behind";
}

TEST(KernelsCache, AProcessKilledWhileHoldingTheLockOrWritingLeavesTheCacheWorking) {
  const std::string dir = temp_dir();
  const std::string k = key_of(7);
  pid_t pid = ::fork();
  if (pid == 0) {
    KernelsCache c(dir, 1 << 20);
    c.get_or_make(k, []() -> std::string { ::raise(SIGKILL); return ""; });  // killed under the lock
    ::_exit(0);
  }
  EXPECT_EQ(wait_child(pid), 128 + SIGKILL);
  // A writer killed half-way leaves a temporary file, never an entry.
  KernelsCache c(dir, 1 << 20);
  const std::string tmp = dir + "/v1/" + k.substr(0, 2) + "/" + k + ".tmp.99999.0";
  write(tmp, "FJKC partial");
  auto t0 = std::chrono::steady_clock::now();
  bool made = false;
  EXPECT_EQ(c.get_or_make(k, [] { return payload(7); }, &made), payload(7));
  EXPECT_TRUE(made);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5) << "the lock was free";
  struct timespec old[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ::utimensat(AT_FDCWD, tmp.c_str(), old, 0);
  c.prune(1 << 20);
  EXPECT_NE(::access(tmp.c_str(), F_OK), 0) << "prune removes old temporary files";
  EXPECT_EQ(*c.get(k), payload(7));
}

TEST(KernelsCache, WritersKilledMidWriteNeverLeaveAPartialEntry) {
  const std::string dir = temp_dir();
  const std::string big = payload(9, 8 << 20);
  for (int round = 0; round < 5; ++round) {
    pid_t pid = ::fork();
    if (pid == 0) {
      KernelsCache c(dir, 1LL << 32);
      for (int i = 0;; ++i) c.put(key_of(300 + i % 7), big);  // until killed
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 17 * round));
    ::kill(pid, SIGKILL);
    EXPECT_EQ(wait_child(pid), 128 + SIGKILL);
  }
  KernelsCache c(dir, 1LL << 32);
  for (const auto& e : c.list(true)) EXPECT_TRUE(e.valid) << e.path << " is a partial entry";
  for (int i = 0; i < 7; ++i) {
    auto got = c.get(key_of(300 + i));
    if (got) {
      EXPECT_EQ(*got, big);
    }
    EXPECT_EQ(c.get_or_make(key_of(300 + i), [&] { return big; }), big);
  }
  EXPECT_EQ(c.stats().corrupt, 0);
}

// Runs `body` in a child with a private mount namespace after `setup` (mounts); 77: cannot unshare.
int in_mount_namespace(const std::function<bool()>& setup, const std::function<bool()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(77);
    if (!setup()) ::_exit(77);
    ::_exit(body() ? 0 : 1);
  }
  return wait_child(pid);
}

TEST(KernelsCache, AReadOnlyDirectoryServesItsEntriesAndTheRestFromMemory) {
  const std::string dir = temp_dir();
  { KernelsCache c(dir, 1 << 20); c.put(key_of(8), payload(8)); }
  int rc = in_mount_namespace(
      [&] {
        return ::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0 &&
               ::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
      },
      [&] {
        KernelsCache c(dir, 1 << 20);
        bool made = false;
        bool ok = c.get(key_of(8)) == payload(8);                                  // reads still work
        ok = ok && c.get_or_make(key_of(9), [] { return payload(9); }, &made) == payload(9) && made;
        ok = ok && !c.writable() && c.stats().write_failures >= 1;
        return ok;
      });
  if (rc == 77) GTEST_SKIP() << "cannot make a private mount namespace here (needs root and unshare)";
  EXPECT_EQ(rc, 0);
}

TEST(KernelsCache, AFullDirectoryLeavesTheProgramWorkingAndNoTemporaryFiles) {
  const std::string dir = temp_dir();
  int rc = in_mount_namespace(
      [&] { return ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0; },
      [&] {
        { std::ofstream fill(dir + "/fill", std::ios::binary); fill << std::string(60 << 10, 'x'); }
        KernelsCache c(dir, 1 << 20);
        bool ok = true;
        for (int i = 0; i < 3; ++i) ok = ok && c.get_or_make(key_of(20 + i), [i] { return payload(20 + i, 32 << 10); }) == payload(20 + i, 32 << 10);
        return ok && c.stats().write_failures >= 1 && count_files(dir, ".tmp.") == 0;
      });
  if (rc == 77) GTEST_SKIP() << "cannot make a private mount namespace here (needs root and unshare)";
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace fusion_jit
