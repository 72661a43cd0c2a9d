#include "kernels_cache/remote_cache.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"

namespace fusion_jit {

namespace {

constexpr char kMagic[4] = {'F', 'J', 'R', 'C'};
constexpr uint32_t kFrameVersion = 1;
constexpr size_t kMac = 32;

timeval to_timeval(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

// "redis://host:port/db" or "unix:///path" (no password).
std::string address_of(const RemoteCacheUrl& u) {
  if (u.unix_socket) return u.db ? fmt::format("unix://{}?db={}", u.host, u.db) : "unix://" + u.host;
  return fmt::format("redis://{}:{}/{}", u.host, u.port, u.db);
}

}  // namespace

// Note [Bounded replies]
// hiredis's blocking calls time out per read (SO_RCVTIMEO) and read a reply of any size: a server that
// trickles its reply a byte at a time, or answers with a gigabyte, holds a call and its memory for as long as it
// likes. So a command is sent with hiredis's buffer calls and its reply read here: poll() waits for what
// is left of the operation's deadline, and the bytes received are counted after each read against the
// most the command may return (an entry's frame and its protocol header for GETRANGE, kSmallReply for
// the rest). A command that runs out of either is abandoned, its connection closed (a reply may be
// pending on it), and counted as a failure: not retried, since a new connection would wait as long.
// Values planted under entry keys never get this far: get() asks STRLEN first (Note [The remote tier]).
struct RemoteCache::Conn {
  redisContext* ctx = nullptr;
  bool reused = false;
  bool abandoned = false;  // the last command ran past its deadline or its size bound
  std::string why;         // ...and why
  ~Conn() {
    if (ctx) redisFree(ctx);
  }
  // A command given as binary-safe arguments; null with error() when it failed, or was abandoned.
  redisReply* command(const std::vector<std::string>& args, size_t max_reply,
                      std::chrono::steady_clock::time_point deadline) {
    why.clear();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx, static_cast<int>(args.size()), argv.data(), lens.data()) != REDIS_OK) return nullptr;
    // The request: a blocking write, each one bounded by the socket's timeout (redisSetTimeout).
    for (int done = 0; !done;) {
      if (redisBufferWrite(ctx, &done) != REDIS_OK) return nullptr;
      if (!done && std::chrono::steady_clock::now() >= deadline) return abandon("timed out sending");
    }
    size_t received = 0;
    while (true) {
      void* reply = nullptr;
      if (redisGetReplyFromReader(ctx, &reply) != REDIS_OK) return nullptr;
      if (reply) return static_cast<redisReply*>(reply);
      if (received > max_reply) return abandon(fmt::format("its reply is over {} bytes", max_reply));
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return abandon("timed out");
      pollfd p{ctx->fd, POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return abandon(fmt::format("poll: {}", std::strerror(errno)));
      if (n == 0) return abandon("timed out");
      const size_t before = ctx->reader->len;
      if (redisBufferRead(ctx) != REDIS_OK) return nullptr;
      // The reader's buffer only grows in a read (hiredis trims it when parsing, or frees it when empty).
      received += ctx->reader->len >= before ? ctx->reader->len - before : ctx->reader->len;
    }
  }
  std::string error() const {
    if (!why.empty()) return why;
    return ctx && ctx->err ? ctx->errstr : "no reply";
  }

