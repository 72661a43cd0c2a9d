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

struct ShardFile {
  int shard_fd;            // the shard directory, open: act on the file with *at(shard_fd, name, ...)
  std::string shard_name;  // two hex digits
  std::string shard_path, name;
  struct stat st;          // lstat of the file
};

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

// Whether a file or directory at `st` may hold code we load (OpenSSH's rule for ~/.ssh): owned by us or
// root, writable by nobody else. "" when it may, else why not.
std::string ownership_problem(const struct stat& st) {
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return fmt::format("is owned by uid {}, not by uid {} (us) or root", st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return fmt::format("is group- or world-writable (mode {:04o})", st.st_mode & 07777);
  return "";
}

// A whole entry file `name` (relative to `dir_fd`, or a path with AT_FDCWD), or nothing. Never follows a
// symbolic link, never blocks on a FIFO or device, and reads only a regular file that ownership_problem
// accepts.
std::optional<std::string> read_entry(int dir_fd, const char* name, struct stat* st) {
  int fd = ::openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> data;
  if (::fstat(fd, st) == 0 && S_ISREG(st->st_mode) && ownership_problem(*st).empty()) {
    data.emplace(static_cast<size_t>(st->st_size), '\0');
    size_t got = 0;
    while (got < data->size()) {
      ssize_t n = ::read(fd, data->data() + got, data->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    data->resize(got);
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

bool is_hex(const std::string& s, size_t from, size_t n) {
  if (s.size() < from + n) return false;
  for (size_t i = from; i < from + n; ++i)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

bool is_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

constexpr size_t kKeyChars = 64;

// The file names this cache writes in shard `shard`: <key>.fjk, <key>.lock, <key>.tmp.<pid>.<n>, with a
// key of 64 lower-case hex digits whose first two are the shard's name. Nothing else is ever removed.
enum class FileKind { kForeign, kEntry, kLock, kTemp };
FileKind file_kind(const std::string& shard, const std::string& name) {
  if (!is_hex(name, 0, kKeyChars) || name.compare(0, 2, shard) != 0) return FileKind::kForeign;
  const std::string rest = name.substr(kKeyChars);
  if (rest == ".fjk") return FileKind::kEntry;
  if (rest == ".lock") return FileKind::kLock;
  if (rest.rfind(".tmp.", 0) == 0) {
    size_t dot = rest.find('.', 5);
    if (dot != std::string::npos && is_digits(rest, 5, dot) && is_digits(rest, dot + 1, rest.size())) return FileKind::kTemp;
  }
  return FileKind::kForeign;
}

bool is_shard_name(const std::string& name) { return name.size() == 2 && is_hex(name, 0, 2); }

// Calls fn for each file in each shard of `root`, never following a symbolic link: the root and each
// shard are opened with O_NOFOLLOW, files are lstat'ed. Only directories named by two hex digits are
// shards; a shard that is a symbolic link, or that ownership_problem rejects, is skipped and passed to
// `bad` with the reason.
void for_each_file(const std::string& root, const std::function<void(const ShardFile&)>& fn,
                   const std::function<void(const std::string&, const std::string&)>& bad) {
  int root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root_fd < 0) return;
  DIR* r = ::fdopendir(root_fd);
  if (!r) {
    ::close(root_fd);
    return;
  }
  while (dirent* s = ::readdir(r)) {
    const std::string name = s->d_name;
    if (!is_shard_name(name)) continue;
    const std::string shard = root + "/" + name;
    int fd = ::openat(root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      struct stat lst{};
      if (::fstatat(root_fd, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
        bad(shard, "is a symbolic link");
      continue;
    }
    struct stat dst{};
    std::string why = ::fstat(fd, &dst) == 0 ? ownership_problem(dst) : std::string("cannot be checked");
    DIR* d = why.empty() ? ::fdopendir(fd) : nullptr;
    if (!d) {
      if (!why.empty()) bad(shard, why);
      ::close(fd);
      continue;
    }
    while (dirent* e = ::readdir(d)) {
      ShardFile f{fd, name, shard, e->d_name, {}};
      if (f.name == "." || f.name == "..") continue;
      if (::fstatat(fd, e->d_name, &f.st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      fn(f);
    }
    ::closedir(d);  // closes fd
  }
  ::closedir(r);
}

// The default directory, or "" when there is none we may use: without FUSION_JIT_CACHE_DIR,
// XDG_CACHE_HOME and HOME there is no directory of ours to put it in (a fixed path under /tmp could be
// made first by another user), so the cache is kept in memory.
std::string default_dir() {
  const Options& o = Options::get();
  if (!o.cache_dir.empty()) return o.cache_dir;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/fusion_jit";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/fusion_jit";
  return "";
}

// `dir` without trailing slashes (lstat of "link/" would follow the link).
std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
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
  if (!g_instance)
    g_instance = new KernelsCache(default_dir(), Options::get().cache_max_mb << 20,
                                  std::shared_ptr<RemoteCache>(RemoteCache::from_options(Options::get())));
  return *g_instance;
}

void KernelsCache::use_dir(const std::string& dir) {
  FJ_CHECK(!dir.empty(), "the kernel cache directory must not be empty");
  KernelsCache& old = instance();
  if (old.dir() == dir) return;
  auto* next = new KernelsCache(dir, old.max_bytes(), old.remote_);
  next->stats_ = old.stats();
  {
    // The tier carries over with its own counts: only the earlier tiers' go into the base.
    std::lock_guard<std::mutex> g(old.mu_);
    next->stats_.remote = old.stats_.remote;
  }
  std::lock_guard<std::mutex> g(g_instance_mu);
  g_instance = next;  // the previous instance stays alive: callers may hold a reference to it
}

void KernelsCache::use_remote(std::shared_ptr<RemoteCache> remote) {
  KernelsCache& old = instance();
  auto* next = new KernelsCache(old.dir(), old.max_bytes(), std::move(remote));
  next->stats_ = old.stats();
  std::lock_guard<std::mutex> g(g_instance_mu);
  g_instance = next;  // the previous instance stays alive: callers may hold a reference to it
}

KernelsCache::KernelsCache(std::string dir, int64_t max_bytes, std::shared_ptr<RemoteCache> remote)
    : dir_(strip_slashes(std::move(dir))),
      root_(dir_.empty() ? "" : dir_ + "/v" + std::to_string(kCacheFormatVersion)),
      max_bytes_(max_bytes), remote_(std::move(remote)) {}

std::string KernelsCache::entry_path(const std::string& key) const {
  return root_ + "/" + key.substr(0, 2) + "/" + key + ".fjk";
}

void KernelsCache::distrust(const std::string& path, const std::string& why, const std::string& fix) const {
  std::lock_guard<std::mutex> g(mu_);
  if (!unusable_.empty()) return;
  unusable_ = path.empty() ? why : path + " " + why;
  log_warn("kernel cache: {}; {}compiled kernels are kept in memory only (fix: {})", unusable_,
           path.empty() ? "" : "it is not used, ", fix);
}

bool KernelsCache::usable(const std::string& shard) const {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!unusable_.empty()) return false;
  }
  if (dir_.empty()) {
    distrust("", "no directory: none of FUSION_JIT_CACHE_DIR, XDG_CACHE_HOME and HOME is set",
             "set FUSION_JIT_CACHE_DIR to a directory of your own to keep them on disk");
    return false;
  }
  // From the root down; a component that does not exist ends the chain (nothing below it exists).
  for (const std::string* path : {&dir_, &root_, &shard}) {
    if (path->empty()) break;
    struct stat st{};
    if (::lstat(path->c_str(), &st) != 0) {
      if (errno == ENOENT) break;
      distrust(*path, std::string("cannot be checked (") + std::strerror(errno) + ")",
               "make it readable, or set FUSION_JIT_CACHE_DIR to another directory");
      return false;
    }
    if (S_ISLNK(st.st_mode)) {
      distrust(*path, "is a symbolic link",
               path == &dir_ ? "set FUSION_JIT_CACHE_DIR to the directory it points to, if that is yours"
                             : "remove it with rm " + *path + "; it is made again as a directory");
      return false;
    }
    if (!S_ISDIR(st.st_mode)) {
      distrust(*path, "is not a directory", "remove it, or set FUSION_JIT_CACHE_DIR to another directory");
      return false;
    }
    std::string why = ownership_problem(st);
    if (!why.empty()) {
      distrust(*path, why,
               st.st_uid != ::geteuid() && st.st_uid != 0
                   ? fmt::format("chown {} {}, or set FUSION_JIT_CACHE_DIR to a directory of your own",
                                 ::geteuid(), *path)
                   : "chmod go-w " + *path);
      return false;
    }
  }
  return true;
}

std::string KernelsCache::unusable_reason() const {
  usable("");
  std::lock_guard<std::mutex> g(mu_);
  return unusable_;
}

bool KernelsCache::ensure_dir(const std::string& path) {
  // mkdir -p, each new level 0700: the cache holds code that will be executed.
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string part = path.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
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

std::optional<std::string> KernelsCache::get(const std::string& key) {
  if (auto p = lookup(key, true)) return p;
  return remote_get(key);
}

std::optional<std::string> KernelsCache::remote_get(const std::string& key) {
  if (!remote_) return std::nullopt;
  auto p = remote_->get(key);
  if (p) put_local(key, *p);
  return p;
}

std::string KernelsCache::shard_of(const std::string& key) const { return root_ + "/" + key.substr(0, 2); }

bool KernelsCache::contains(const std::string& key) const {
  struct stat st{};
  if (!root_.empty() && usable(shard_of(key)) && ::lstat(entry_path(key).c_str(), &st) == 0 && S_ISREG(st.st_mode))
    return true;
  return remote_ && remote_->contains(key);
}

std::optional<std::string> KernelsCache::lookup(const std::string& key, bool count_miss, bool count_hit) {
  std::optional<std::string> data, payload;
  struct stat st{};
  const std::string path = usable(shard_of(key)) ? entry_path(key) : "";
  if (!path.empty()) data = read_entry(AT_FDCWD, path.c_str(), &st);
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
    if (::lstat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) ::unlink(path.c_str());
    log_warn("kernel cache: {} is corrupt or foreign; removed, it will be rebuilt", path);
    return std::nullopt;
  }
  if (count_hit) {
    stats_.hits++;
    stats_.bytes_read += static_cast<int64_t>(data->size());
  }
  // Least recently used: a hit refreshes the time.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  return payload;
}

bool KernelsCache::make_shard(const std::string& shard) {
  // Checked before creating anything (never mkdir through a symbolic link) and again after.
  if (!usable(shard)) return false;
  if (!ensure_dir(shard)) {
    note_write_failure("cannot create " + shard);
    return false;
  }
  return usable(shard);
}

void KernelsCache::put(const std::string& key, const std::string& payload) {
  put_local(key, payload);
  if (remote_) remote_->put(key, payload);
}

void KernelsCache::put_local(const std::string& key, const std::string& payload) {
  if (!writable()) return;
  const std::string shard = shard_of(key);
  if (!make_shard(shard)) return;
  const std::string path = entry_path(key);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path.substr(0, path.size() - 4), ::getpid(), counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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

void KernelsCache::erase(const std::string& key) {
  if (!usable(shard_of(key))) return;
  const std::string path = entry_path(key);
  if (::unlink(path.c_str()) == 0) {
    std::lock_guard<std::mutex> g(mu_);
    estimate_ = -1;  // rescanned at the next put
  }
}

// Note [One compile per key across the fleet]
// Before a process makes an entry the remote tier misses, it takes a lease on the key in Redis (SET NX
// with a TTL of kLeaseSeconds): the machines that find it held poll the tier for the entry instead of
// compiling, while their process's budget for such waits lasts (a few seconds for all keys together,
// Note [Lease wait budget] in remote_cache.cpp: a crashed holder or a planted lease must not stall every
// cold process for the lease time), then compile themselves. The holder looks in the tier once more
// after taking it (another may have stored the entry and released its lease since this process missed)
// and releases it once the entry is stored, or when making it fails (the destructor). Without a tier, or
// when Redis fails, nothing waits.
class KernelsCache::RemoteLease {
 public:
  static constexpr int64_t kLeaseSeconds = 120;
  RemoteLease(RemoteCache* remote, const std::string& key) : remote_(remote), key_(key) {}
  ~RemoteLease() {
    if (held_) remote_->release_lease(key_, token_);
  }
  // The entry, when another machine stored it meanwhile; nothing when this process is to make it.
  std::optional<std::string> wait() {
    if (!remote_) return std::nullopt;
    static std::atomic<uint64_t> counter{0};
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    token_ = fmt::format("{}:{}:{}", host, ::getpid(), counter++);
    auto since = std::chrono::steady_clock::now();
    auto sleep_ms = std::chrono::milliseconds(20);
    while (true) {
      const RemoteCache::Lease l = remote_->try_lease(key_, token_, kLeaseSeconds * 1000);
      if (l == RemoteCache::Lease::kUnavailable) return std::nullopt;
      if (l == RemoteCache::Lease::kAcquired) {
        held_ = true;
        return remote_->get(key_, /*count_miss=*/false);
      }
      if (auto p = remote_->get(key_, /*count_miss=*/false)) return p;
      if (!remote_->wait_on_lease(sleep_ms, &since)) return std::nullopt;  // the budget is spent: make it here
      sleep_ms = std::min(sleep_ms * 2, std::chrono::milliseconds(200));
    }
  }

 private:
  RemoteCache* remote_;
  std::string key_, token_;
  bool held_ = false;
};

std::string KernelsCache::get_or_make(const std::string& key, const std::function<std::string()>& make, bool* made) {
  if (made) *made = false;
  if (auto p = lookup(key, false)) return *p;
  // The remote tier is asked before the key's lock is taken: it never holds a lock other callers need.
  if (auto p = remote_get(key)) return *p;
  // One producer per key: the key's lock, held while making; waiters poll it, then read the entry.
  const std::string path = entry_path(key);
  const std::string lock_path = path.substr(0, path.size() - 4) + ".lock";
  int fd = -1;
  if (writable() && make_shard(shard_of(key))) {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    struct stat st{};
    if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
      log_warn("kernel cache: {} is not a regular file; compiling without the lock", lock_path);
      ::close(fd);
      fd = -1;
    }
  }
  if (fd >= 0) {
    auto t0 = std::chrono::steady_clock::now();
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        // Not "held by another process": a file system without locks, say. Without the lock processes
        // could not share entries safely: from now on this cache works from memory only.
        const int err = errno;
        ::close(fd);
        fd = -1;
        std::lock_guard<std::mutex> g(mu_);
        writable_ = false;
        if (!warned_) {
          warned_ = true;
          log_warn("kernel cache {}: cannot lock {} ({}); compiled kernels are kept in memory only", dir_, lock_path,
                   std::strerror(err));
        }
        break;
      }
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
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
      }
    }
  } unlock{fd};
  RemoteLease lease(remote_.get(), key);
  if (auto p = lease.wait()) {
    put_local(key, *p);
    return *p;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.misses++;
  }
  std::string payload = make();
  if (made) *made = true;
  put(key, payload);
  return payload;
}

CacheStats KernelsCache::stats() const {
  CacheStats s;
  {
    std::lock_guard<std::mutex> g(mu_);
    s = stats_;
  }
  if (remote_) s.remote += remote_->stats();
  return s;
}

void KernelsCache::scan(const std::function<void(const ShardFile&)>& fn) const {
  if (!usable("")) return;
  for_each_file(
      root_, fn,
      [&](const std::string& shard, const std::string& why) {
        distrust(shard, why,
                 why == "is a symbolic link" || why == "cannot be checked"
                     ? "remove it with rm " + shard + "; it is made again as a directory"
                     : "chmod go-w " + shard + ", and chown it to uid " + std::to_string(::geteuid()));
      });
}

std::vector<CacheEntryInfo> KernelsCache::list(bool verify) const {
  std::vector<CacheEntryInfo> out;
  scan([&](const ShardFile& f) {
    if (!S_ISREG(f.st.st_mode) || file_kind(f.shard_name, f.name) != FileKind::kEntry) return;
    CacheEntryInfo e;
    e.key = f.name.substr(0, kKeyChars);
    e.path = f.shard_path + "/" + f.name;
    e.bytes = f.st.st_size;
    e.mtime = f.st.st_mtime;
    if (verify) {
      struct stat st{};
      auto data = read_entry(f.shard_fd, f.name.c_str(), &st);
      e.valid = data && unframe(*data, e.key).has_value();
    }
    out.push_back(std::move(e));
  });
  // A shard that failed the check makes the whole cache unused: list nothing, as get() finds nothing.
  if (!unusable_reason().empty()) return {};
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
  scan([&](const ShardFile& f) {
    if (S_ISREG(f.st.st_mode) && file_kind(f.shard_name, f.name) == FileKind::kTemp && now - f.st.st_mtime > 60)
      ::unlinkat(f.shard_fd, f.name.c_str(), 0);
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
  scan([&](const ShardFile& f) {
    if (S_ISDIR(f.st.st_mode) || file_kind(f.shard_name, f.name) == FileKind::kForeign) return;
    ::unlinkat(f.shard_fd, f.name.c_str(), 0);
    if (shards.empty() || shards.back() != f.shard_path) shards.push_back(f.shard_path);
  });
  for (const auto& s : shards) ::rmdir(s.c_str());  // only when empty: a foreign file keeps its shard
  std::lock_guard<std::mutex> g(mu_);
  estimate_ = 0;
}

}  // namespace fusion_jit
