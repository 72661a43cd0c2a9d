// Content hashing: SHA-256 (OpenSSL) for cache keys of generated code; HMAC-SHA256 for remote entries;
// the host CPU's identity in cache keys.
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
// This CPU as cache keys name it: its model name and a hash of its feature flags (/proc/cpuinfo), read once.
// Native code and what was measured on one CPU are kept apart from another's by it.
const std::string& host_cpu_identity();

}  // namespace fusion_jit
