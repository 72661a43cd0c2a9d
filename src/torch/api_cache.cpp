// The public API over the process-wide parts (include/fusion_jit/cache.h): the kernel cache, the
// counters of the cache and the compilers, and CUDA's availability. The CLI and the Python binding use
// these instead of the layers' own headers.
#include "fusion_jit/cache.h"

#include <mutex>

#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/options.h"
#include "targets/cpu/host_compiler.h"
#include "targets/cuda/cuda_driver.h"
#include "targets/cuda/nvrtc.h"
#include "torch/cuda_support.h"

namespace fusion_jit {

Counters counters() {
  const CacheStats c = KernelsCache::instance().stats();
  Counters out;
  out.cache_hits = c.hits;
  out.cache_misses = c.misses;
  out.cache_corrupt = c.corrupt;
  out.cache_evictions = c.evictions;
  out.cache_bytes_read = c.bytes_read;
  out.cache_bytes_written = c.bytes_written;
  out.remote_hits = c.remote.hits;
  out.remote_misses = c.remote.misses;
  out.remote_refused = c.remote.refused;
  out.remote_errors = c.remote.errors;
  out.remote_skipped = c.remote.skipped;
  out.remote_writes = c.remote.writes;
  out.remote_bytes_in = c.remote.bytes_in;
  out.remote_bytes_out = c.remote.bytes_out;
  out.remote_ms = c.remote.ms;
  out.host_compiles = host_compile_stats().compiles;
  out.nvrtc_compiles = nvrtc_stats().compiles;
  return out;
}

namespace cache {

std::string dir() { return KernelsCache::instance().dir(); }

void use_dir(const std::string& d) { KernelsCache::use_dir(d); }

std::vector<Entry> list(bool verify) {
  std::vector<Entry> out;
  for (const CacheEntryInfo& e : KernelsCache::instance().list(verify)) {
    Entry x;
    x.key = e.key;
    x.path = e.path;
    x.bytes = e.bytes;
    x.mtime = e.mtime;
    x.valid = e.valid;
    out.push_back(std::move(x));
  }
  return out;
}

Stats stats() {
  KernelsCache& c = KernelsCache::instance();
  Stats s;
  s.dir = c.dir();
  s.unusable_reason = c.unusable_reason();
  s.max_bytes = c.max_bytes();
  for (const CacheEntryInfo& e : c.list()) {
    s.entries++;
    s.bytes += e.bytes;
  }
  return s;
}

int64_t prune(int64_t max_bytes) {
  FJ_CHECK(max_bytes >= 0, "cache prune: the size cap must be >= 0, got {}", max_bytes);
  return KernelsCache::instance().prune(max_bytes);
}

int64_t clear() {
  KernelsCache& c = KernelsCache::instance();
  const auto n = static_cast<int64_t>(c.list().size());
  c.clear();
  return n;
}

Remote remote() {
  Remote r;
  RemoteCache* tier = KernelsCache::instance().remote();
  if (!tier) return r;
  r.address = tier->address();
  const RemotePing p = tier->ping();
  r.reachable = p.ok;
  r.error = p.error;
  r.latency_ms = p.latency_ms;
  r.entries = p.entries;
  return r;
}

PushResult push() {
  KernelsCache& c = KernelsCache::instance();
  RemoteCache* tier = c.remote();
  FJ_CHECK(tier, "cache push: there is no remote tier (FUSION_JIT_REMOTE_CACHE and FUSION_JIT_REMOTE_CACHE_KEY_FILE)");
  PushResult r;
  for (const CacheEntryInfo& e : c.list()) {
    r.entries++;
    auto payload = c.get_local(e.key);
    if (payload && tier->put(e.key, *payload)) {
      r.pushed++;
      r.bytes += static_cast<int64_t>(payload->size());
    } else {
      r.failed++;
    }
  }
  return r;
}

void use_remote(const std::string& url, const std::string& key_file) {
  // The same tier asked for again (each module compiled with the option) keeps its connections.
  static std::mutex mu;
  static std::pair<std::string, std::string> current;
  std::lock_guard<std::mutex> g(mu);
  if (current == std::make_pair(url, key_file) && KernelsCache::instance().remote()) return;
  Options o = Options::get();
  o.remote_cache = parse_remote_cache_url("remote_cache", url);
  FJ_CHECK(!key_file.empty(), "remote_cache: a key file is required (its entries are code, signed with that key)");
  std::string why;
  FJ_CHECK(RemoteCache::read_key_file(key_file, &why), "remote_cache: the key file {} is not used: {}", key_file, why);
  o.remote_cache_key_file = key_file;
  KernelsCache::use_remote(RemoteCache::from_options(o));
  current = {url, key_file};
}

}  // namespace cache

CudaStatus cuda_status() {
  CudaStatus s;
  s.nvrtc = nvrtc_available(&s.nvrtc_problem);
  if (s.nvrtc) s.nvrtc_version = nvrtc_version();
  s.driver = cuda_driver_available(&s.driver_problem);
  s.devices = torch_cuda_device_count();
  return s;
}

}  // namespace fusion_jit
