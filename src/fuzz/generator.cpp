// The random recipes: input specifications and their tensors, and ops over earlier values drawn with eager
// in the loop (each op is kept only where eager_op accepts it).
#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>

#include "fuzz/fuzz_internal.h"
#include "ir/op_table.h"
#include "support/error.h"
#include "torch/executor.h"

namespace fusion_jit::fuzz {

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

uint64_t draw_seed(uint64_t recipe_seed) { return mix(recipe_seed, 0x5EED) >> 1; }

namespace {

using Rng = std::mt19937_64;

int uniform(Rng& r, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(r); }
bool chance(Rng& r, double p) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }
template <class T>
const T& pick(Rng& r, const std::vector<T>& v) {
  return v[static_cast<size_t>(uniform(r, 0, static_cast<int>(v.size()) - 1))];
}

// Dense values of an input, deterministic from its spec.
at::Tensor dense_values(const InputSpec& s) {
  Rng r(s.value_seed);
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  auto st = static_cast<at::ScalarType>(s.dtype);
  if (is_float_code(s.dtype)) {
    std::normal_distribution<double> nd(0, 3);
    static const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-30, 65504.0, 0.5};
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = s.specials && chance(r, 0.12) ? specials[uniform(r, 0, 9)] : nd(r);
    return at::tensor(v, at::kDouble).reshape(s.sizes).to(st);
  }
  if (s.dtype == 11) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = uniform(r, 0, 1);
    return at::tensor(v, at::kLong).reshape(s.sizes).to(at::kBool);
  }
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  if (s.dtype == 3) lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  if (s.dtype == 0) lo = 0, hi = 255;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = s.specials && chance(r, 0.05) ? (chance(r, 0.5) ? lo : hi) : uniform(r, s.dtype == 0 ? 0 : -10, 10);
  return at::tensor(v, at::kLong).reshape(s.sizes).to(st);
}

at::Tensor make_input(const InputSpec& s) {
  at::Tensor v = dense_values(s);
  int64_t nd = static_cast<int64_t>(s.sizes.size());
  switch (s.layout) {
    case Layout::kContiguous:
      return v;
    case Layout::kTransposed:
      if (nd < 2) return v;
      return v.transpose(-1, -2).contiguous().transpose(-1, -2);
    case Layout::kSliced: {
      std::vector<int64_t> big = s.sizes;
      for (auto& d : big) d += 2;
      at::Tensor base = at::zeros(big, v.options());
      at::Tensor view = base;
      for (int64_t d = 0; d < nd; ++d) view = view.narrow(d, 1, s.sizes[d]);
      if (nd == 0) view = base.view({1}).narrow(0, 0, 1).view({});
      view.copy_(v);
      return view;
    }
    case Layout::kExpanded: {
      for (int64_t d = 0; d < nd; ++d)
        if (s.sizes[d] > 1) return v.narrow(d, 0, 1).expand(s.sizes);
      return v;
    }
    case Layout::kChannelsLast:
      if (nd != 4) return v;
      return v.contiguous(at::MemoryFormat::ChannelsLast);
    case Layout::kHugeStride: {
      // A [2, K] view whose second row lies 2^31 + 16 elements after the first: offsets need int64. Only
      // the view's pages are ever touched. Data starts 2^31 elements into the storage, so that int32
      // offsets wrapping around land inside it (and read untouched zeros) instead of crashing.
      FJ_INTERNAL_ASSERT(nd == 2 && s.sizes[0] == 2 && (s.dtype == 11 || s.dtype == 0));
      const int64_t row = (int64_t{1} << 31) + 16, start = int64_t{1} << 31;
      at::Tensor base = at::empty({start + row + s.sizes[1] + 64}, v.options());
      at::Tensor view = base.as_strided(s.sizes, {row, 1}, start);
      view.copy_(v);
      return view;
    }
  }
  return v;
}

