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

TEST(RemoteCacheFrame, RefusesTamperingAnotherKeyAndAnotherName) {
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

// Redis stopped, killed mid-run, restarted, slowed: every call returns within the timeouts (a miss or a
// counted failure), the breaker skips it after three failures in a row, and it is used again once back.
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
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(cache.get(kKey));
  cache.put(kKey, "w");  // counted, not thrown
  const double down_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(down_s, 2.0) << "ten gets and a put against a dead Redis";
  EXPECT_GE(cache.stats().errors, RemoteCache::kBreakerFailures);
  EXPECT_GT(cache.stats().skipped, 0) << "the breaker opened";
  redis.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  cache.put(kKey, "back");
  EXPECT_EQ(cache.get(kKey), "back") << "used again after the breaker's period";
  // Slow: DEBUG SLEEP holds the server for a second; a get gives up after its 200 ms.
  std::thread sleeper([&] { redis.command({"DEBUG", "SLEEP", "1"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache.get(kKey));
  const double slow_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(slow_s, 0.8) << "a slow Redis costs the operation timeout, not its delay";
  sleeper.join();
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// Note [One compile per key across the fleet]: two machines (caches with their own directories) missing
// the same key at once: one makes it, the other waits for its entry; a holder whose make fails releases
// the lease and the other makes it then.
TEST(RemoteCache, OneMakerPerKeyAcrossMachines) {
  NEED_REDIS();
  RedisServer redis;
  const std::string d1 = temp_dir(), d2 = temp_dir(), d3 = temp_dir(), d4 = temp_dir();
  KernelsCache a(d1, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  KernelsCache b(d2, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  std::atomic<int> makes{0};
  auto slow_make = [&] {
    makes++;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return std::string("kernel");
  };
  bool made_a = false, made_b = false;
  std::string got_b;
  std::thread ta([&] { EXPECT_EQ(a.get_or_make(kKey, slow_make, &made_a), "kernel"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  got_b = b.get_or_make(kKey, slow_make, &made_b);
  ta.join();
  EXPECT_EQ(got_b, "kernel");
  EXPECT_EQ(makes.load(), 1);
  EXPECT_TRUE(made_a);
  EXPECT_FALSE(made_b);
  EXPECT_GE(b.stats().remote.lease_polls, 1);
  EXPECT_EQ(a.stats().remote.leases, 1);
  EXPECT_TRUE(KernelsCache(d2, 1 << 30).contains(kKey));

  KernelsCache c(d3, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  KernelsCache d(d4, 1 << 30, std::make_shared<RemoteCache>(config(redis.port())));
  const std::string key(64, 'e');
  std::thread tc([&] {
    EXPECT_THROW(c.get_or_make(key,
                               []() -> std::string {
                                 std::this_thread::sleep_for(std::chrono::milliseconds(300));
                                 throw Error("the compiler failed");
                               }),
                 Error);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  bool made_d = false;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.get_or_make(key, [] { return std::string("made by d"); }, &made_d), "made by d");
  tc.join();
  EXPECT_TRUE(made_d);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0)
      << "the failed holder's lease was released, not waited out";
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