 private:
  redisReply* abandon(std::string what) {
    why = std::move(what);
    abandoned = true;
    return nullptr;
  }
};

RemoteCacheStats& RemoteCacheStats::operator+=(const RemoteCacheStats& o) {
  hits += o.hits;
  misses += o.misses;
  refused += o.refused;
  errors += o.errors;
  skipped += o.skipped;
  writes += o.writes;
  too_large += o.too_large;
  leases += o.leases;
  leases_void += o.leases_void;
  lease_polls += o.lease_polls;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  ms += o.ms;
  return *this;
}

std::string RemoteCache::frame(const std::string& secret, const std::string& key, const std::string& payload) {
  std::string f(kMagic, 4);
  auto put32 = [&](uint32_t v) { f.append(reinterpret_cast<const char*>(&v), 4); };
  put32(kFrameVersion);
  put32(static_cast<uint32_t>(key.size()));
  f += key;
  const uint64_t n = payload.size();
  f.append(reinterpret_cast<const char*>(&n), 8);
  f += payload;
  f += hmac_sha256(secret, f);
  return f;
}

std::optional<std::string> RemoteCache::unframe(const std::string& secret, const std::string& key,
                                                const std::string& f) {
  const size_t head = 4 + 4 + 4 + key.size() + 8;
  if (f.size() < head + kMac || std::memcmp(f.data(), kMagic, 4) != 0) return std::nullopt;
  uint32_t version = 0, key_len = 0;
  uint64_t len = 0;
  std::memcpy(&version, f.data() + 4, 4);
  std::memcpy(&key_len, f.data() + 8, 4);
  if (version != kFrameVersion || key_len != key.size() || f.compare(12, key.size(), key) != 0) return std::nullopt;
  std::memcpy(&len, f.data() + 12 + key.size(), 8);
  if (len != f.size() - head - kMac) return std::nullopt;
  const std::string_view signed_part(f.data(), f.size() - kMac);
  if (!equal_in_constant_time(hmac_sha256(secret, signed_part), std::string_view(f).substr(f.size() - kMac)))
    return std::nullopt;
  return f.substr(head, len);
}

std::optional<std::string> RemoteCache::read_key_file(const std::string& path, std::string* why) {
  return fusion_jit::read_key_file(path, why);  // support/hash.h: the one key-file check, shared with packages
}

std::unique_ptr<RemoteCache> RemoteCache::from_options(const Options& o) {
  if (o.remote_cache.text.empty()) return nullptr;
  Config c;
  c.url = o.remote_cache;
  const std::string addr = address_of(c.url);
  if (o.remote_cache_key_file.empty()) {
    log_warn("remote cache {}: FUSION_JIT_REMOTE_CACHE_KEY_FILE is not set, so the remote tier is off (its entries "
             "are code, signed with that key: create one with `openssl rand -hex 32 > FILE; chmod 600 FILE` and "
             "give every machine the same)", addr);
    return nullptr;
  }
  std::string why;
  auto secret = read_key_file(o.remote_cache_key_file, &why);
  if (!secret) {
    log_warn("remote cache {}: the key file {} is not used: {}; the remote tier is off", addr,
             o.remote_cache_key_file, why);
    return nullptr;
  }
  c.secret = *secret;
  c.ttl_s = o.remote_cache_ttl;
  c.connect_timeout_ms = c.op_timeout_ms = o.remote_cache_timeout_ms;
  c.max_entry_bytes = o.remote_cache_max_mb << 20;
  return std::make_unique<RemoteCache>(std::move(c));
}

RemoteCache::RemoteCache(Config config) : config_(std::move(config)) {}
RemoteCache::~RemoteCache() = default;

std::string RemoteCache::address() const { return address_of(config_.url); }

RemoteCacheStats RemoteCache::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void RemoteCache::add_ms(std::chrono::steady_clock::time_point t0) {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> g(mu_);
  stats_.ms += ms;
}

void RemoteCache::failed(const std::string& what) {
  bool opened = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.errors++;
    if (++failures_ >= kBreakerFailures) {
      opened = true;
      open_until_ = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(config_.breaker_seconds));
    }
  }
  // One warning per process (a Redis that stays down would otherwise warn every breaker period).
  static std::atomic<bool> warned{false};
  if (opened && !warned.exchange(true))
    log_warn("remote cache {}: {}; {} failures in a row, so it is skipped for {:g} s at a time (kernels are "
             "compiled or read from the local cache meanwhile)", address(), what, kBreakerFailures,
             config_.breaker_seconds);
  else
    log_info("remote cache {}: {}", address(), what);
}

void RemoteCache::succeeded() {
  std::lock_guard<std::mutex> g(mu_);
  failures_ = 0;
}

