// Content hashing: SHA-256 (OpenSSL) for cache keys of generated code.
#pragma once

#include <string>
#include <string_view>

namespace fusion_jit {

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// The 32 raw bytes of SHA-256 of `data`.
std::string sha256_bytes(std::string_view data);

}  // namespace fusion_jit