std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool* ok) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  *ok = true;
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) *ok = false;
    out[n - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

// The ops the generator draws from: the table's elementwise ops, except those with per-channel arguments
// (batch_norm's need values of their channel count: make_batch_norm).
const std::vector<const OpInfo*>& fuzz_ops() {
  static const std::vector<const OpInfo*> ops = [] {
    std::vector<const OpInfo*> v;
    for (const auto& op : all_ops()) {
      bool channel = false;
      for (const ArgSpec& a : op.args) channel = channel || a.kind == ArgKind::kChannel;
      if (op.category == OpCategory::kElementwise && !channel) v.push_back(&op);
    }
    return v;
  }();
  return ops;
}

Literal random_scalar(Rng& r, bool integral_only) {
  static const std::vector<double> doubles = {0.5, 2.0, -1.5, 1e-3, 100.0, -0.25, 3.0};
  static const std::vector<int64_t> ints = {0, 1, -1, 2, 3, -2, 7};
  if (integral_only || chance(r, 0.4)) return pick(r, ints);
  return pick(r, doubles);
}

// The largest result an elementwise op may broadcast to (the largest input shape has 32770 elements).
constexpr int64_t kMaxBroadcastNumel = 65536;

RecipeArg value_arg(int v) {
  RecipeArg a;
  a.value = v;
  return a;
}
RecipeArg lit_arg(Literal l) {
  RecipeArg a;
  a.literal = std::move(l);
  return a;
}

// A recent value (60%) or any, among those `ok` accepts; -1 when none.
int pick_value(Rng& r, const std::vector<at::Tensor>& vals, const std::function<bool(const at::Tensor&)>& ok) {
  std::vector<int> cands;
  for (int v = 0; v < static_cast<int>(vals.size()); ++v)
    if (ok(vals[static_cast<size_t>(v)])) cands.push_back(v);
  if (cands.empty()) return -1;
  return chance(r, 0.6) ? cands.back() : pick(r, cands);
}

// A dim of an nd-dim tensor, negative half of the time.
int64_t random_dim(Rng& r, int64_t nd) {
  int64_t d = uniform(r, 0, static_cast<int>(nd) - 1);
  return chance(r, 0.5) ? d - nd : d;
}

// A reduction or normalization over random dims (keepdim or not) of a value of rank >= 1.
std::optional<OpSpec> make_reduction(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return t.dim() >= 1; });
  if (v < 0) return std::nullopt;
  int64_t nd = vals[static_cast<size_t>(v)].dim();
  const auto sizes = vals[static_cast<size_t>(v)].sizes().vec();
  OpSpec s;
  s.schema = pick(r, reduction_schemas());
  std::vector<int64_t> all(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) all[static_cast<size_t>(d)] = d;
  std::shuffle(all.begin(), all.end(), r);
  std::vector<int64_t> dims(all.begin(), all.begin() + uniform(r, 1, static_cast<int>(nd)));
  std::sort(dims.begin(), dims.end());
  for (auto& d : dims)
    if (chance(r, 0.3)) d -= nd;
  bool keep = chance(r, 0.5);
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::sum.dim_IntList" || s.schema == "aten::mean.dim") {
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(keep), lit_arg(None{})});
  } else if (s.schema == "aten::amax") {
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(keep)});
  } else if (s.schema == "aten::var.correction") {
    // No correction at or past the reduced count (eager warns and returns inf or NaN).
    int64_t count = 1;
    for (int64_t d : dims) count *= sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    if (count == 0) return std::nullopt;
    int64_t correction = count > 1 && chance(r, 0.5) ? 1 : 0;
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(correction), lit_arg(keep)});
  } else if (s.schema == "aten::softmax.int" || s.schema == "aten::log_softmax.int") {
    s.args.insert(s.args.end(), {lit_arg(random_dim(r, nd)), lit_arg(None{})});
  } else {
    int k = uniform(r, 1, std::min<int>(2, static_cast<int>(nd)));
    std::vector<int64_t> shape(sizes.end() - k, sizes.end());
    if (s.schema == "aten::layer_norm")
      s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(None{}), lit_arg(None{}), lit_arg(chance(r, 0.5) ? 1e-5 : 1e-3),
                                   lit_arg(true)});
    else
      s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(None{}), lit_arg(None{})});
  }
  return s;
}

