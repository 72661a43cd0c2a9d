// A 128-bit hash of memory contents (XXH3-128), for telling "the same bytes as before" at memory speed:
// the executor's check that a weight reordered at an earlier call is unchanged (Note [Weights reordered
// once per content], torch/executor.h). Not a MAC: it detects changes, not an adversary who chooses bytes
// to collide (one who can write the weights chooses the results anyway).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusion_jit {

struct ContentHash {
  uint64_t low = 0, high = 0;
  bool operator==(const ContentHash& o) const { return low == o.low && high == o.high; }
  bool operator!=(const ContentHash& o) const { return !(*this == o); }
};

// XXH3-128 of `bytes` bytes at `data`.
ContentHash content_hash(const void* data, size_t bytes);
// XXH3-128 of the hashes of `count` pieces, in order: pieces hashed apart (on several threads) and then
// combined, so the result depends on the piece size, never on the number of threads.
ContentHash combine_hashes(const ContentHash* pieces, size_t count);

}  // namespace fusion_jit
