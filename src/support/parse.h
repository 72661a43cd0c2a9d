// Checked parsing of decimal integers and checked arithmetic on sizes: a number that does not fit is an
// error the caller reports with the text it came from, never a value wrapped or clamped in silence.
#pragma once

#include <cstdint>
#include <string_view>

namespace fusion_jit {

enum class ParseStatus { kOk, kMalformed, kOutOfRange };

// `text` as a decimal integer: an optional '-' (signed only), then digits, nothing else (no spaces, no
// '+'). kOutOfRange when the digits do not fit the type; *out is set only on kOk.
ParseStatus parse_int64(std::string_view text, int64_t* out);
ParseStatus parse_uint64(std::string_view text, uint64_t* out);

// a * b for a, b >= 0; false when the product does not fit int64_t.
bool checked_mul(int64_t a, int64_t b, int64_t* out);
// a << shift (a multiple of 2^shift) for a >= 0 and 0 <= shift < 63; false when it does not fit int64_t.
bool checked_shl(int64_t a, int shift, int64_t* out);

}  // namespace fusion_jit