// A cat or stack of 2 or 3 values of one shape and dtype (a value may come twice), along a random dim.
std::optional<OpSpec> make_cat(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return t.dim() >= 1 && t.numel() > 0 && t.numel() <= 32768; });
  if (v < 0) return std::nullopt;
  const at::Tensor& x = vals[static_cast<size_t>(v)];
  OpSpec s;
  const bool stack = chance(r, 0.5);
  s.schema = stack ? "aten::stack" : "aten::cat";
  const int nd = static_cast<int>(x.dim()) + (stack ? 1 : 0);
  const int64_t dim = uniform(r, -nd, nd - 1), along = dim < 0 ? dim + nd : dim;
  // Items of x's dtype and shape; for cat, of any size along the dim (Note [Cats of unequal items]).
  std::vector<int> like;
  int64_t widest = x.numel();
  for (int u = 0; u < static_cast<int>(vals.size()); ++u) {
    const at::Tensor& y = vals[static_cast<size_t>(u)];
    bool ok = y.scalar_type() == x.scalar_type() && y.dim() == x.dim() && y.numel() > 0 && y.numel() <= 32768;
    for (int64_t d = 0; ok && d < x.dim(); ++d) ok = y.size(d) == x.size(d) || (!stack && d == along);
    if (!ok) continue;
    like.push_back(u);
    widest = std::max<int64_t>(widest, y.numel());
  }
  const int k = widest * 3 <= kMaxBroadcastNumel ? uniform(r, 2, 3) : 2;
  for (int i = 0; i < k; ++i) s.args.push_back(value_arg(i == 0 ? v : pick(r, like)));
  s.args.push_back(lit_arg(dim));
  return s;
}

// An embedding of the rows of a 2-d value by an integer value whose entries all lie within them, or its
// gather along dim 0 by 2-d such indices (Note [Gathered loads]); without one, the remainder of an integer
// value by the row count (in [0, rows)), which a later draw may take as the indices.
std::optional<OpSpec> make_gather(Rng& r, const std::vector<at::Tensor>& vals) {
  int t = pick_value(r, vals, [](const at::Tensor& x) { return x.dim() == 2 && x.size(0) > 0 && x.numel() <= 32768; });
  if (t < 0) return std::nullopt;
  const int64_t rows = vals[static_cast<size_t>(t)].size(0), cols = vals[static_cast<size_t>(t)].size(1);
  auto integer = [&](const at::Tensor& x) {
    return (x.scalar_type() == at::kLong || x.scalar_type() == at::kInt) && x.numel() > 0 &&
           x.numel() * std::max<int64_t>(cols, 1) <= kMaxBroadcastNumel;
  };
  OpSpec s;
  int i = pick_value(r, vals, [&](const at::Tensor& x) {
    return integer(x) && x.min().item<int64_t>() >= 0 && x.max().item<int64_t>() < rows;
  });
  if (i < 0) {
    int u = pick_value(r, vals, integer);
    if (u < 0) return std::nullopt;
    s.schema = "aten::remainder.Scalar";
    s.args = {value_arg(u), lit_arg(rows)};
    return s;
  }
  // 2-d indices no wider than the table: at times its elements along dim 0 (aten::gather).
  const at::Tensor& index = vals[static_cast<size_t>(i)];
  if (index.dim() == 2 && index.size(1) <= cols && chance(r, 0.5)) {
    s.schema = "aten::gather";
    s.args = {value_arg(t), lit_arg(int64_t{0}), value_arg(i), lit_arg(false)};
    return s;
  }
  s.schema = "aten::embedding";
  s.args = {value_arg(t), value_arg(i), lit_arg(int64_t{-1}), lit_arg(false), lit_arg(false)};
  return s;
}

