// Options of fusion_jit, read from FUSION_JIT_* environment variables through one table.
//
// Every variable is documented in docs/options.md. An unknown FUSION_JIT_* name, or a value that does not
// parse, is an error that names the variable: a typo never silently does nothing.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace fusion_jit {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// FUSION_JIT_DYNAMIC (Note [Sizes as kernel arguments], codegen/kernel_spec.h): whether CPU kernels read
// their sizes as arguments. auto: from a model's second compiled signature on (its first is static);
// on: always; off: never.
enum class DynamicSizes { kAuto, kOn, kOff };
// "auto", "on" or "off"; throws fusion_jit::Error naming `what` for anything else.
DynamicSizes parse_dynamic_sizes(const std::string& what, const std::string& value);

// FUSION_JIT_GEMM (Note [GEMM backend measured on this machine], passes/gemm_rules.cpp): how a float32 CPU
// linear whose weight comes with each call is computed. measure: oneDNN's where it was measured faster
// than ATen's GEMM on this machine, for its shape; aten: always ATen's; onednn: oneDNN's wherever the rule
// applies (for tests and comparisons).
enum class GemmChoice { kMeasure, kAten, kOneDnn };
// "measure", "aten" or "onednn"; throws fusion_jit::Error naming `what` for anything else.
GemmChoice parse_gemm_choice(const std::string& what, const std::string& value);

// FUSION_JIT_REMOTE_CACHE (Note [The remote tier], kernels_cache/remote_cache.h):
// redis://[user:password@]host[:port][/db] or unix:///path/to.sock[?db=N].
struct RemoteCacheUrl {
  std::string text;  // as given; "" = no remote tier
  bool unix_socket = false;
  std::string host;  // or the socket's path
  int port = 6379;
  int db = 0;
  std::string user, password;
};
// Throws fusion_jit::Error naming `what` and the value (its password hidden) for a malformed URL.
RemoteCacheUrl parse_remote_cache_url(const std::string& what, const std::string& value);