std::unique_ptr<RemoteCache::Conn> RemoteCache::take() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (failures_ >= kBreakerFailures && std::chrono::steady_clock::now() < open_until_) {
      stats_.skipped++;
      return nullptr;
    }
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      c->reused = true;
      return c;
    }
  }
  auto c = std::make_unique<Conn>();
  const RemoteCacheUrl& u = config_.url;
  const timeval connect_tv = to_timeval(config_.connect_timeout_ms);
  c->ctx = u.unix_socket ? redisConnectUnixWithTimeout(u.host.c_str(), connect_tv)
                         : redisConnectWithTimeout(u.host.c_str(), u.port, connect_tv);
  if (!c->ctx || c->ctx->err) {
    failed("cannot connect: " + c->error());
    return nullptr;
  }
  if (redisSetTimeout(c->ctx, to_timeval(config_.op_timeout_ms)) != REDIS_OK) {
    failed("cannot set its timeout: " + c->error());
    return nullptr;
  }
  auto setup = [&](const std::vector<std::string>& cmd, const char* what) {
    ReplyPtr r(c->command(cmd, kSmallReply, deadline(0)), freeReplyObject);
    if (!r) {
      failed(fmt::format("{}: {}", what, c->error()));
      return false;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      failed(fmt::format("{} refused: {}", what, std::string(r->str, r->len)));
      return false;
    }
    return true;
  };
  if (!u.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!u.user.empty()) auth.push_back(u.user);
    auth.push_back(u.password);
    if (!setup(auth, "AUTH")) return nullptr;
  }
  if (u.db != 0 && !setup({"SELECT", std::to_string(u.db)}, "SELECT")) return nullptr;
  return c;
}

void RemoteCache::give_back(std::unique_ptr<Conn> c) {
  std::lock_guard<std::mutex> g(mu_);
  if (idle_.size() < 8) idle_.push_back(std::move(c));
}

std::chrono::steady_clock::time_point RemoteCache::deadline(int64_t bytes) const {
  const double ms = config_.op_timeout_ms + kMsPerMB * static_cast<double>(bytes) / (1 << 20);
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

RemoteCache::ReplyPtr RemoteCache::run(const std::vector<std::string>& cmd, size_t max_reply, int64_t reply_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  int64_t bytes = reply_bytes;
  for (const auto& a : cmd) bytes += static_cast<int64_t>(a.size());
  ReplyPtr out(nullptr, freeReplyObject);
  for (int attempt = 0; attempt < 2 && !out; ++attempt) {
    auto c = take();
    if (!c) break;
    out.reset(c->command(cmd, max_reply, deadline(bytes)));
    if (!out) {
      // A pooled connection may have died with a restarted server: one more try on a new one (not after a
      // timeout or an oversized reply, which a new connection would meet again).
      const bool retry = c->reused && !c->abandoned;
      failed(cmd[0] + ": " + c->error());
      if (retry) continue;
      break;
    }
    if (out->type == REDIS_REPLY_ERROR) failed(cmd[0] + " refused: " + std::string(out->str, out->len));
    else succeeded();
    give_back(std::move(c));
  }
  add_ms(t0);
  return out;
}

std::optional<std::string> RemoteCache::get(const std::string& key, bool count_miss) {
  const std::string rkey = kNamespace + key;
  // Its length first: a value over the limit (planted; no put stores one) is refused unread. Then at most
  // the limit and one byte (GETRANGE's end is inclusive): the value may have been replaced by a larger
  // one in between, which the extra byte shows, and nothing larger is read whatever happened.
  const int64_t limit = config_.max_entry_bytes;
  int64_t length = 0;
  std::string value;  // "" for a miss (no put stores an empty value)
  if (ReplyPtr n = run({"STRLEN", rkey}); n && n->type == REDIS_REPLY_INTEGER) {
    length = n->integer;
    if (length > 0 && length <= limit) {
      // The protocol around it: "$<length>\r\n" and "\r\n".
      ReplyPtr r = run({"GETRANGE", rkey, "0", std::to_string(limit)}, static_cast<size_t>(limit) + 64, length);
      if (r && r->type == REDIS_REPLY_STRING) {
        value.assign(r->str, r->len);
        length = static_cast<int64_t>(r->len);  // 0 when deleted since: a miss
      }
    }
  }
  const bool too_large = length > limit;
  std::optional<std::string> out;
  if (!value.empty() && !too_large) out = unframe(config_.secret, key, value);
  const bool refused = too_large || (!value.empty() && !out);
  bool warn_large = false, warn_refused = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    stats_.bytes_in += static_cast<int64_t>(value.size());
    stats_.refused += refused;
    if (out) stats_.hits++;
    else stats_.misses += count_miss;
    if (too_large) warn_large = !std::exchange(warned_large_, true);
    else if (refused) warn_refused = !std::exchange(warned_refused_, true);
  }
  if (warn_large)
    log_warn("remote cache {}: refused entry {} unread: it holds over {} bytes, the most an entry may "
             "(FUSION_JIT_REMOTE_CACHE_MAX_MB; planted, or stored by a machine with a larger limit)", address(), rkey,
             limit);
  if (warn_refused)
    log_warn("remote cache {}: refused entry {} (its frame, key or signature is wrong: tampered with, or signed "
             "with another key); it will be overwritten by the next compile", address(), rkey);
  return out;
}