// batch_norm in inference mode (GenOptions::batch_norms): a float value x of rank >= 2 and 1-d values of
// x's channel count (dim 1) and dtype as its weight, bias (each at times None), running mean and running
// variance (one with no negative element where there is one), x mostly one that has such values. Without
// them, one for a later draw: the mean of x over every dim but 1.
std::optional<OpSpec> make_batch_norm(Rng& r, const std::vector<at::Tensor>& vals) {
  auto is_input = [](const at::Tensor& t) { return t.dim() >= 2 && at::isFloatingType(t.scalar_type()) && t.size(1) > 0; };
  auto has_channels = [&](const at::Tensor& t) {
    for (const at::Tensor& c : vals)
      if (c.dim() == 1 && c.size(0) == t.size(1) && c.scalar_type() == t.scalar_type()) return true;
    return false;
  };
  // Mostly a value whose per-channel arguments exist (an earlier draw's mean, often).
  int x = chance(r, 0.75) ? pick_value(r, vals, [&](const at::Tensor& t) { return is_input(t) && has_channels(t); }) : -1;
  if (x < 0) x = pick_value(r, vals, is_input);
  if (x < 0) return std::nullopt;
  const at::Tensor& xv = vals[static_cast<size_t>(x)];
  std::vector<int> per_channel, variances;
  for (int v = 0; v < static_cast<int>(vals.size()); ++v) {
    const at::Tensor& t = vals[static_cast<size_t>(v)];
    if (t.dim() != 1 || t.size(0) != xv.size(1) || t.scalar_type() != xv.scalar_type()) continue;
    per_channel.push_back(v);
    if (t.min().item<double>() >= 0) variances.push_back(v);  // (false where it holds a NaN)
  }
  OpSpec s;
  if (per_channel.empty()) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < xv.dim(); ++d)
      if (d != 1) dims.push_back(d);
    s.schema = "aten::mean.dim";
    s.args = {value_arg(x), lit_arg(dims), lit_arg(false), lit_arg(None{})};
    return s;
  }
  // (Without a value free of negative elements, any: eager's result is NaN in those channels, and so
  // must ours be.)
  if (variances.empty()) variances = per_channel;
  auto optional = [&](double p) { return chance(r, p) ? lit_arg(None{}) : value_arg(pick(r, per_channel)); };
  s.schema = "aten::batch_norm";
  s.args = {value_arg(x), optional(0.2), optional(0.2), value_arg(pick(r, per_channel)), value_arg(pick(r, variances)),
            lit_arg(false), lit_arg(0.1), lit_arg(1e-5), lit_arg(false)};
  return s;
}

// A view or reshape of a value.
std::optional<OpSpec> make_view(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor&) { return true; });
  if (v < 0) return std::nullopt;
  const auto sizes = vals[static_cast<size_t>(v)].sizes().vec();
  int64_t nd = static_cast<int64_t>(sizes.size());
  OpSpec s;
  s.schema = pick(r, view_schemas());
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::view" || s.schema == "aten::reshape") {
    std::vector<int64_t> shape = sizes;
    int how = uniform(r, 0, 2);
    if (how == 0 && nd >= 2) {  // merge two neighbours
      size_t i = static_cast<size_t>(uniform(r, 0, static_cast<int>(nd) - 2));
      shape[i] *= shape[i + 1];
      shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    } else if (how == 1 && nd >= 1) {  // split a dim
      size_t i = static_cast<size_t>(uniform(r, 0, static_cast<int>(nd) - 1));
      int64_t n = shape[i], f = 1;
      for (int64_t c : {2, 3, 4, 5, 7, 8})
        if (n % c == 0 && n > c) f = c;
      shape[i] = n / f;
      shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(i), f);
    } else {
      shape = {-1};
    }
    s.args.push_back(lit_arg(shape));
  } else if (s.schema == "aten::permute") {
    if (nd < 2) return std::nullopt;
    std::vector<int64_t> p(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) p[static_cast<size_t>(d)] = d;
    std::shuffle(p.begin(), p.end(), r);
    s.args.push_back(lit_arg(p));
  } else if (s.schema == "aten::transpose.int") {
    if (nd < 2) return std::nullopt;
    s.args.insert(s.args.end(), {lit_arg(random_dim(r, nd)), lit_arg(random_dim(r, nd))});
  } else if (s.schema == "aten::expand") {
    std::vector<int64_t> shape = sizes;
    bool grown = false;
    for (auto& d : shape)
      if (d == 1 && !grown && chance(r, 0.7)) d = uniform(r, 2, 4), grown = true;
    if (!grown) shape.insert(shape.begin(), uniform(r, 2, 3));
    s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(false)});
  } else if (s.schema == "aten::slice.Tensor") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd), n = sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    int64_t start = n > 0 ? uniform(r, 0, static_cast<int>(n) - 1) : 0;
    int64_t end = n > 0 ? uniform(r, static_cast<int>(start) + 1, static_cast<int>(n)) : 0;
    s.args.insert(s.args.end(), {lit_arg(d), lit_arg(start), lit_arg(end), lit_arg(int64_t{uniform(r, 1, 2)})});
  } else if (s.schema == "aten::select.int") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd), n = sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    if (n < 1) return std::nullopt;
    s.args.insert(s.args.end(), {lit_arg(d), lit_arg(int64_t{uniform(r, -static_cast<int>(n), static_cast<int>(n) - 1)})});
  } else if (s.schema == "aten::squeeze.dim") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd);
    for (int64_t k = 0; k < nd; ++k)
      if (sizes[static_cast<size_t>(k)] == 1 && chance(r, 0.7)) d = k;
    s.args.push_back(lit_arg(d));
  } else {  // unsqueeze
    int64_t d = uniform(r, 0, static_cast<int>(nd));
    s.args.push_back(lit_arg(chance(r, 0.3) ? d - nd - 1 : d));
  }
  return s;
}

