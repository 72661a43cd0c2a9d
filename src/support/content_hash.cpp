#include "support/content_hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fusion_jit {

ContentHash content_hash(const void* data, size_t bytes) {
  const XXH128_hash_t h = XXH3_128bits(data, bytes);
  return {h.low64, h.high64};
}

ContentHash combine_hashes(const ContentHash* pieces, size_t count) {
  return content_hash(pieces, count * sizeof(ContentHash));
}

}  // namespace fusion_jit
