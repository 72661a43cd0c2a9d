// The CPU buffer pool (runtime/buffer_pool.h): buffers of one size come back most recently released
// first, so a plan's outputs reuse the memory the caches still hold.
#include <gtest/gtest.h>

#include "runtime/buffer_pool.h"

namespace fusion_jit {
namespace {

TEST(BufferPool, TheBufferReleasedLastIsTheFirstAcquired) {
  BufferPool& pool = BufferPool::instance();
  pool.clear();
  const size_t bytes = size_t{3} << 20;
  void* a = pool.acquire(bytes);
  void* b = pool.acquire(bytes);
  void* c = pool.acquire(bytes);
  ASSERT_NE(a, b);
  pool.release(a, bytes);
  pool.release(b, bytes);
  pool.release(c, bytes);
  EXPECT_EQ(pool.acquire(bytes), c);
  EXPECT_EQ(pool.acquire(bytes), b);
  pool.release(b, bytes);
  EXPECT_EQ(pool.acquire(bytes), b) << "the one released last, not the oldest (a)";
  EXPECT_EQ(pool.acquire(bytes), a);
  for (void* p : {a, b, c}) pool.release(p, bytes);
  pool.clear();
}

}  // namespace
}  // namespace fusion_jit
