#include "kernels_cache/kernels_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

constexpr char kMagic[4] = {'F', 'J', 'K', 'C'};
constexpr size_t kDigest = 32;
constexpr double kLockWaitSeconds = 300;  // then make it without the lock

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string frame(const std::string& key, const std::string& payload) {
  std::string f(kMagic, 4);
  put_u32(f, kCacheFormatVersion);
  put_u32(f, static_cast<uint32_t>(key.size()));
  f += key;
  put_u64(f, payload.size());
  f += payload;
  f += sha256_bytes(f);
  return f;
}

// The payload of a framed file for `key`, or nothing when any check fails.
std::optional<std::string> unframe(const std::string& f, const std::string& key) {
  size_t head = 4 + 4 + 4 + key.size() + 8;
  if (f.size() < head + kDigest || std::memcmp(f.data(), kMagic, 4) != 0) return std::nullopt;
  uint32_t version, key_len;
  uint64_t len;
  std::memcpy(&version, f.data() + 4, 4);
  std::memcpy(&key_len, f.data() + 8, 4);
  if (version != kCacheFormatVersion || key_len != key.size() || f.compare(12, key.size(), key) != 0) return std::nullopt;
  std::memcpy(&len, f.data() + 12 + key.size(), 8);
  if (len != f.size() - head - kDigest) return std::nullopt;
  if (sha256_bytes(f.substr(0, f.size() - kDigest)) != f.substr(f.size() - kDigest)) return std::nullopt;
  return f.substr(head, len);
}

// The whole file, or nothing (errno tells why).
std::optional<std::string> read_file(const std::string& path, struct stat* st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string data;
  if (::fstat(fd, st) == 0) {
    data.resize(static_cast<size_t>(st->st_size));
    size_t got = 0;
    while (got < data.size()) {
      ssize_t n = ::read(fd, data.data() + got, data.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
  }
  ::close(fd);
  return data;
}

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Calls fn(shard_dir, file_name) for each file in each shard of `root`.
void for_each_file(const std::string& root, const std::function<void(const std::string&, const std::string&)>& fn) {
  DIR* r = ::opendir(root.c_str());
  if (!r) return;
  while (dirent* s = ::readdir(r)) {
    if (s->d_name[0] == '.') continue;
    std::string shard = root + "/" + s->d_name;
    DIR* d = ::opendir(shard.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') fn(shard, e->d_name);
    ::closedir(d);
  }
  ::closedir(r);
}

std::string default_dir() {
  const Options& o = Options::get();
  if (!o.cache_dir.empty()) return o.cache_dir;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/fusion_jit";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/fusion_jit";
}

}  // namespace

std::string cache_key(const CacheKeyParts& p) {
  std::string text = "fusion_jit kernels_cache v" + std::to_string(kCacheFormatVersion) + "\n";
  for (const std::string* f : {&p.kind, &p.source, &p.compiler, &p.flags, &p.target})
    text += std::to_string(f->size()) + ":" + *f + "\n";
  return sha256_hex(text);
}

namespace {
std::mutex g_instance_mu;
KernelsCache* g_instance = nullptr;
}  // namespace

KernelsCache& KernelsCache::instance() {
  std::lock_guard<std::mutex> g(g_instance_mu);
  if (!g_instance) g_instance = new KernelsCache(default_dir(), Options::get().cache_max_mb << 20);
  return *g_instance;
}

void KernelsCache::use_dir(const std::string& dir) {
  FJ_CHECK(!dir.empty(), "the kernel cache directory must not be empty");
  KernelsCache& old = instance();
  if (old.dir() == dir) return;
  auto* next = new KernelsCache(dir, old.max_bytes());
  next->stats_ = old.stats();
  std::lock_guard<std::mutex> g(g_instance_mu);
  g_instance = next;  // the previous instance stays alive: callers may hold a reference to it
}

KernelsCache::KernelsCache(std::string dir, int64_t max_bytes)
    : dir_(std::move(dir)), root_(dir_ + "/v" + std::to_string(kCacheFormatVersion)), max_bytes_(max_bytes) {}

std::string KernelsCache::entry_path(const std::string& key) const {
  return root_ + "/" + key.substr(0, 2) + "/" + key + ".fjk";
}

bool KernelsCache::ensure_dir(const std::string& path) {
  // mkdir -p, each new level 0700: the cache holds code that will be executed.
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string part = path.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void KernelsCache::note_write_failure(const std::string& what) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.write_failures++;
  if (errno == EROFS || errno == EACCES || errno == EPERM) writable_ = false;
  if (!warned_) {
    warned_ = true;
    log_warn("kernel cache {}: {} ({}); compiled kernels are kept in memory only", dir_, what, std::strerror(errno));
  }
}

bool KernelsCache::writable() const {
  std::lock_guard<std::mutex> g(mu_);
  return writable_;
}

std::optional<std::string> KernelsCache::get(const std::string& key) { return lookup(key, true); }

std::optional<std::string> KernelsCache::lookup(const std::string& key, bool count_miss) {
  const std::string path = entry_path(key);
  struct stat st{};
  auto data = read_file(path, &st);
  std::optional<std::string> payload;
  if (data) payload = unframe(*data, key);
  std::lock_guard<std::mutex> g(mu_);
  if (!data) {
    stats_.misses += count_miss;
    return std::nullopt;
  }
  if (!payload) {
    stats_.corrupt++;
    stats_.misses += count_miss;
    // Remove it unless another process has renamed a new entry into place meanwhile.
    struct stat now{};
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino) ::unlink(path.c_str());
    log_warn("kernel cache: {} is corrupt or foreign; removed, it will be rebuilt", path);
    return std::nullopt;
  }
  stats_.hits++;
  stats_.bytes_read += static_cast<int64_t>(data->size());
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // least recently used: a hit refreshes the time
  return payload;
}

void KernelsCache::put(const std::string& key, const std::string& payload) {
  if (!writable()) return;
  const std::string path = entry_path(key);
  const std::string shard = path.substr(0, path.rfind('/'));
  if (!ensure_dir(shard)) return note_write_failure("cannot create " + shard);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path.substr(0, path.size() - 4), ::getpid(), counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return note_write_failure("cannot write " + tmp);
  const std::string f = frame(key, payload);
  bool ok = write_all(fd, f);
  int saved = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    return note_write_failure("cannot write " + path);
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.writes++;
    stats_.bytes_written += static_cast<int64_t>(f.size());
  }
  maybe_evict(static_cast<int64_t>(f.size()));
}