// A random op over a float value.
std::optional<OpSpec> make_random(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); });
  if (v < 0) return std::nullopt;
  OpSpec s;
  s.schema = pick(r, random_schemas());
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::rand_like" || s.schema == "aten::randn_like") {
    for (int i = 0; i < 5; ++i) s.args.push_back(lit_arg(None{}));
  } else if (s.schema == "aten::bernoulli") {
    s.args.push_back(lit_arg(None{}));
  } else {
    static const std::vector<double> ps = {0.1, 0.5, 0.25};
    s.args.insert(s.args.end(), {lit_arg(pick(r, ps)), lit_arg(true)});
  }
  return s;
}

// An in-place op on input `in`.
std::optional<OpSpec> make_inplace(Rng& r, const std::vector<at::Tensor>& vals, int in) {
  const at::Tensor& x = vals[static_cast<size_t>(in)];
  OpSpec s;
  s.schema = pick(r, inplace_schemas());
  s.args.push_back(value_arg(in));
  const std::string base = inplace_base(s.schema);
  if (s.schema.find(".Tensor") != std::string::npos) {
    int v = pick_value(r, vals, [&](const at::Tensor& t) {
      bool ok = true;
      return broadcast_shapes(x.sizes().vec(), t.sizes().vec(), &ok) == x.sizes().vec() && ok;
    });
    if (v < 0) return std::nullopt;
    s.args.push_back(value_arg(v));
    if (s.schema != "aten::mul_.Tensor") s.args.push_back(lit_arg(int64_t{1}));
  } else if (s.schema == "aten::add_.Scalar" || s.schema == "aten::mul_.Scalar" || s.schema == "aten::clamp_min_") {
    s.args.push_back(lit_arg(random_scalar(r, !at::isFloatingType(x.scalar_type()))));
    if (s.schema == "aten::add_.Scalar") s.args.push_back(lit_arg(int64_t{1}));
  }
  return s;
}

// The inputs of a recipe: 1 to 3 of one shape (at times broadcasting variants of it) and mostly one
// dtype; at times (`*huge`) a bool or uint8 first input whose rows lie 2^31 + 16 elements apart.
void draw_inputs(Rng& r, uint64_t seed, uint64_t attempt, Recipe* rec, bool* huge) {
  static const std::vector<int> dtypes = {6, 6, 6, 7, 5, 5, 15, 15, 3, 4, 11};
  static const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {8}, {9}, {15}, {16}, {17}, {31}, {33}, {64}, {65}, {3, 5}, {5, 1}, {4, 8},
      {0, 3}, {2, 3, 5}, {2, 1, 4, 3}, {2, 3, 4, 5}, {3, 11, 13}, {32769}, {2, 16385}};
  int base = pick(r, dtypes);
  bool specials = !chance(r, 0.3);
  *huge = chance(r, 0.04);
  std::vector<int64_t> shape = *huge ? std::vector<int64_t>{2, 33} : pick(r, shapes);
  int n_inputs = uniform(r, 1, 3);
  for (int i = 0; i < n_inputs; ++i) {
    InputSpec in;
    in.dtype = *huge && i == 0 ? 11 : (chance(r, 0.2) ? pick(r, dtypes) : base);
    in.sizes = shape;
    if (i > 0 && !in.sizes.empty() && chance(r, 0.5)) {
      // A broadcasting variant: fewer leading dims, or size-1 dims.
      if (chance(r, 0.5)) in.sizes.erase(in.sizes.begin(), in.sizes.begin() + uniform(r, 0, static_cast<int>(in.sizes.size())));
      for (auto& d : in.sizes)
        if (chance(r, 0.3)) d = 1;
    }
    static const std::vector<Layout> layouts = {Layout::kContiguous, Layout::kContiguous, Layout::kTransposed,
                                                Layout::kSliced, Layout::kExpanded, Layout::kChannelsLast};
    in.layout = *huge && i == 0 ? Layout::kHugeStride : pick(r, layouts);
    in.value_seed = mix(seed, 1000 + static_cast<uint64_t>(i) + attempt * 7);
    in.specials = specials;
    rec->inputs.push_back(in);
  }
}

