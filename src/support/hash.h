// Content hashing: SHA-256 (OpenSSL) for cache keys of generated code; HMAC-SHA256 for remote entries and
// signed packages, and the key files their keys come from; the host CPU's identity in cache keys.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fusion_jit {

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// The 32 raw bytes of SHA-256 of `data`.
std::string sha256_bytes(std::string_view data);
// The 32 raw bytes of HMAC-SHA256 of `data` under `key`.
std::string hmac_sha256(std::string_view key, std::string_view data);
// The same over the concatenation of `parts`, without copying them into one string (a package's sections).
std::string hmac_sha256(std::string_view key, const std::vector<std::string_view>& parts);
// a == b, in time that depends only on the sizes (for MACs).
bool equal_in_constant_time(std::string_view a, std::string_view b);
// The secret in the key file at `path`, or nothing with *why set to the reason, which names the fix. A key
// signs code that is run (remote cache entries, packages), so the file is checked like the cache directory
// (the ssh rule): a regular file (a symbolic link is not followed) owned by this process's user that group
// and others can neither read nor write, of at most 4096 bytes, holding at least 16 once trailing newlines
// are dropped (`openssl rand -hex 32 > FILE; chmod 600 FILE`).
std::optional<std::string> read_key_file(const std::string& path, std::string* why);
// This CPU as cache keys name it: its model name and a hash of its feature flags (/proc/cpuinfo), read once.
// Native code and what was measured on one CPU are kept apart from another's by it.
const std::string& host_cpu_identity();

}  // namespace fusion_jit