struct Options {
  LogLevel log_level = LogLevel::kWarn;
  // FUSION_JIT_DUMP: comma list of ir, plan, source, log (or all); written to stderr.
  std::set<std::string> dump;
  // FUSION_JIT_DISABLE: comma list of "fusion", "horizontal" (no side-by-side merging of independent
  // groups), "cat" (cat and stack run through ATen, not stored by their items' kernel), "gather" (embedding
  // runs through ATen, not read inside its consumers' kernel, Note [Gathered loads]), "arena" (every
  // kernel output allocated alone, Note [Static memory plan]), "in_place" (no result written into a dying
  // argument's storage, Note [Results written into a dying argument]), "cache", and the names the pass pipeline registers: its
  // passes (decompose, dce, cse, constant_fold), rule sets (decompose) and rules (decompose.softmax, ...).
  std::set<std::string> disabled;
  // FUSION_JIT_ENABLE: comma list of the pipeline's opt-in rule sets (epilogue, prepack), off by default.
  std::set<std::string> enabled;
  // FUSION_JIT_SPECIALIZATION_LIMIT: compiled signatures kept per model; later ones run eagerly.
  int specialization_limit = 8;
  // FUSION_JIT_SHARED_PLANS: plans kept per model for signatures the limit does not bound (those whose
  // kernels an earlier signature brought) and signatures recorded as eager; the least recently called are
  // dropped past it (Note [Shared plans are kept by recency], torch/graph_function.h).
  int shared_plans = 64;
  DynamicSizes dynamic = DynamicSizes::kAuto;
  GemmChoice gemm = GemmChoice::kMeasure;
  // FUSION_JIT_CACHE_DIR: the on-disk kernel cache ("" = $XDG_CACHE_HOME/fusion_jit, else
  // ~/.cache/fusion_jit). FUSION_JIT_DISABLE=cache turns it off.
  std::string cache_dir;
  // FUSION_JIT_CACHE_MAX_MB: the cache's size cap; least recently used entries are evicted past it.
  int64_t cache_max_mb = 1024;
  // FUSION_JIT_REMOTE_CACHE, _KEY_FILE, _TTL (seconds, 0: none), _TIMEOUT_MS (connect and each
  // operation), _MAX_MB (largest entry sent): the remote tier (kernels_cache/remote_cache.h).
  RemoteCacheUrl remote_cache;
  std::string remote_cache_key_file;
  int64_t remote_cache_ttl = 0;
  int remote_cache_timeout_ms = 300;
  int64_t remote_cache_max_mb = 64;
  // FUSION_JIT_PACKAGE_KEY: the key file ahead-of-time packages are signed with when built and verified with
  // when loaded (Note [Package signatures], torch/package.cpp); "" = packages are neither signed nor
  // verified. Checked as the remote tier's key file is (read_key_file, support/hash.h).
  std::string package_key_file;
  // FUSION_JIT_CXX (else CXX, else g++): the host compiler for CPU kernels.
  std::string cxx;
  // FUSION_JIT_COMPILE_JOBS: host compiler processes one plan's source is split over (Note [One plan in
  // several translation units], targets/cpu/host_compiler.cpp); 0 = the CPUs this process may run on.
  int compile_jobs = 0;
  // FUSION_JIT_ASSERT_NO_COMPILE=1: any compiler invocation is an error.
  bool assert_no_compile = false;
  // FUSION_JIT_CUDA_HOME: a CUDA toolkit directory to take NVRTC (lib64/) and its headers (include/)
  // from, before the default places (the loader's path, torch's nvidia packages, /usr/local/cuda).
  std::string cuda_home;
  // FUSION_JIT_CUDA_GRAPHS=1: compiled modules replay their plans as CUDA Graphs by default.
  bool cuda_graphs = false;
  // FUSION_JIT_CPU_GRAIN: elements per parallel chunk of a CPU kernel.
  int64_t cpu_grain = 32768;
  // FUSION_JIT_CPU_POOL_MB: megabytes of freed kernel outputs kept mapped for reuse (0 disables).
  int64_t cpu_pool_mb = 1024;
  // FUSION_JIT_STRICT=1: the Python backend raises where a graph would run eagerly. FUSION_JIT_FREEZING=1:
  // its inference graphs' parameters and buffers are constants of their plans by default. Read by the
  // Python package only, through Options::value.
  bool strict = false;
  bool freezing = false;

  bool dumps(const std::string& what) const { return dump.count(what) || dump.count("all"); }
  bool is_disabled(const std::string& what) const { return disabled.count(what) > 0; }
  bool is_enabled(const std::string& what) const { return enabled.count(what) > 0; }

  // The options from the environment, parsed once; throws fusion_jit::Error on a bad variable.
  static const Options& get();
  // Parses a given environment (NAME=VALUE strings); for tests.
  static Options parse(const char* const* envp);
  // The table's variable `name` in the environment `envp` as the table parses it (its default where
  // unset), written back as text: 0 or 1 for a switch, a sorted comma list for a list, the number, the
  // choice's name, a path or command as given (FUSION_JIT_REMOTE_CACHE: the URL as given). Only that
  // variable's entry runs, so an error names it; an unknown name is the error an unknown variable is.
  // The Python package reads its options through this (torch.ops.fusion_jit.option), with the
  // environment as it is at each use; get() is the snapshot taken at the library's first read.
  static std::string value(const std::string& name, const char* const* envp);

  // Adds names FUSION_JIT_DISABLE accepts. A layer above registers its own when the library loads,
  // before any option is read (the pass pipeline: passes/pipeline.cpp); support knows only its users'
  // names through this.
  static void register_disable_names(const std::vector<std::string>& names);
  // Every name FUSION_JIT_DISABLE accepts, sorted.
  static std::set<std::string> disable_names();
  // The same for FUSION_JIT_ENABLE: the pipeline's opt-in steps.
  static void register_enable_names(const std::vector<std::string>& names);
  static std::set<std::string> enable_names();
};

}  // namespace fusion_jit
