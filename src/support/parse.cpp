#include "support/parse.h"

#include <charconv>
#include <limits>

namespace fusion_jit {
namespace {

template <typename T>
ParseStatus parse_integer(std::string_view text, T* out) {
  if (text.empty()) return ParseStatus::kMalformed;
  size_t digits = text[0] == '-' && std::numeric_limits<T>::is_signed ? 1 : 0;
  if (digits == text.size()) return ParseStatus::kMalformed;
  for (size_t i = digits; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return ParseStatus::kMalformed;
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (ec == std::errc::result_out_of_range) return ParseStatus::kOutOfRange;
  if (ec != std::errc() || end != text.data() + text.size()) return ParseStatus::kMalformed;
  *out = v;
  return ParseStatus::kOk;
}

}  // namespace

ParseStatus parse_int64(std::string_view text, int64_t* out) { return parse_integer(text, out); }
ParseStatus parse_uint64(std::string_view text, uint64_t* out) { return parse_integer(text, out); }

bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

bool checked_shl(int64_t a, int shift, int64_t* out) {
  if (a < 0 || shift < 0 || shift >= 63 || a > (std::numeric_limits<int64_t>::max() >> shift)) return false;
  *out = a << shift;
  return true;
}

}  // namespace fusion_jit
