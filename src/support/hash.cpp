#include "support/hash.h"

#include <openssl/evp.h>

#include "support/error.h"

namespace fusion_jit {

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  FJ_INTERNAL_ASSERT(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) == 1);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace fusion_jit