bool RemoteCache::contains(const std::string& key) {
  ReplyPtr r = run({"EXISTS", kNamespace + key});
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

bool RemoteCache::put(const std::string& key, const std::string& payload) {
  const std::string f = frame(config_.secret, key, payload);
  if (static_cast<int64_t>(f.size()) > config_.max_entry_bytes) {
    std::lock_guard<std::mutex> g(mu_);
    stats_.too_large++;
    return false;
  }
  std::vector<std::string> cmd = {"SET", kNamespace + key, f};
  if (config_.ttl_s > 0) cmd.insert(cmd.end(), {"EX", std::to_string(config_.ttl_s)});
  ReplyPtr r = run(cmd);
  const bool stored = r && r->type != REDIS_REPLY_ERROR;
  if (stored) {
    std::lock_guard<std::mutex> g(mu_);
    stats_.writes++;
    stats_.bytes_out += static_cast<int64_t>(f.size());
  }
  return stored;
}

RemoteCache::Lease RemoteCache::try_lease(const std::string& key, const std::string& token, int64_t ttl_ms) {
  const std::string lease = std::string(kNamespace) + "lease:" + key;
  const std::string ttl = std::to_string(ttl_ms);
  ReplyPtr r = run({"SET", lease, token, "NX", "PX", ttl});
  if (!r || r->type == REDIS_REPLY_ERROR) return Lease::kUnavailable;
  if (r->type == REDIS_REPLY_STATUS) {  // OK; nil when another holds it
    std::lock_guard<std::mutex> g(mu_);
    stats_.leases++;
    return Lease::kAcquired;
  }
  // Every lease is set with its expiry (SET NX PX) by machines that all use the same lease time, so one
  // without an expiry (PTTL -1), or with a longer one, was not set by a machine of the fleet: planted, or
  // kept by a PERSIST. Honoured, it would hold every cold process for its whole life, so it is void,
  // and taken over as a free one would be. The script looks again and sets ours in one step, so two
  // machines cannot both take it over, and a lease set meanwhile by a machine of the fleet is honoured.
  bool taken_over = false;
  if (ReplyPtr t = run({"PTTL", lease}); t && t->type == REDIS_REPLY_INTEGER && (t->integer == -1 || t->integer > ttl_ms)) {
    static const char* kTakeOver =
        "local t = redis.call('pttl', KEYS[1]) "
        "if t == -1 or t > tonumber(ARGV[2]) then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end "
        "return 0";
    ReplyPtr e = run({"EVAL", kTakeOver, "1", lease, token, ttl});
    // Without scripting (EVAL refused), the void lease is not waited on: the entry is made here.
    if (!e || e->type != REDIS_REPLY_INTEGER) return Lease::kUnavailable;
    taken_over = e->integer == 1;
  }
  bool warn = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (taken_over) {
      stats_.leases++;
      stats_.leases_void++;
      warn = !warned_void_lease_;
      warned_void_lease_ = true;
    } else {
      stats_.lease_polls++;
    }
  }
  if (warn)
    log_warn("remote cache {}: the lease {} had no expiry or one over {} ms, which no machine of the fleet sets "
             "(planted?); it was taken over", address(), lease, ttl_ms);
  return taken_over ? Lease::kAcquired : Lease::kHeld;
}

