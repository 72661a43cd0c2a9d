// A pool of large CPU buffers for the outputs of generated kernels.
//
// A fresh multi-megabyte allocation is returned to the OS when freed and page-faulted again when next
// written: on our machines that costs more than the kernel itself (a 64 MB output: ~15 ms of faults for
// ~3 ms of work). Buffers released here are kept (up to a cap, FUSION_JIT_CPU_POOL_MB) and handed out
// again for a request of the same rounded size, already mapped. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusion_jit {

class BufferPool {
 public:
  // Requests below this size are not pooled (malloc serves them well).
  static constexpr size_t kMinPooled = size_t{1} << 20;

  static BufferPool& instance();
  // A 64-byte aligned buffer of at least `bytes`; never null (throws std::bad_alloc).
  void* acquire(size_t bytes);
  // Gives a buffer from acquire() back; kept for reuse while the pool holds less than its cap.
  void release(void* p, size_t bytes);
  void clear();

  struct Stats {
    int64_t hits = 0, misses = 0;
    size_t cached_bytes = 0;
  };
  Stats stats() const;
  static size_t rounded(size_t bytes);

 private:
  BufferPool() = default;
};

}  // namespace fusion_jit
