// kernels_cache: the on-disk cache of compiled kernels, shared by processes (no torch, no CUDA), with an
// optional second tier on Redis shared by machines (remote_cache.h, Note [The remote tier]).
//
// Layout: DIR/v1/<first two hex digits of the key>/<key>.fjk, one framed file per entry:
//   "FJKC" | u32 format version | u32 key length | key | u64 payload length | payload | SHA-256 of all before
// written to DIR/v1/xx/<key>.tmp.<pid>.<n> and renamed into place, so a reader sees nothing or a whole
// entry, and a file another process may have read is never rewritten in place. A file that fails any
// check (magic, version, the key inside, the length, the checksum) is counted as corrupt, removed and
// treated as a miss. One producer per key across processes: get_or_make holds an flock on
// DIR/v1/xx/<key>.lock while it makes the entry (the kernel drops the lock of a killed process); the
// others wait, bounded, then load. A directory that cannot be created or written leaves the cache
// working from memory, with one warning. Entries past the size cap are evicted least recently used
// first (a hit refreshes an entry's time); readers copy entries into memory, so eviction breaks nothing.
//
// The cache holds code that is executed, and a checksum detects damage, not intent; so, like OpenSSH with
// ~/.ssh, the directory chain is checked before anything in it is read or written: DIR, DIR/v1 and the
// shard must each be a real directory (not a symbolic link, checked with lstat) owned by us (the
// effective uid) or root, and writable by neither group nor others. A directory that fails is not used:
// the cache then keeps nothing on disk (every get is a miss, put stores nothing) and says so in one
// warning that names the directory and the fix. Directories it creates are 0700. Entries are opened with
// O_NOFOLLOW | O_NONBLOCK and read only when fstat says they are regular files of ours (a FIFO or a
// symbolic link at an entry's path is a miss). clear, prune, list and verify never follow a symbolic link
// (shards are opened with O_NOFOLLOW, files lstat'ed) and remove only files named like this cache's own
// (<key>.fjk, <key>.lock, <key>.tmp.<pid>.<n>, key = 64 hex digits) in shard directories named by two hex
// digits.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels_cache/remote_cache.h"

namespace fusion_jit {

constexpr uint32_t kCacheFormatVersion = 1;

// What determines a compiled artifact. The key is SHA-256 over every field (length-prefixed) and the
// cache format version.
struct CacheKeyParts {
  std::string kind;      // "cpu-so", "cubin", ...
  std::string source;    // the canonical source
  std::string compiler;  // identity and version (and a fingerprint of the binary for host compilers)
  std::string flags;
  std::string target;    // the GPU architecture, or the host CPU's ISA
};
std::string cache_key(const CacheKeyParts& parts);

struct CacheStats {
  int64_t hits = 0, misses = 0, corrupt = 0, evictions = 0, writes = 0, write_failures = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  RemoteCacheStats remote;  // the remote tiers' (zeros without one; counts of earlier tiers included)
};

struct CacheEntryInfo {
  std::string key, path;
  int64_t bytes = 0;
  int64_t mtime = 0;  // seconds since the epoch: the last write or hit
  bool valid = true;  // verify() only
};

struct ShardFile;

class KernelsCache {
 public:
  // The process's cache: FUSION_JIT_CACHE_DIR, else $XDG_CACHE_HOME/fusion_jit, else ~/.cache/fusion_jit
  // (with none of the three set: no directory, memory only); capped at FUSION_JIT_CACHE_MAX_MB (default
  // 1024).
  static KernelsCache& instance();
  // Makes `dir` the process's cache from now on (the Python backend's cache_dir option); the counters
  // carry over.
  static void use_dir(const std::string& dir);
  // Makes `remote` the process's remote tier from now on (null: none); the counters carry over.
  static void use_remote(std::shared_ptr<RemoteCache> remote);