// An elementwise op of the table over earlier values whose shapes broadcast together (to at most
// kMaxBroadcastNumel elements), with random literals.
std::optional<OpSpec> make_elementwise(Rng& r, const std::vector<at::Tensor>& vals) {
  const OpInfo& op = *pick(r, fuzz_ops());
  OpSpec spec;
  spec.schema = op.schema;
  std::vector<int64_t> out_shape;
  bool have_shape = false, ok = true;
  int first_tensor = -1;
  for (size_t i = 0; i < op.args.size() && ok; ++i) {
    const ArgSpec& a = op.args[i];
    RecipeArg ra;
    if (a.is_tensor()) {
      // Prefer recent values; the mask and condition of where/masked_fill must be bool.
      std::vector<int> cands;
      for (int v = 0; v < static_cast<int>(vals.size()); ++v) {
        // (type_as's second tensor only lends its dtype: any dtype does.)
        if (a.kind == ArgKind::kTensorNoPromote && op.rule != DTypeRule::kCastLike &&
            vals[static_cast<size_t>(v)].scalar_type() != at::kBool)
          continue;
        bool bok = true;
        if (have_shape) {
          // Views make values of other ranks: [n, 1] against [n] would broadcast to n^2 elements.
          auto b = broadcast_shapes(out_shape, vals[static_cast<size_t>(v)].sizes().vec(), &bok);
          int64_t numel = 1;
          for (int64_t d : b) numel *= d;
          bok = bok && numel <= kMaxBroadcastNumel;
        }
        if (bok) cands.push_back(v);
      }
      if (cands.empty()) {
        ok = false;
        break;
      }
      int v = chance(r, 0.6) ? cands.back() : pick(r, cands);
      if (chance(r, 0.3) && cands.size() > 1) v = cands[cands.size() - 2];
      ra.value = v;
      out_shape = have_shape ? broadcast_shapes(out_shape, vals[static_cast<size_t>(v)].sizes().vec(), &ok)
                             : vals[static_cast<size_t>(v)].sizes().vec();
      have_shape = true;
      if (first_tensor < 0) first_tensor = v;
    } else if (a.kind == ArgKind::kScalar || a.kind == ArgKind::kScalarNoPromote) {
      bool int_only = op.has(OpFlag::kIntegral) ||
                      (first_tensor >= 0 && !at::isFloatingType(vals[static_cast<size_t>(first_tensor)].scalar_type()) &&
                       (op.kernel_fn == "add" || op.kernel_fn == "sub" || op.kernel_fn == "rsub") && i == 2);
      ra.literal = a.has_default && chance(r, 0.5) ? a.default_value : random_scalar(r, int_only);
    } else if (a.kind == ArgKind::kOptScalar) {
      ra.literal = chance(r, 0.3) ? Literal(None{}) : random_scalar(r, false);
    } else if (a.kind == ArgKind::kMode) {
      if (op.kernel_fn == "gelu") ra.literal = std::string(chance(r, 0.5) ? "none" : "tanh");
      else ra.literal = std::string(chance(r, 0.5) ? "trunc" : "floor");
    } else if (a.kind == ArgKind::kDTypeArg) {
      static const std::vector<int64_t> codes = {11, 3, 4, 5, 15, 6, 7};
      ra.literal = pick(r, codes);
    } else {
      FJ_INTERNAL_ASSERT(a.has_default, "{}: argument {} has no default", op.schema, i);
      ra.literal = a.default_value;
    }
    spec.args.push_back(ra);
  }
  if (!ok) return std::nullopt;
  return spec;
}