std::string KernelsCache::get_or_make(const std::string& key, const std::function<std::string()>& make, bool* made) {
  if (made) *made = false;
  if (auto p = lookup(key, false)) return *p;
  // One producer per key: the key's lock, held while making; waiters poll it, then read the entry.
  const std::string path = entry_path(key);
  const std::string lock_path = path.substr(0, path.size() - 4) + ".lock";
  int fd = -1;
  if (writable() && ensure_dir(path.substr(0, path.rfind('/'))))
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    auto t0 = std::chrono::steady_clock::now();
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kLockWaitSeconds) {
        log_warn("kernel cache: {} held for over {:.0f} s; compiling without it", lock_path, kLockWaitSeconds);
        ::close(fd);
        fd = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Another process may have made it between the first look and the lock (or failed: then this one
    // makes it).
    if (fd >= 0) {
      if (auto p = lookup(key, false)) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
        return *p;
      }
    }
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.misses++;
  }
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
      }
    }
  } unlock{fd};
  std::string payload = make();
  if (made) *made = true;
  put(key, payload);
  return payload;
}

CacheStats KernelsCache::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

std::vector<CacheEntryInfo> KernelsCache::list(bool verify) const {
  std::vector<CacheEntryInfo> out;
  for_each_file(root_, [&](const std::string& shard, const std::string& name) {
    if (!ends_with(name, ".fjk")) return;
    CacheEntryInfo e;
    e.key = name.substr(0, name.size() - 4);
    e.path = shard + "/" + name;
    struct stat st{};
    if (::stat(e.path.c_str(), &st) != 0) return;
    e.bytes = st.st_size;
    e.mtime = st.st_mtime;
    if (verify) {
      auto data = read_file(e.path, &st);
      e.valid = data && unframe(*data, e.key).has_value();
    }
    out.push_back(std::move(e));
  });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

int64_t KernelsCache::prune(int64_t max_bytes) {
  auto entries = list();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.mtime < b.mtime; });
  int64_t total = 0, removed = 0, evicted = 0;
  for (const auto& e : entries) total += e.bytes;
  for (const auto& e : entries) {
    if (total <= max_bytes) break;
    if (::unlink(e.path.c_str()) == 0) {
      total -= e.bytes;
      removed += e.bytes;
      evicted++;
    }
  }
  // Temporary files of writers that were killed.
  const time_t now = ::time(nullptr);
  for_each_file(root_, [&](const std::string& shard, const std::string& name) {
    struct stat st{};
    std::string p = shard + "/" + name;
    if (name.find(".tmp.") != std::string::npos && ::stat(p.c_str(), &st) == 0 && now - st.st_mtime > 60)
      ::unlink(p.c_str());
  });
  std::lock_guard<std::mutex> g(mu_);
  stats_.evictions += evicted;
  estimate_ = total;
  return removed;
}

void KernelsCache::maybe_evict(int64_t added) {
  bool over;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (estimate_ >= 0) estimate_ += added;
    over = estimate_ < 0 || estimate_ > max_bytes_;
  }
  if (!over) return;
  int64_t total = 0;
  for (const auto& e : list()) total += e.bytes;
  {
    std::lock_guard<std::mutex> g(mu_);
    estimate_ = total;
  }
  if (total > max_bytes_) prune(max_bytes_ - max_bytes_ / 10);  // down to 90%: not at every put
}

void KernelsCache::clear() {
  std::vector<std::string> shards;
  for_each_file(root_, [&](const std::string& shard, const std::string& name) {
    ::unlink((shard + "/" + name).c_str());
    if (shards.empty() || shards.back() != shard) shards.push_back(shard);
  });
  for (const auto& s : shards) ::rmdir(s.c_str());
  std::lock_guard<std::mutex> g(mu_);
  estimate_ = 0;
}

}  // namespace fusion_jit
