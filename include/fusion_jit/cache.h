// The process-wide parts of fusion_jit a service or a tool looks at: the on-disk cache of compiled kernels
// and plans, the counters of the cache and the compilers, and whether CUDA code can be compiled and run
// here. No LibTorch header: this is the API of the CLI's `cache` command and of the Python counters.
//
//   fusion_jit::counters()               cache hits and misses, compiler runs, since the process started
//   fusion_jit::cache::dir()             the cache directory (FUSION_JIT_CACHE_DIR, else
//                                        $XDG_CACHE_HOME/fusion_jit, else ~/.cache/fusion_jit; "" for none)
//   fusion_jit::cache::list(verify)      its entries; stats(), prune(max_bytes), clear()
//   fusion_jit::cache::remote()          the remote tier on Redis (FUSION_JIT_REMOTE_CACHE), pinged;
//                                        use_remote(url, key_file) sets it
//   fusion_jit::calibrate()              this machine's constants for the cost model, measured and stored;
//                                        calibration() shows the stored ones
//   fusion_jit::cuda_status()            NVRTC, the driver and the devices torch sees
//
// The cache's format and its trust rule are described in docs/ARCHITECTURE.md ("The kernel cache").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fusion_jit {

// Counters of this process since it started (they only grow; take differences to measure a span).
struct Counters {
  // The on-disk cache (kernels and plans): entries found, not found, found damaged (a miss), evicted.
  int64_t cache_hits = 0, cache_misses = 0, cache_corrupt = 0, cache_evictions = 0;
  int64_t cache_bytes_read = 0, cache_bytes_written = 0;
  // The remote tier (FUSION_JIT_REMOTE_CACHE): entries found, not found, refused (frame, key or signature
  // wrong), failed operations (timeouts included), operations skipped while it was failing, entries
  // written, bytes, and milliseconds spent in it.
  int64_t remote_hits = 0, remote_misses = 0, remote_refused = 0, remote_errors = 0, remote_skipped = 0;
  int64_t remote_writes = 0, remote_bytes_in = 0, remote_bytes_out = 0;
  double remote_ms = 0;
  int64_t host_compiles = 0;   // runs of the host compiler (CPU kernels)
  int64_t nvrtc_compiles = 0;  // runs of NVRTC (CUDA kernels)
  int64_t compiles() const { return host_compiles + nvrtc_compiles; }
};
Counters counters();

namespace cache {

struct Entry {
  std::string key;   // the SHA-256 the entry is stored under
  std::string path;
  int64_t bytes = 0;
  int64_t mtime = 0;  // seconds since the epoch: the last write or hit
  bool valid = true;  // list(true) only: the frame and checksum are intact
};

struct Stats {
  std::string dir;             // "" when there is no cache directory (compiled code is kept in memory)
  std::string unusable_reason; // why the directory is not used (not ours, writable by others...), or ""
  int64_t entries = 0, bytes = 0;
  int64_t max_bytes = 0;       // the size cap (FUSION_JIT_CACHE_MAX_MB); least recently used go first
};

// The cache directory of this process, "" when there is none.
std::string dir();
// Uses `dir` as the cache from now on (created if missing, checked as the default one is). Throws
// fusion_jit::Error when it is empty.
void use_dir(const std::string& dir);
Stats stats();
// The entries; with `verify` each one is read and checked (Entry::valid).
std::vector<Entry> list(bool verify = false);
// Removes the least recently used entries until the cache holds at most `max_bytes`; returns the bytes
// removed.
int64_t prune(int64_t max_bytes);
// Removes every entry; returns how many there were.
int64_t clear();

// The remote tier (Note [The remote tier], docs/ARCHITECTURE.md): a Redis shared by a fleet.
struct Remote {
  std::string address;     // "" when there is none (FUSION_JIT_REMOTE_CACHE unset, or no usable key file)
  bool reachable = false;  // a PING answered
  std::string error;       // why not
  double latency_ms = 0;   // of that PING
  int64_t entries = -1;    // keys under fusion_jit's namespace (-1: not counted)
};
// The process's remote tier, pinged.
Remote remote();
struct PushResult {
  int64_t entries = 0, pushed = 0, failed = 0, bytes = 0;
};
// Uploads every valid entry of the directory to the remote tier (a fleet warmed from a build machine).
// Throws fusion_jit::Error when there is no remote tier.
PushResult push();
// Uses the Redis at `url` (redis://[user:password@]host[:port][/db] or unix:///path[?db=N]) as the remote
// tier from now on, its entries signed with the key in `key_file` (a file only its owner may read).
// Throws fusion_jit::Error naming a malformed URL or an unusable key file.
void use_remote(const std::string& url, const std::string& key_file);

}  // namespace cache

// This machine's constants for the cost model (Note [Calibration], docs/ARCHITECTURE.md): measures them
// with our own kernels and one ATen step (about 5 to 15 s), stores them in the cache, where every process
// on this machine finds them, and returns the table `fusion-jit calibrate` prints; `progress` (may be
// empty) gets a line per step. Throws fusion_jit::Error when there is no usable cache to keep them in.
std::string calibrate(const std::function<void(const std::string&)>& progress = {});
// The stored calibration of this machine as that table, or "" when there is none (the defaults are used).
std::string calibration();

// Whether CUDA work is possible in this process. NVRTC (libnvrtc.so.13) is enough to compile CUDA kernels
// ahead of time; running them needs the driver (libcuda.so.1) and a device. Both are opened at first use.
struct CudaStatus {
  bool nvrtc = false;
  std::string nvrtc_problem;  // why NVRTC cannot be used, when it cannot
  int nvrtc_version = 0;      // major * 1000 + minor * 10, as NVRTC reports it (0 without NVRTC)
  bool driver = false;
  std::string driver_problem;
  int devices = 0;            // CUDA devices torch sees
};
CudaStatus cuda_status();
// Throws fusion_jit::Error naming `arch` unless NVRTC can compile for it ("sm_90", "compute_90").
void check_cuda_arch(const std::string& arch);

}  // namespace fusion_jit