// One draw of an op over `vals`: the in-place op where `inplace_here`, else by GenOptions' chances a
// reduction, view, random op (none where the recipe has an in-place op: `with_inplace`), cat, gather or
// batch_norm, else an elementwise op. nullopt where the draw found no values that fit.
std::optional<OpSpec> draw_op(Rng& r, const GenOptions& gen, const std::vector<at::Tensor>& vals, int n_in,
                              bool inplace_here, bool with_inplace) {
  const bool wide = gen.reductions + gen.views + gen.random_ops + gen.cats + gen.gathers + gen.batch_norms > 0;
  const double u = wide ? std::uniform_real_distribution<double>(0, 1)(r) : 1.0;
  // No random ops with an in-place op: such recipes run through TorchScript, whose interpreter
  // drops unused random ops (eager's op-by-op replay draws them).
  const double p_red = gen.reductions, p_view = p_red + gen.views,
               p_rand = p_view + (with_inplace ? 0.0 : gen.random_ops), p_cat = p_rand + gen.cats,
               p_gather = p_cat + gen.gathers, p_bn = p_gather + gen.batch_norms;
  if (inplace_here || u < p_bn)
    return inplace_here  ? make_inplace(r, vals, uniform(r, 0, n_in - 1))
           : u < p_red    ? make_reduction(r, vals)
           : u < p_view   ? make_view(r, vals)
           : u < p_rand   ? make_random(r, vals)
           : u < p_cat    ? make_cat(r, vals)
           : u < p_gather ? make_gather(r, vals)
                          : make_batch_norm(r, vals);
  return make_elementwise(r, vals);
}

// Runs a drawn op eagerly on the values (eager_op, with the oracle's preconditions); where eager accepts
// it, its result becomes the next value (and an in-place op's flags its self's).
bool accept_op(const OpSpec& spec, std::vector<at::Tensor>& vals, std::vector<uint8_t>& vflags) {
  std::vector<c10::IValue> stack;
  std::vector<uint8_t> flags;
  for (const auto& a : spec.args) {
    stack.push_back(a.value >= 0 ? c10::IValue(vals[static_cast<size_t>(a.value)]) : literal_to_ivalue(a.literal));
    flags.push_back(a.value >= 0 ? vflags[static_cast<size_t>(a.value)] : 0);
  }
  uint8_t res_flags = 0;
  if (!eager_op(spec.schema, stack, flags, &res_flags)) return false;
  if (!inplace_base(spec.schema).empty()) vflags.at(static_cast<size_t>(spec.args[0].value)) = res_flags;
  vals.push_back(stack.at(0).toTensor());
  vflags.push_back(res_flags);
  return true;
}

}  // namespace

std::vector<at::Tensor> make_inputs(const Recipe& r) {
  std::vector<at::Tensor> v;
  for (const auto& s : r.inputs) v.push_back(make_input(s));
  return v;
}

Recipe generate(uint64_t seed, const GenOptions& gen) {
  for (uint64_t attempt = 0;; ++attempt) {
    Rng r(mix(seed, attempt));
    Recipe rec;
    rec.seed = seed;
    bool huge = false;
    draw_inputs(r, seed, attempt, &rec, &huge);
    std::vector<at::Tensor> vals = make_inputs(rec);
    std::vector<uint8_t> vflags(vals.size(), 0);
    int n_ops = uniform(r, 2, 16);
    // Random ops draw here what check_batch's eager and fused runs will draw (Note [The fuzzer's wider
    // graphs]), so that the preconditions hold for those values too.
    at::manual_seed(draw_seed(seed));
    const int n_in = static_cast<int>(rec.inputs.size());
    // (No draws for kinds that are off: GenOptions::elementwise_only() gives campaigns 1-4's graphs.)
    // Nor in-place ops with a 4 GB huge-stride input: capture's recipes hold several copies of the inputs.
    const int inplace_at = gen.inplace > 0 && chance(r, gen.inplace) && !huge ? uniform(r, 0, n_ops - 1) : -1;
    for (int k = 0; k < n_ops; ++k) {
      for (int tries = 0; tries < 30; ++tries) {
        std::optional<OpSpec> spec = draw_op(r, gen, vals, n_in, k == inplace_at && tries < 10, inplace_at >= 0);
        if (!spec || !accept_op(*spec, vals, vflags)) continue;
        rec.ops.push_back(std::move(*spec));
        break;
      }
    }
    if (rec.ops.empty()) continue;
    int last = n_in + static_cast<int>(rec.ops.size()) - 1;
    for (int v = n_in; v < last; ++v)
      if (chance(r, 0.25)) rec.outputs.push_back(v);
    rec.outputs.push_back(last);
    return rec;
  }
}

}  // namespace fusion_jit::fuzz
