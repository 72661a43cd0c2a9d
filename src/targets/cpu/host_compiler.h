// The host compiler: a CPU plan's C++ source to a shared object, loaded with dlopen. A source of several
// kernels compiles as several translation units at once, one per usable CPU (Note [One plan in several
// translation units]).
//
// Compiled libraries are kept in memory, and their shared objects in the on-disk kernel cache
// (kernels_cache/), by the SHA-256 of source, compiler identity (host_compiler_identity), flags and the
// host CPU's ISA: the same source is compiled once per process, and a restarted process loads it from
// disk (through a memfd) without a compiler. A cached shared object that passes the cache's checksum but
// that dlopen refuses is removed from the cache and compiled once more, with a warning. Each compile
// works in a temporary directory of its own ($TMPDIR/fusion_jit-XXXXXX), removed when it ends. Compiler flags keep IEEE semantics (no
// -ffast-math): -fno-math-errno changes no result, -fopenmp-simd enables the `omp simd` loops and the
// libmvec declarations of the prelude, -fwrapv gives integers torch's wrap-around. Not
// -fno-trapping-math: with it GCC folds (float)(int64_t)x into truncf(x), which turns -0.5 into -0.0
// where the integer round trip gives +0.0 (found by the fuzzer: 1 / x then flips from +inf to -inf).
// -fno-tree-pre -fno-thread-jumps: without AVX-512's masks GCC cannot if-convert the branches that
// partial redundancy elimination and jump threading make of a kernel's selects (a clamp's NaN check and
// bounds, with the values computed after it hoisted into the branches), and leaves the whole `omp simd`
// loop scalar, its libm calls included ("control flow in loop"; activation_block ran 3x slower than eager
// on an AVX2 machine). Neither changes a result.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fusion_jit {

class CompiledLibrary {
 public:
  // `fd`: the in-memory file the library was loaded from, closed after dlclose. It stays open while the
  // library is loaded: dlopen finds libraries by path, and /proc/self/fd/N of a closed descriptor names
  // the next library loaded through N, which dlopen would then take for this one.
  CompiledLibrary(void* handle, int fd, std::string key, double compile_ms);
  ~CompiledLibrary();
  CompiledLibrary(const CompiledLibrary&) = delete;
  CompiledLibrary& operator=(const CompiledLibrary&) = delete;
  // The address of an extern "C" function; throws fusion_jit::Error naming it when it is missing.
  void* symbol(const std::string& name) const;
  // The address of an extern "C" function, or nullptr when the library has none by that name.
  void* find_symbol(const std::string& name) const;
  const std::string& key() const { return key_; }
  double compile_ms() const { return compile_ms_; }  // 0 when it came from a cache

 private:
  void* handle_;
  int fd_;
  std::string key_;
  double compile_ms_;
};

// Note [One plan in several translation units] (host_compiler.cpp): the line before each kernel of a plan's
// source; the text before the first is the prelude every unit repeats.
inline constexpr char kKernelBreak[] = "\n// fusion_jit: kernel\n";

// `source` as at most `jobs` translation units, each the prelude and a share of the kernels (Note [One plan
// in several translation units]); the whole source when it has fewer than two kernel breaks.
std::vector<std::string> translation_units(const std::string& source, int jobs);

struct HostCompileStats {
  int64_t compiles = 0;     // compiles in this process (each of one or more translation units)
  int64_t units = 0;        // translation units compiled (Note [One plan in several translation units])
  int64_t memory_hits = 0;  // sources found already compiled
  int64_t disk_hits = 0;    // shared objects loaded from the kernel cache
  double total_ms = 0;
};

// Compiles (or finds) `source`. Throws fusion_jit::Error with the compiler's log when it fails, and when
// FUSION_JIT_ASSERT_NO_COMPILE is set and a compile would be needed.
std::shared_ptr<CompiledLibrary> compile_cpu_source(const std::string& source);
HostCompileStats host_compile_stats();
// Whether compile_cpu_source(source) would find it compiled (loaded in this process, or in the kernel
// cache) rather than run the compiler.
bool cpu_source_compiled(const std::string& source);
// The flags used, for display and cache keys: for -march=native, or for `march`.
std::string host_compile_flags();
std::string host_compile_flags(const std::string& march);
// The host CPU's model and a fingerprint of its feature flags: -march=native code runs on CPUs with the same.
const std::string& host_isa();
// The identity of the host compiler command `cxx` (FUSION_JIT_CXX: it may be several words, such as
// "ccache g++" or "g++ -fno-plt"), for cache keys: the whole command, what `cxx --version` prints, and the
// path and a SHA-256 fingerprint of each binary that compiles: the first word and, after a wrapper
// (ccache, sccache, distcc, icecc, env, nice, nohup, time), the first later word that is no option or
// VAR=VALUE and that `command -v` finds. Computed once per command in a process.
std::string host_compiler_identity(const std::string& cxx);
// The kernel cache key of `source` compiled by `cxx` (default: the FUSION_JIT_CXX option).
std::string cpu_source_cache_key(const std::string& source, const std::string& cxx);
std::string cpu_source_cache_key(const std::string& source);
std::string cpu_source_cache_key(const std::string& source, const std::string& cxx, const std::string& march);

// Note [Packaged binaries] (codegen/target.h): `source` compiled with -march=`march` ("native" or an x86-64
// level), the shared object's bytes, through the kernel cache (compiled there when missing).
std::string cpu_library_image(const std::string& source, const std::string& march);
// A shared object's bytes loaded through a memfd, with no compiler and no cache; `name` for messages.
std::shared_ptr<CompiledLibrary> load_cpu_library_image(const std::string& image, const std::string& name);
// Why code built with -march=`march` cannot run on this CPU, or "" ("native": the caller compares host_isa).
std::string cpu_cannot_run(const std::string& march);

}  // namespace fusion_jit
