#include "runtime/buffer_pool.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "support/options.h"

namespace fusion_jit {
namespace {

struct State {
  // Read once: buffers may be released during exit, after other statics are gone.
  size_t cap = static_cast<size_t>(Options::get().cpu_pool_mb) << 20;
  std::mutex mu;
  std::multimap<size_t, void*> free_list;  // rounded size -> buffer
  BufferPool::Stats stats;
};

State& state() {
  static State* s = new State();  // never destroyed: buffers may be released during exit
  return *s;
}

}  // namespace

BufferPool& BufferPool::instance() {
  static BufferPool p;
  return p;
}

size_t BufferPool::rounded(size_t bytes) {
  // Round to 1/8 of the next power of two, so that similar sizes share buffers with little waste.
  size_t p = 1;
  while (p < bytes) p <<= 1;
  size_t step = p >= 8 ? p / 8 : 1;
  return (bytes + step - 1) / step * step;
}

void* BufferPool::acquire(size_t bytes) {
  size_t r = rounded(bytes);
  State& s = state();
  {
    std::lock_guard<std::mutex> g(s.mu);
    // The buffer released last (its lines are the likeliest still in cache): a multimap keeps equal keys
    // in insertion order, so the last of the range. Taking the first rotated through every buffer of a
    // size, each call writing memory the caches had dropped.
    auto range = s.free_list.equal_range(r);
    if (range.first != range.second) {
      auto it = std::prev(range.second);
      void* p = it->second;
      s.free_list.erase(it);
      s.stats.cached_bytes -= r;
      s.stats.hits++;
      return p;
    }
    s.stats.misses++;
  }
  void* p = std::aligned_alloc(64, (r + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}

void BufferPool::release(void* p, size_t bytes) {
  size_t r = rounded(bytes);
  State& s = state();
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.stats.cached_bytes + r <= s.cap) {
      s.free_list.emplace(r, p);
      s.stats.cached_bytes += r;
      return;
    }
  }
  std::free(p);
}

void BufferPool::clear() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  for (auto& [size, p] : s.free_list) std::free(p);
  s.free_list.clear();
  s.stats.cached_bytes = 0;
}

BufferPool::Stats BufferPool::stats() const {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  return s.stats;
}

}  // namespace fusion_jit
