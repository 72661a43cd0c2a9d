// Content hashing: SHA-256 (OpenSSL) for cache keys of generated code; HMAC-SHA256 for remote entries.
#pragma once

#include <string>
#include <string_view>

namespace fusion_jit {

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// The 32 raw bytes of SHA-256 of `data`.
std::string sha256_bytes(std::string_view data);
// The 32 raw bytes of HMAC-SHA256 of `data` under `key`.
std::string hmac_sha256(std::string_view key, std::string_view data);
// a == b, in time that depends only on the sizes (for MACs).
bool equal_in_constant_time(std::string_view a, std::string_view b);

}  // namespace fusion_jit
