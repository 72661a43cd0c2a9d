// The kernel cache's remote tier (Note [The remote tier], kernels_cache/remote_cache.h) against a real
// redis-server (Debian's package, installed by ./run), started per test on a free localhost port with its
// own data directory and stopped at the end.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/fj-remote-test-XXXXXX";
  return ::mkdtemp(tmpl);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool have_redis_server() { return std::system("command -v redis-server > /dev/null 2>&1") == 0; }

// A redis-server child on 127.0.0.1:port.
class RedisServer {
 public:
  RedisServer() : dir_(temp_dir()), port_(free_port()) { start(); }
  ~RedisServer() {
    stop();
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  int port() const { return port_; }
  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_), log = dir_ + "/redis.log";
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", dir_.c_str(), "--enable-debug-command", "yes", "--loglevel", "warning", "--logfile", log.c_str(),
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 500; ++i) {  // up to 5 s
      redisContext* c = redisConnect("127.0.0.1", port_);
      bool up = c && !c->err;
      if (up) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        up = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
      }
      if (c) redisFree(c);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "redis-server did not start on port " << port_;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Freezes the server (SIGSTOP): connections are still accepted by the kernel, nothing is answered.
  void freeze() { ::kill(pid_, SIGSTOP); }
  void thaw() { ::kill(pid_, SIGCONT); }
  // A command on a connection of its own (raw bytes, for tampering).
  void command(const std::vector<std::string>& args, std::string* out = nullptr) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    ASSERT_TRUE(c && !c->err);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
    ASSERT_NE(r, nullptr);
    if (out && r->type == REDIS_REPLY_STRING) out->assign(r->str, r->len);
    if (out && r->type == REDIS_REPLY_INTEGER) *out = std::to_string(r->integer);
    freeReplyObject(r);
    redisFree(c);
  }

 private:
  std::string dir_;
  int port_;
  pid_t pid_ = -1;
};

RemoteCache::Config config(int port, const std::string& secret = "0123456789abcdef0123456789abcdef") {
  RemoteCache::Config c;
  c.url = parse_remote_cache_url("test", "redis://127.0.0.1:" + std::to_string(port));
  c.secret = secret;
  return c;
}

const std::string kKey(64, 'a');

