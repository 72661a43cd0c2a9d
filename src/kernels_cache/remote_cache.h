// RemoteCache: the kernel cache's second tier, on Redis (hiredis), shared by the machines of a fleet.
//
// Note [The remote tier]
// KernelsCache (kernels_cache.h) looks in memory, then in its directory, then here, then compiles; what it
// compiles or stores is written here too, and a remote hit is written to the directory. Kernels and plans
// both go through it (they are KernelsCache entries).
//  - Keys: "fusion_jit:v1:<the local key>" (SHA-256 over everything the local key covers).
//  - Entries hold code that is run, and anyone who can reach the Redis can write: each is signed.
//    "FJRC" | u32 format version | u32 key length | key | u64 payload length | payload | HMAC-SHA256 of all
//    before, under a secret read from FUSION_JIT_REMOTE_CACHE_KEY_FILE (a regular file of ours, readable
//    by nobody else: checked like the cache directory). An entry whose frame, embedded key or MAC is wrong
//    is counted as refused, never returned, and overwritten by the next put of its key. Without a usable
//    key file the tier is off, with one warning that says why.
//  - Bounded in time: each connection has a connect timeout, and each operation a deadline (the operation
//    timeout, plus kMsPerMB for each MB of entry it carries) by which its reply is read whole, however
//    slowly the server trickles it (Note [Bounded replies]); after kBreakerFailures failures in a row the
//    tier is skipped (a miss, no network) for kBreakerSeconds, with one warning, then tried again. Nothing
//    fails because Redis is down or slow: a failed get is a miss, a failed put is counted. Connections come
//    from a small pool whose lock is held only to take or give one back, never across a network
//    operation. Waits on other machines' leases have a budget for the whole process (Note [Lease wait
//    budget]).
//  - Bounded in size: no reply over what its command can legitimately return is read (an entry: the
//    entry limit, Config::max_entry_bytes, which bounds the whole frame). A get asks STRLEN first and
//    refuses a larger value unread, then reads at most the limit (GETRANGE), so a value planted under an
//    entry's key costs a few bytes, not its size.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "support/options.h"

struct redisContext;
struct redisReply;

namespace fusion_jit {

struct RemoteCacheStats {
  int64_t hits = 0, misses = 0;
  int64_t refused = 0;   // entries whose frame, key or MAC was wrong
  int64_t errors = 0;    // failed connects and operations (timeouts included)
  int64_t skipped = 0;   // operations not tried while the breaker was open
  int64_t writes = 0, too_large = 0;
  int64_t leases = 0, lease_polls = 0;  // leases taken; tries that found another machine holding one
  int64_t leases_void = 0;              // leases taken over: no expiry, or one longer than a lease's
  int64_t bytes_in = 0, bytes_out = 0;
  double ms = 0;         // time spent in Redis operations, connects included
  RemoteCacheStats& operator+=(const RemoteCacheStats& o);
};

// What a ping of the tier finds (fusion-jit cache stats).
struct RemotePing {
  bool ok = false;
  std::string error;
  double latency_ms = 0;
  int64_t entries = -1;  // keys under our namespace (SCAN); -1 when not counted
};

class RemoteCache {
 public:
  static constexpr int kBreakerFailures = 3;
  // The time an operation's deadline grants per MB it sends or reads, besides the operation timeout: a
  // 64 MB entry gets 2.6 s more (a 25 MB/s link).
  static constexpr double kMsPerMB = 40;
  static constexpr const char* kNamespace = "fusion_jit:v1:";

  struct Config {
    RemoteCacheUrl url;
    std::string secret;             // the HMAC key
    int64_t ttl_s = 0;              // 0: entries do not expire
    int connect_timeout_ms = 300;
    int op_timeout_ms = 300;
    int64_t max_entry_bytes = 64 << 20;
    double breaker_seconds = 30;
    double lease_wait_budget_s = 5;  // Note [Lease wait budget]
  };

