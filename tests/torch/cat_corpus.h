// The cat corpus (Note [Cats of unequal items]): cats whose items differ in size along the cat's dim, each
// one kernel over the result with a piece per item: a key cache and this step's rotated keys (rotary's
// cat inside an item), along the innermost dim with a consumer, three items, an empty item skipped,
// channels-last and transposed items, float16, int64 with broadcast producers, and items whose producers
// cannot be owned by one item (read elsewhere, or feeding two items). Shared by the CPU tests against
// eager, the NVRTC corpus and the GPU tests.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace fusion_jit::testing {

struct CatCase {
  const char* name;
  const char* args;
  const char* body;
  std::vector<at::Tensor> inputs;  // on CPU
  size_t kernels;                  // generated kernels of the plan, none of them an ATen cat
};

inline std::vector<CatCase> cat_cases() {
  at::manual_seed(0);
  auto nhwc = [](at::Tensor t) { return t.contiguous(at::MemoryFormat::ChannelsLast); };
  return {
      {"kv_cache_rotary", "past, k, c, s",
       "    h = k.shape[-1] // 2\n    r = torch.cat((-k[..., h:], k[..., :h]), -1)\n"
       "    return torch.cat((past, k * c + r * s), 2)",
       {at::randn({2, 3, 7, 16}), at::randn({2, 3, 1, 16}), at::randn({1, 1, 1, 16}), at::randn({1, 1, 1, 16})}, 1},
      {"kv_cache_prefill", "past, k, c, s",
       "    h = k.shape[-1] // 2\n    r = torch.cat((-k[..., h:], k[..., :h]), -1)\n"
       "    return torch.cat((past, k * c + r * s), -2)",
       {at::randn({1, 2, 5, 8}), at::randn({1, 2, 3, 8}), at::randn({3, 8}), at::randn({3, 8})}, 1},
      {"innermost_read_on", "x, y", "    return torch.cat((x.exp(), y * 2.0, x), -1).relu() + 1.0",
       {at::randn({4, 3}), at::randn({4, 5})}, 1},
      {"three_items_dim0", "a, b, c", "    return torch.cat((a.sigmoid(), b, c.neg()), 0)",
       {at::randn({1, 6}), at::randn({4, 6}), at::randn({2, 6})}, 1},
      {"empty_item_skipped", "a, e, b", "    return torch.cat((a * 2.0, e, b + 1.0), 1)",
       {at::randn({2, 3, 4}), at::randn({2, 0, 4}), at::randn({2, 5, 4})}, 1},
      {"channels_last_along_channels", "x, y", "    return torch.cat((x.relu(), y * 2.0), 1)",
       {nhwc(at::randn({2, 3, 5, 4})), nhwc(at::randn({2, 6, 5, 4}))}, 1},
      {"transposed_items", "x, y", "    return torch.cat((x.t() * 2.0, y.t().exp()), 0)",
       {at::randn({6, 4}), at::randn({6, 9})}, 1},
      {"float16", "x, y", "    return torch.cat((x * 0.5, y + 1.0), 1)",
       {at::randn({3, 9}).to(at::kHalf), at::randn({3, 2}).to(at::kHalf)}, 1},
      {"int64_broadcast_producers", "x, y, z", "    return torch.cat((x * 3 + z, y % 5), 0)",
       {at::randint(-50, 50, {3, 9}), at::randint(-50, 50, {1, 9}), at::randint(-5, 5, {9})}, 1},
      {"producer_read_elsewhere", "x, y", "    e = y.exp()\n    return torch.cat((x, e), 0), e.sum()",
       {at::randn({3, 4}), at::randn({5, 4})}, 2},
      {"producer_feeding_two_items", "x, y", "    e = y.exp()\n    return torch.cat((e, x, e + 1.0), 0)",
       {at::randn({3, 4}), at::randn({5, 4})}, 2},
  };
}

}  // namespace fusion_jit::testing
