// fusion-jit cache: the on-disk cache of kernels and plans, through the public API (fusion_jit/cache.h).
#include <cstdio>
#include <ctime>
#include <regex>

#include "cli/cli.h"
#include "cost/cost_model.h"  // format_bytes
#include "fusion_jit/cache.h"
#include "support/parse.h"

namespace fusion_jit::cli {

namespace {

// "512M", "2G", "100": bytes; a usage error naming the value otherwise.
int64_t parse_size(const std::string& v) {
  static const std::regex re(R"(^([0-9]+)([KMG]?)$)");
  std::smatch m;
  if (!std::regex_match(v, m, re)) usage_error("cache prune --max-size " + v + ": expected a size such as 512M or 2G");
  const int shift = m[2] == "K" ? 10 : m[2] == "M" ? 20 : m[2] == "G" ? 30 : 0;
  int64_t n = 0, bytes = 0;
  if (parse_int64(m[1].str(), &n) != ParseStatus::kOk || !checked_shl(n, shift, &bytes))
    usage_error("cache prune --max-size " + v + ": too large (at most " +
                std::to_string(std::numeric_limits<int64_t>::max() >> shift) + m[2].str() + ")");
  return bytes;
}

}  // namespace

int run_cache(const std::string& command, const std::string& max_size) {
  if (command == "stats") {
    const cache::Stats s = cache::stats();
    std::printf("directory: %s\n", s.dir.empty() ? "none" : s.dir.c_str());
    if (!s.unusable_reason.empty())
      std::printf("status: not used (%s); compiled kernels are kept in memory only\n", s.unusable_reason.c_str());
    std::printf("entries: %lld\nsize: %s of %s\n", static_cast<long long>(s.entries), format_bytes(s.bytes).c_str(),
                format_bytes(s.max_bytes).c_str());
    const std::string table = fusion_jit::calibration();
    if (table.empty())
      std::printf("calibration: none; the cost model uses its defaults (`fusion-jit calibrate` measures this machine)\n");
    else
      std::printf("%s", table.c_str());
    const cache::Remote r = cache::remote();
    if (r.address.empty()) {
      std::printf("remote: none (FUSION_JIT_REMOTE_CACHE)\n");
    } else if (!r.reachable) {
      std::printf("remote: %s, unreachable: %s\n", r.address.c_str(), r.error.c_str());
    } else {
      std::printf("remote: %s, ping %.2f ms, ", r.address.c_str(), r.latency_ms);
      if (r.entries >= 0) std::printf("%lld entries of fusion_jit\n", static_cast<long long>(r.entries));
      else std::printf("entries not counted\n");
    }
    return 0;
  }
  if (command == "ls") {
    const time_t now = ::time(nullptr);
    for (const cache::Entry& e : cache::list())
      std::printf("%s %10lld %8llds ago\n", e.key.c_str(), static_cast<long long>(e.bytes),
                  static_cast<long long>(now - e.mtime));
    return 0;
  }
  if (command == "verify") {
    const std::vector<cache::Entry> entries = cache::list(/*verify=*/true);
    int bad = 0;
    for (const cache::Entry& e : entries)
      if (!e.valid) {
        bad++;
        std::printf("BAD %s %s\n", e.key.c_str(), e.path.c_str());
      }
    std::printf("%zu entries checked, %d bad\n", entries.size(), bad);
    return bad ? 1 : 0;
  }
  if (command == "push") {
    const cache::Remote r = cache::remote();
    if (r.address.empty())
      usage_error("cache push: no remote tier (set FUSION_JIT_REMOTE_CACHE and FUSION_JIT_REMOTE_CACHE_KEY_FILE)");
    if (!r.reachable) usage_error("cache push: " + r.address + " is unreachable: " + r.error);
    const cache::PushResult p = cache::push();
    const std::string failed = p.failed ? "; " + std::to_string(p.failed) + " failed" : "";
    std::printf("pushed %lld of %lld entries (%s) to %s%s\n", static_cast<long long>(p.pushed),
                static_cast<long long>(p.entries), format_bytes(p.bytes).c_str(), r.address.c_str(), failed.c_str());
    return p.failed ? 1 : 0;
  }
  if (command == "clear") {
    const int64_t n = cache::clear();
    std::printf("removed %lld entries from %s\n", static_cast<long long>(n), cache::dir().c_str());
    return 0;
  }
  // prune
  const int64_t cap = max_size.empty() ? cache::stats().max_bytes : parse_size(max_size);
  const int64_t removed = cache::prune(cap);
  std::printf("removed %s; %zu entries left\n", format_bytes(removed).c_str(), cache::list().size());
  return 0;
}

int run_calibrate() {
  const std::string table = fusion_jit::calibrate([](const std::string& line) { std::fprintf(stderr, "calibrate: %s\n", line.c_str()); });
  std::printf("%s", table.c_str());
  std::printf("stored in %s\n", cache::dir().c_str());
  return 0;
}

}  // namespace fusion_jit::cli