// Waits until `done()` holds, for at most `limit_s` (a bound for a broken build, never reached by a
// working one); returns whether it holds. Tests order threads by such events, never by a sleep.
template <typename F>
bool wait_until(F done, double limit_s = 30) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#define NEED_REDIS() \
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (./run installs Debian's redis-server)"

TEST(RemoteCacheUrl, ParsesAndRejectsNamingTheVariable) {
  RemoteCacheUrl u = parse_remote_cache_url("V", "redis://user:secret@cache.local:7000/3");
  EXPECT_EQ(u.host, "cache.local");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 3);
  EXPECT_EQ(u.user, "user");
  EXPECT_EQ(u.password, "secret");
  u = parse_remote_cache_url("V", "redis://localhost");
  EXPECT_EQ(u.port, 6379);
  EXPECT_EQ(u.db, 0);
  u = parse_remote_cache_url("V", "unix:///run/redis.sock?db=2");
  EXPECT_TRUE(u.unix_socket);
  EXPECT_EQ(u.host, "/run/redis.sock");
  EXPECT_EQ(u.db, 2);
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/x", "unix://rel.sock",
                          "redis://[::1]:6379"}) {
    try {
      parse_remote_cache_url("FUSION_JIT_REMOTE_CACHE", bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FUSION_JIT_REMOTE_CACHE="), std::string::npos) << e.what();
    }
  }
  // The password never appears in an error.
  try {
    parse_remote_cache_url("V", "redis://u:hunter2@h:bad");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

// Issue 63: redis://PASSWORD@host (the password-only form, as redis-cli -u takes it) with any other
// mistake printed the password; so did a misspelt scheme. Every form hides it, and only it.
TEST(RemoteCacheUrl, NoErrorShowsThePassword) {
  EXPECT_EQ(parse_remote_cache_url("V", "redis://hunter2@h:7000").password, "hunter2");
  for (const char* bad : {"redis://hunter2@h:99999", "redis://hunter2@h:bad", "redis://hunter2@h/x",
                          "redis://hunter2@", "redis://u:hunter2@h:99999", "redis://:hunter2@h:0",
                          "redis://hunter2@[::1]:6379", "redis:/hunter2@h:6379", "http://hunter2@h",
                          "rediss://u:hunter2@h", "redis://hunter2@h:hunter2", "unix:///s.sock?db=0&password=hunter2",
                          "unix://hunter2@/s.sock?x=1"}) {
    try {
      parse_remote_cache_url("FUSION_JIT_REMOTE_CACHE", bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
      EXPECT_NE(what.find("***"), std::string::npos) << what;
      EXPECT_NE(what.find("FUSION_JIT_REMOTE_CACHE="), std::string::npos) << what;
    }
  }
  try {
    parse_remote_cache_url("V", "redis://admin:hunter2@cache.local:99999");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("V=redis://admin:***@cache.local:99999: bad port '99999'"), std::string::npos)
        << e.what();
  }
}

TEST(RemoteCacheFrame, RefusesTamperingAnotherKeyAndAnotherName) {
  const std::string secret = "0123456789abcdef";
  const std::string f = RemoteCache::frame(secret, kKey, "payload bytes");
  EXPECT_EQ(RemoteCache::unframe(secret, kKey, f), "payload bytes");
  std::string tampered = f;
  tampered[tampered.size() - 40] ^= 1;  // a payload byte
  EXPECT_FALSE(RemoteCache::unframe(secret, kKey, tampered));
  EXPECT_FALSE(RemoteCache::unframe("another secret!!", kKey, f));
  EXPECT_FALSE(RemoteCache::unframe(secret, std::string(64, 'b'), f));
  EXPECT_FALSE(RemoteCache::unframe(secret, kKey, f.substr(0, f.size() - 1)));
  EXPECT_FALSE(RemoteCache::unframe(secret, kKey, ""));
}

TEST(RemoteCacheKeyFile, OnlyAPrivateFileOfOursWithEnoughBytes) {
  const std::string d = temp_dir();
  const std::string path = d + "/key";
  std::ofstream(path) << "0123456789abcdef0123\n";
  ::chmod(path.c_str(), 0600);
  std::string why;
  EXPECT_EQ(RemoteCache::read_key_file(path, &why), "0123456789abcdef0123") << why;
  ::chmod(path.c_str(), 0640);
  EXPECT_FALSE(RemoteCache::read_key_file(path, &why));
  EXPECT_NE(why.find("chmod 600"), std::string::npos) << why;
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << "short";
  EXPECT_FALSE(RemoteCache::read_key_file(path, &why));
  EXPECT_NE(why.find("at least 16"), std::string::npos) << why;
  EXPECT_FALSE(RemoteCache::read_key_file(d + "/missing", &why));
  ::symlink(path.c_str(), (d + "/link").c_str());
  EXPECT_FALSE(RemoteCache::read_key_file(d + "/link", &why)) << "a symbolic link is not followed";
  std::system(("rm -rf '" + d + "'").c_str());
}

TEST(RemoteCache, RoundTripWithTtlAndSizeBound) {
  NEED_REDIS();
  RedisServer redis;
  auto c = config(redis.port());
  c.ttl_s = 100;
  c.max_entry_bytes = 1000;
  RemoteCache writer(c), reader(c);
  EXPECT_FALSE(reader.get(kKey));
  writer.put(kKey, "compiled bytes");
  EXPECT_EQ(reader.get(kKey), "compiled bytes");
  std::string ttl;
  redis.command({"TTL", RemoteCache::kNamespace + kKey}, &ttl);
  EXPECT_GT(std::stoi(ttl), 0);
  EXPECT_LE(std::stoi(ttl), 100);
  writer.put(std::string(64, 'c'), std::string(2000, 'x'));
  EXPECT_FALSE(reader.get(std::string(64, 'c')));
  EXPECT_EQ(writer.stats().too_large, 1);
  EXPECT_EQ(writer.stats().writes, 1);
  EXPECT_EQ(reader.stats().hits, 1);
  EXPECT_EQ(reader.stats().misses, 2);
  EXPECT_EQ(reader.stats().errors, 0);
  RemotePing p = reader.ping();
  EXPECT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.entries, 1);
}

// Two caches with separate directories share one Redis: the second makes nothing, and keeps what it
// read in its directory.
TEST(RemoteCache, SecondMachineMakesNothing) {
  NEED_REDIS();
  RedisServer redis;
  auto remote = std::make_shared<RemoteCache>(config(redis.port()));
  const std::string d1 = temp_dir(), d2 = temp_dir();
  KernelsCache first(d1, 1 << 30, remote);
  bool made = false;
  EXPECT_EQ(first.get_or_make(kKey, [] { return std::string("kernel"); }, &made), "kernel");
  EXPECT_TRUE(made);
  KernelsCache second(d2, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  EXPECT_EQ(second.get_or_make(kKey, []() -> std::string { throw Error("compiled on the second machine"); }, &made),
            "kernel");
  EXPECT_FALSE(made);
  EXPECT_TRUE(KernelsCache(d2, 1 << 30).contains(kKey)) << "a remote hit is written to the directory";
  EXPECT_EQ(second.stats().remote.hits, 1);
  KernelsCache third(temp_dir(), 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  EXPECT_TRUE(third.contains(kKey)) << "the remote tier holds it (a first signature then takes the code it has)";
  EXPECT_FALSE(third.contains(std::string(64, 'f')));
  EXPECT_EQ(third.get(kKey), "kernel");
  std::system(("rm -rf '" + d1 + "' '" + d2 + "' '" + third.dir() + "'").c_str());
}

// A tampered entry, one signed with another key, and one copied under another key's name: refused,
// counted, never returned; the next put of the key overwrites it.
TEST(RemoteCache, RefusesEntriesThatAreNotOurs) {
  NEED_REDIS();
  RedisServer redis;
  RemoteCache cache(config(redis.port()));
  const std::string name = RemoteCache::kNamespace + kKey;
  std::string f = RemoteCache::frame("0123456789abcdef0123456789abcdef", kKey, "good");
  f[f.size() - 33] ^= 1;
  redis.command({"SET", name, f});
  EXPECT_FALSE(cache.get(kKey));
  redis.command({"SET", name, RemoteCache::frame("another key, 32 bytes long......", kKey, "evil")});
  EXPECT_FALSE(cache.get(kKey));
  const std::string other(64, 'd');
  cache.put(other, "for another key");
  std::string copied;
  redis.command({"GET", RemoteCache::kNamespace + other}, &copied);
  redis.command({"SET", name, copied});
  EXPECT_FALSE(cache.get(kKey));
  EXPECT_EQ(cache.stats().refused, 3);
  cache.put(kKey, "rebuilt");
  EXPECT_EQ(cache.get(kKey), "rebuilt");
}

// Redis killed, restarted, frozen: every call returns within the timeouts (a miss or a counted failure),
// the breaker skips it after three failures in a row, and it is used again once back. The bounds are the
// timeouts' multiples and far below what a call without them would take (a frozen server answers never).
TEST(RemoteCache, DownOrSlowRedisCostsAtMostTheTimeouts) {
  NEED_REDIS();
  RedisServer redis;
  auto c = config(redis.port());
  c.connect_timeout_ms = c.op_timeout_ms = 200;
  c.breaker_seconds = 0.5;
  RemoteCache cache(c);
  cache.put(kKey, "v");
  ASSERT_EQ(cache.get(kKey), "v");
  redis.stop();
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(cache.get(kKey));
  cache.put(kKey, "w");  // counted, not thrown
  EXPECT_GE(cache.stats().errors, RemoteCache::kBreakerFailures);
  EXPECT_GE(cache.stats().errors + cache.stats().skipped, 11) << "a call neither failed nor was skipped";
  EXPECT_GT(cache.stats().skipped, 0) << "the breaker opened";
  redis.start();
  EXPECT_TRUE(wait_until([&] { return cache.put(kKey, "back"); })) << "never used again after the breaker's period";
  EXPECT_EQ(cache.get(kKey), "back");
  // Frozen: the server accepts and never answers. A thread thaws it after 20 s, so that a get without an
  // operation timeout would take that long; with it a get gives up after its 200 ms.
  const int64_t errors = cache.stats().errors;
  redis.freeze();
  std::atomic<bool> done{false};
  std::thread thawer([&] {
    wait_until([&] { return done.load(); }, 20);
    redis.thaw();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache.get(kKey));
  EXPECT_LT(seconds_since(t0), 10.0) << "a frozen Redis costs the operation timeout, not its delay";
  EXPECT_EQ(cache.stats().errors, errors + 1);
  done = true;
  thawer.join();
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// Note [One compile per key across the fleet]: two machines (caches with their own directories) missing
// the same key at once: one makes it, the other waits for its entry; a holder whose make fails releases
// the lease and the other makes it then. The machines are ordered by events (the lease taken, the other's
// poll seen), not by sleeps.
TEST(RemoteCache, OneMakerPerKeyAcrossMachines) {
  NEED_REDIS();
  RedisServer redis;
  const std::string d1 = temp_dir(), d2 = temp_dir(), d3 = temp_dir(), d4 = temp_dir();
  KernelsCache a(d1, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  KernelsCache b(d2, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  std::atomic<int> makes{0};
  // a makes the entry only once b has found a's lease held.
  auto make_once_b_polled = [&] {
    makes++;
    EXPECT_TRUE(wait_until([&] { return b.stats().remote.lease_polls >= 1; })) << "b never waited on a's lease";
    return std::string("kernel");
  };
  bool made_a = false, made_b = false;
  std::string got_b;
  std::thread ta([&] { EXPECT_EQ(a.get_or_make(kKey, make_once_b_polled, &made_a), "kernel"); });
  ASSERT_TRUE(wait_until([&] { return a.stats().remote.leases == 1; }));
  got_b = b.get_or_make(kKey, make_once_b_polled, &made_b);
  ta.join();
  EXPECT_EQ(got_b, "kernel");
  EXPECT_EQ(makes.load(), 1);
  EXPECT_TRUE(made_a);
  EXPECT_FALSE(made_b);
  EXPECT_TRUE(KernelsCache(d2, 1 << 30).contains(kKey));

  // c's make fails once d has found c's lease held; d then takes the released lease and makes the
  // entry (had the lease not been released, d would make it without a lease once its budget was spent).
  KernelsCache c(d3, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  KernelsCache d(d4, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  const std::string key(64, 'e');
  std::thread tc([&] {
    EXPECT_THROW(c.get_or_make(key,
                               [&]() -> std::string {
                                 EXPECT_TRUE(wait_until([&] { return d.stats().remote.lease_polls >= 1; }));
                                 throw Error("the compiler failed");
                               }),
                 Error);
  });
  ASSERT_TRUE(wait_until([&] { return c.stats().remote.leases == 1; }));
  bool made_d = false;
  EXPECT_EQ(d.get_or_make(key, [] { return std::string("made by d"); }, &made_d), "made by d");
  tc.join();
  EXPECT_TRUE(made_d);
  EXPECT_EQ(d.stats().remote.leases, 1) << "the failed holder's lease was not released";
  std::system(("rm -rf '" + d1 + "' '" + d2 + "' '" + d3 + "' '" + d4 + "'").c_str());
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// The remote tier is keyed as the local cache is (Note [The remote tier]): an entry made for one set of
// key parts is a miss, on another machine, for the same parts with any one of them changed.
TEST(RemoteCache, KeyedAsTheLocalCache) {
  NEED_REDIS();
  RedisServer redis;
  const CacheKeyParts base{"cpu-so", "source", "g++ 12", "-O3", "avx512"};
  KernelsCache a(temp_dir(), 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  a.put(cache_key(base), "kernel");
  std::string name_exists;
  redis.command({"EXISTS", RemoteCache::kNamespace + cache_key(base)}, &name_exists);
  EXPECT_EQ(name_exists, "1") << "stored under fusion_jit:v1:<the local key>";
  KernelsCache b(temp_dir(), 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  EXPECT_EQ(b.get(cache_key(base)), "kernel");
  for (std::string CacheKeyParts::*field : {&CacheKeyParts::kind, &CacheKeyParts::source, &CacheKeyParts::compiler,
                                             &CacheKeyParts::flags, &CacheKeyParts::target}) {
    CacheKeyParts changed = base;
    changed.*field += "'";
    EXPECT_FALSE(b.get(cache_key(changed))) << changed.*field;
  }
  std::system(("rm -rf '" + a.dir() + "' '" + b.dir() + "'").c_str());
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// Issue 63: values planted under entry keys (300 MB each in the report) were read and copied whole before
// the signature refused them. A value over the entry limit is refused unread (STRLEN), without a failure
// that would feed the breaker; one within the limit but not ours is read and refused as before.
TEST(RemoteCache, ValuesOverTheLimitAreRefusedUnread) {
  NEED_REDIS();
  RedisServer redis;
  auto c = config(redis.port());
  c.max_entry_bytes = 4096;
  RemoteCache cache(c);
  redis.command({"SET", RemoteCache::kNamespace + kKey, std::string(8 << 20, 'x')});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(cache.get(kKey));
  RemoteCacheStats s = cache.stats();
  EXPECT_EQ(s.bytes_in, 0) << "the 8 MB value was read";
  EXPECT_EQ(s.refused, 5);
  EXPECT_EQ(s.errors, 0);
  EXPECT_EQ(s.skipped, 0) << "a planted value does not open the breaker";
  // Within the limit: read, and refused by its signature.
  redis.command({"SET", RemoteCache::kNamespace + kKey, std::string(4096, 'y')});
  EXPECT_FALSE(cache.get(kKey));
  EXPECT_EQ(cache.stats().bytes_in, 4096);
  EXPECT_EQ(cache.stats().refused, 6);
  // The put of the key replaces it, and an entry of exactly the limit is read.
  const std::string payload(4096 - RemoteCache::frame(c.secret, kKey, "").size(), 'p');
  ASSERT_TRUE(cache.put(kKey, payload));
  EXPECT_EQ(cache.get(kKey), payload);
  EXPECT_FALSE(cache.put(kKey, payload + "!"));
}

// A fake Redis on 127.0.0.1 that answers every command of its first connection with the header of a
// bulk string of `claimed` bytes, then sends `rate_bytes` of it every `every` until `for_s` has passed,
// the client hangs up, or all was sent. sent(): the bytes that got through.
class FakeRedis {
 public:
  FakeRedis(int64_t claimed, size_t rate_bytes, std::chrono::milliseconds every, double for_s) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 4);
    socklen_t n = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, claimed, rate_bytes, every, for_s] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      char buf[4096];
      if (::recv(fd, buf, sizeof buf, 0) > 0) {
        const std::string head = "$" + std::to_string(claimed) + "\r\n";
        ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
        const std::string chunk(rate_bytes, 'z');
        const auto t0 = std::chrono::steady_clock::now();
        while (sent_ < claimed && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < for_s) {
          const ssize_t k = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
          if (k <= 0) break;  // the client hung up
          sent_ += k;
          std::this_thread::sleep_for(every);
        }
      }
      ::close(fd);
    });
  }
  ~FakeRedis() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    join();
    ::close(listen_fd_);
  }
  // Waits for the server's end: the client hung up, all was sent, or its time passed.
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  int64_t sent() const { return sent_; }

 private:
  int listen_fd_ = -1, port_ = 0;
  std::atomic<int64_t> sent_{0};
  std::thread thread_;
};

// Note [Bounded replies]: a server that trickles its reply costs an operation its timeout, not as long as
// it likes (hiredis's per-read timeout never fires while a byte comes every 50 ms); one that answers
// with a huge reply is hung up on once the reply passes what the command may return.
TEST(RemoteCache, TricklingOrFloodingServerIsCutOff) {
  auto bounded = [](int port) {
    auto c = config(port);
    c.connect_timeout_ms = c.op_timeout_ms = 200;
    c.max_entry_bytes = 1 << 20;
    return c;
  };
  {
    FakeRedis fake(1 << 20, 1, std::chrono::milliseconds(50), 30.0);
    RemoteCache cache(bounded(fake.port()));
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(cache.get(kKey));
    EXPECT_LT(seconds_since(t0), 10.0) << "a reply trickled for 30 s, against an operation timeout of 200 ms";
    EXPECT_EQ(cache.stats().errors, 1);
  }
  {
    FakeRedis fake(int64_t{256} << 20, 1 << 20, std::chrono::milliseconds(0), 5.0);
    RemoteCache cache(bounded(fake.port()));
    EXPECT_FALSE(cache.get(kKey));
    EXPECT_EQ(cache.stats().errors, 1);
    // What the socket buffers hold besides what was read (a few MB on loopback), not the 256 MB: counted
    // once the server found the client gone.
    fake.join();
    EXPECT_LT(fake.sent(), int64_t{64} << 20);
  }
}

// Issue 63: a lease planted with no expiry (or a longer one than leases get) held every cold process for
// the lease wait, per key. Such a lease is void: taken over at once, atomically; a lease with a lease's
// expiry is honoured.
TEST(RemoteCache, VoidLeasesAreTakenOver) {
  NEED_REDIS();
  RedisServer redis;
  RemoteCache cache(config(redis.port()));
  const std::string lease = std::string(RemoteCache::kNamespace) + "lease:" + kKey;
  std::string ttl, holder;
  redis.command({"SET", lease, "planted"});
  EXPECT_EQ(cache.try_lease(kKey, "me", 120000), RemoteCache::Lease::kAcquired);
  redis.command({"PTTL", lease}, &ttl);
  EXPECT_GT(std::stoll(ttl), 0);
  EXPECT_LE(std::stoll(ttl), 120000);
  redis.command({"GET", lease}, &holder);
  EXPECT_EQ(holder, "me");
  cache.release_lease(kKey, "me");
  redis.command({"EXISTS", lease}, &ttl);
  EXPECT_EQ(ttl, "0");
  redis.command({"SET", lease, "planted", "EX", "31536000"});  // a year
  EXPECT_EQ(cache.try_lease(kKey, "me", 120000), RemoteCache::Lease::kAcquired);
  cache.release_lease(kKey, "me");
  redis.command({"SET", lease, "another machine", "PX", "60000"});
  EXPECT_EQ(cache.try_lease(kKey, "me", 120000), RemoteCache::Lease::kHeld);
  redis.command({"GET", lease}, &holder);
  EXPECT_EQ(holder, "another machine");
  EXPECT_EQ(cache.stats().leases, 2);
  EXPECT_EQ(cache.stats().leases_void, 2);
  EXPECT_EQ(cache.stats().lease_polls, 1);

  // Through the kernel cache: a key whose lease was planted is made at once, and its lease released.
  KernelsCache kc(temp_dir(), 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  const std::string key(64, 'f'), key_lease = std::string(RemoteCache::kNamespace) + "lease:" + key;
  redis.command({"SET", key_lease, "planted"});
  bool made = false;
  EXPECT_EQ(kc.get_or_make(key, [] { return std::string("kernel"); }, &made), "kernel");
  EXPECT_TRUE(made);
  EXPECT_EQ(kc.stats().remote.lease_polls, 0) << "the planted lease was waited on";
  EXPECT_EQ(kc.stats().remote.leases_void, 1);
  redis.command({"EXISTS", key_lease}, &ttl);
  EXPECT_EQ(ttl, "0");
  std::system(("rm -rf '" + kc.dir() + "'").c_str());
}

// Note [Lease wait budget]: leases that look right but never end (a crashed holder's; or planted with a
// lease's expiry) cost a process its budget once, for all keys together, not the lease time per key.
TEST(RemoteCache, LeaseWaitsShareOneBudget) {
  NEED_REDIS();
  RedisServer redis;
  auto c = config(redis.port());
  c.lease_wait_budget_s = 0.5;
  KernelsCache kc(temp_dir(), 1 << 30, std::make_shared<RemoteCache>(c));
  std::vector<double> seconds;
  std::vector<int64_t> polls;
  for (char k : {'1', '2', '3'}) {
    const std::string key(64, k);
    redis.command({"SET", std::string(RemoteCache::kNamespace) + "lease:" + key, "crashed", "PX", "100000"});
    bool made = false;
    const int64_t polls_before = kc.stats().remote.lease_polls;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(kc.get_or_make(key, [] { return std::string("kernel"); }, &made), "kernel");
    seconds.push_back(seconds_since(t0));
    polls.push_back(kc.stats().remote.lease_polls - polls_before);
    EXPECT_TRUE(made);
  }
  EXPECT_GE(seconds[0], 0.4) << "the first key's lease was waited on, up to the budget";
  EXPECT_LT(seconds[0], 50.0) << "the first key's lease was waited out (100 s), not the budget";
  EXPECT_GE(polls[0], 2) << "the first key's lease was polled while the budget lasted";
  EXPECT_EQ(polls[1], 1) << "the budget was spent: later keys are tried once and not waited on";
  EXPECT_EQ(polls[2], 1);
  std::system(("rm -rf '" + kc.dir() + "'").c_str());
}

}  // namespace
}  // namespace fusion_jit