  // `dir` "": no directory; nothing is kept on disk. `remote`: the second tier (Note [The remote tier]),
  // or null.
  KernelsCache(std::string dir, int64_t max_bytes, std::shared_ptr<RemoteCache> remote = nullptr);
  RemoteCache* remote() const { return remote_.get(); }
  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }

  // The payload stored under `key`, or nothing (a miss; a bad file is counted, removed and a miss). A
  // local miss asks the remote tier, whose hit is written to the directory.
  std::optional<std::string> get(const std::string& key);
  // get() from the directory only (counted as get() counts).
  std::optional<std::string> get_local(const std::string& key) { return lookup(key, true); }
  // get_local() of a record that is no compiled code (the machine's calibration): checked as every entry
  // is, but not counted, so that the counters say what kernels and plans were found.
  std::optional<std::string> get_record(const std::string& key) { return lookup(key, false, false); }
  // Whether an entry is stored under `key` (a regular file at its path, in a usable shard, or a key in the
  // remote tier; not read, so not checked: get() may still find it corrupt or refuse it). Counts nothing
  // but the remote tier's time.
  bool contains(const std::string& key) const;
  // Stores the payload, in the directory and the remote tier (best effort: an I/O failure is counted and
  // warned about once, never thrown).
  void put(const std::string& key, const std::string& payload);
  // The entry for `key`, made by `make` under the key's lock when no process has it. `made` says whether
  // this call ran `make`. Errors of `make` propagate and store nothing.
  std::string get_or_make(const std::string& key, const std::function<std::string()>& make, bool* made = nullptr);

  CacheStats stats() const;
  // Entries (with `verify`, each file read and checked; bad ones are reported, not removed).
  std::vector<CacheEntryInfo> list(bool verify = false) const;
  // Removes entries, least recently used first, until the total is at most `max_bytes`, and temporary
  // files older than a minute (left by killed writers). Returns the bytes removed.
  int64_t prune(int64_t max_bytes);
  // Removes every entry, lock and temporary file.
  void clear();
  // Removes the entry for `key` (one that passed the checksum but proved unusable, e.g. a shared object
  // that dlopen refuses).
  void erase(const std::string& key);
  // False once the directory proved unwritable (the cache then only reads).
  bool writable() const;
  // Why the directory is not used (the trust check failed, or there is no directory), or "" when it is.
  std::string unusable_reason() const;

 private:
  std::string entry_path(const std::string& key) const;
  std::string shard_of(const std::string& key) const;
  // The trust check of DIR, DIR/v1 and `shard` (when not ""); the first failure is warned about once and
  // makes the cache memory only.
  bool usable(const std::string& shard) const;
  void distrust(const std::string& path, const std::string& why, const std::string& fix) const;
  // Creates `shard` (0700) after checking the chain, and checks it again.
  bool make_shard(const std::string& shard);
  // Calls fn for each file in the cache's real, trusted shards (see for_each_file).
  void scan(const std::function<void(const ShardFile&)>& fn) const;
  // get(), counting a miss only when `count_miss` (get_or_make counts one miss per made entry).
  std::optional<std::string> lookup(const std::string& key, bool count_miss, bool count_hit = true);
  bool ensure_dir(const std::string& path);
  void note_write_failure(const std::string& what);
  void maybe_evict(int64_t added);

  class RemoteLease;
  // A local miss's remote hit, written to the directory; nothing without a remote tier.
  std::optional<std::string> remote_get(const std::string& key);
  // put() to the directory only.
  void put_local(const std::string& key, const std::string& payload);

  std::string dir_, root_;
  int64_t max_bytes_;
  std::shared_ptr<RemoteCache> remote_;
  mutable std::mutex mu_;
  CacheStats stats_;
  bool writable_ = true, warned_ = false;
  mutable std::string unusable_;  // why the directory is not used; "" while it is
  int64_t estimate_ = -1;  // bytes on disk as far as this process knows (-1: not scanned yet)
};

}  // namespace fusion_jit
