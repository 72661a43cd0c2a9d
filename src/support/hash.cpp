#include "support/hash.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fstream>

#include "support/error.h"

namespace fusion_jit {

std::string sha256_bytes(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  FJ_INTERNAL_ASSERT(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) == 1);
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string sha256_hex(std::string_view data) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : sha256_bytes(data)) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  FJ_INTERNAL_ASSERT(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                          reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len) != nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

const std::string& host_cpu_identity() {
  static const std::string cpu = [] {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(f, line) && (model.empty() || flags.empty())) {
      if (model.empty() && line.rfind("model name", 0) == 0) model = line;
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
    return model + " | " + sha256_hex(flags).substr(0, 16);
  }();
  return cpu;
}

}  // namespace fusion_jit