// Note [Lease wait budget]
// A lease is waited on (Note [One compile per key across the fleet]) because another machine is making
// the entry, which usually takes a compile's time. But a holder that crashed keeps its lease for the whole
// lease time (120 s), and anyone who can write to the Redis can set leases on every key with the lease
// time as expiry (void ones are taken over, see try_lease): each cold process would stall that long per
// key. So the waiting is bounded for the process, not per key: all waits on all keys together, each poll
// included, charge one budget (Config::lease_wait_budget_s, 5 s; concurrent waits each charge theirs,
// so it is spent faster, never slower, than the wall clock). Once it is spent a held lease is not waited
// on: the entry is made here (a duplicate compile, the cost of a lease that never ends), with one
// warning. Leases are still taken, so this process still spares the others their compiles.
bool RemoteCache::wait_on_lease(std::chrono::milliseconds d, std::chrono::steady_clock::time_point* since) {
  using Seconds = std::chrono::duration<double>;
  double left = 0;
  bool warn = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    lease_waited_s_ += Seconds(std::chrono::steady_clock::now() - *since).count();
    left = config_.lease_wait_budget_s - lease_waited_s_;
    if (left <= 0) {
      warn = !warned_lease_budget_;
      warned_lease_budget_ = true;
    }
  }
  if (warn)
    log_warn("remote cache {}: this process has waited {:g} s in all on other machines' leases, its budget; it "
             "makes entries whose lease is held from now on", address(), config_.lease_wait_budget_s);
  if (left <= 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::min<Seconds>(d, Seconds(left)));
  *since = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> g(mu_);
  lease_waited_s_ += Seconds(*since - t0).count();
  return true;
}

void RemoteCache::release_lease(const std::string& key, const std::string& token) {
  // Deleted only while it is still ours (it may have expired and gone to another).
  static const char* kScript = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
  run({"EVAL", kScript, "1", std::string(kNamespace) + "lease:" + key, token});
}

RemotePing RemoteCache::ping() {
  RemotePing p;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = take();
  if (!c) {
    p.error = "cannot connect (or skipped after failures)";
    return p;
  }
  ReplyPtr r(c->command({"PING"}, kSmallReply, deadline(0)), freeReplyObject);
  if (!r || r->type == REDIS_REPLY_ERROR) {
    p.error = r ? std::string(r->str, r->len) : c->error();
    failed("PING: " + p.error);
    return p;
  }
  p.latency_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  p.ok = true;
  // Counts our keys (SCAN, bounded: at most 1000 rounds).
  std::string cursor = "0";
  int64_t n = 0;
  for (int round = 0; round < 1000; ++round) {
    ReplyPtr s(c->command({"SCAN", cursor, "MATCH", std::string(kNamespace) + "*", "COUNT", "1000"}, 16 << 20,
                          deadline(0)),
               freeReplyObject);
    if (!s || s->type != REDIS_REPLY_ARRAY || s->elements != 2 || s->element[0]->type != REDIS_REPLY_STRING ||
        s->element[1]->type != REDIS_REPLY_ARRAY) {
      n = -1;
      break;
    }
    cursor.assign(s->element[0]->str, s->element[0]->len);
    n += static_cast<int64_t>(s->element[1]->elements);
    if (cursor == "0") break;
  }
  p.entries = cursor == "0" ? n : -1;
  if (p.entries >= 0) give_back(std::move(c));
  succeeded();
  return p;
}

}  // namespace fusion_jit