  // The tier the options ask for: null when FUSION_JIT_REMOTE_CACHE is unset, or when the key file is
  // missing or not trusted (one warning naming it and the fix).
  static std::unique_ptr<RemoteCache> from_options(const Options& o);
  // The secret in `path`, or nothing with *why set: not a regular file of ours, readable or writable by
  // group or others, empty, or over 4096 bytes.
  static std::optional<std::string> read_key_file(const std::string& path, std::string* why);

  explicit RemoteCache(Config config);
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  // The payload stored under `key`, or nothing (a miss, a refused entry, an error, an open breaker);
  // `count_miss` false: a miss is not counted (polls while another machine compiles).
  std::optional<std::string> get(const std::string& key, bool count_miss = true);
  // Whether Redis holds an entry under `key` (EXISTS; not read, so not checked); false when it cannot say.
  bool contains(const std::string& key);
  // Stores `payload` under `key` (best effort: failures are counted, never thrown); whether it was stored.
  bool put(const std::string& key, const std::string& payload);
  // Note [One compile per key across the fleet]: a lease on `key` (SET NX with a TTL of `ttl_ms`) held by
  // `token`. A lease found without an expiry, or with one over `ttl_ms`, is void (planted, or left by a
  // PERSIST): it is taken over, atomically, as if it were free.
  enum class Lease { kAcquired, kHeld, kUnavailable };
  Lease try_lease(const std::string& key, const std::string& token, int64_t ttl_ms);
  // Note [Lease wait budget]: sleeps `d` (at most what is left of the process's budget) between polls
  // of a lease another machine holds, first charging the budget with the time since `*since` (the polls
  // themselves); false, without sleeping, once the budget is spent: then the caller makes the entry.
  // Sets *since to now.
  bool wait_on_lease(std::chrono::milliseconds d, std::chrono::steady_clock::time_point* since);
  // Releases the lease if `token` still holds it.
  void release_lease(const std::string& key, const std::string& token);
  RemoteCacheStats stats() const;
  // "redis://host:port/db" or "unix:///path" (no password).
  std::string address() const;
  RemotePing ping();

  // The signed frame of an entry and its check (for tests and tools).
  static std::string frame(const std::string& secret, const std::string& key, const std::string& payload);
  static std::optional<std::string> unframe(const std::string& secret, const std::string& key, const std::string& f);

 private:
  struct Conn;
  using ReplyPtr = std::unique_ptr<redisReply, void (*)(void*)>;
  // `cmd` on a pooled connection (one more try on a new one when a pooled one proves dead); null when no
  // connection could run it, or its reply would exceed `max_reply` bytes of protocol (Note [Bounded
  // replies]); `reply_bytes`: the size of reply it may take, for its deadline. Failures (an error reply
  // included) feed the breaker.
  ReplyPtr run(const std::vector<std::string>& cmd, size_t max_reply = kSmallReply, int64_t reply_bytes = 0);
  static constexpr size_t kSmallReply = 64 << 10;  // all replies but an entry's and SCAN's
  // An operation's deadline from now: the operation timeout, plus kMsPerMB for each MB of `bytes` it moves.
  std::chrono::steady_clock::time_point deadline(int64_t bytes) const;
  // A connection (pooled or new), or null (counted as an error, or skipped while the breaker is open).
  std::unique_ptr<Conn> take();
  void give_back(std::unique_ptr<Conn> c);
  void failed(const std::string& what);
  void succeeded();
  void add_ms(std::chrono::steady_clock::time_point t0);

  const Config config_;
  mutable std::mutex mu_;  // guards what follows; never held across a network operation
  RemoteCacheStats stats_;
  std::vector<std::unique_ptr<Conn>> idle_;
  int failures_ = 0;
  std::chrono::steady_clock::time_point open_until_{};
  bool warned_refused_ = false, warned_large_ = false, warned_void_lease_ = false, warned_lease_budget_ = false;
  double lease_waited_s_ = 0;  // Note [Lease wait budget]
};

}  // namespace fusion_jit
