#include "support/hash.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

std::string hmac_sha256(std::string_view key, const std::vector<std::string_view>& parts) {
  // OpenSSL 3's EVP_MAC (HMAC_CTX is deprecated there): one context fed each part in turn.
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  FJ_INTERNAL_ASSERT(mac != nullptr, "OpenSSL has no HMAC");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  FJ_INTERNAL_ASSERT(ctx != nullptr);
  struct Free {
    EVP_MAC_CTX* ctx;
    ~Free() { EVP_MAC_CTX_free(ctx); }
  } free_ctx{ctx};
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  FJ_INTERNAL_ASSERT(EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1);
  for (std::string_view p : parts)
    FJ_INTERNAL_ASSERT(EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1);
  unsigned char md[EVP_MAX_MD_SIZE];
  size_t len = 0;
  FJ_INTERNAL_ASSERT(EVP_MAC_final(ctx, md, &len, sizeof md) == 1);
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::optional<std::string> read_key_file(const std::string& path, std::string* why) {
  constexpr int64_t kMaxKeyFileBytes = 4096;
  // O_NOFOLLOW: a link's target could be anyone's file; the checks below are of the file opened (fstat),
  // not of a name that may change between a check and the read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *why = fmt::format("cannot open it ({})", std::strerror(errno));
    return std::nullopt;
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = "it is not a regular file";
    return std::nullopt;
  }
  if (st.st_uid != ::geteuid()) {
    *why = fmt::format("it is owned by uid {}, not by this process's ({}); chown it", st.st_uid, ::geteuid());
    return std::nullopt;
  }
  if (st.st_mode & 077) {
    *why = fmt::format("group or others may read or write it (mode {:o}); chmod 600 it", st.st_mode & 0777);
    return std::nullopt;
  }
  if (st.st_size > kMaxKeyFileBytes) {
    *why = fmt::format("it holds {} bytes, more than {}", st.st_size, kMaxKeyFileBytes);
    return std::nullopt;
  }
  std::string key(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = ::read(fd, key.data() + got, key.size() - got);
    if (n <= 0) {
      *why = "reading it failed";
      return std::nullopt;
    }
    got += static_cast<size_t>(n);
  }
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.size() < 16) {
    *why = fmt::format("it holds {} bytes; a key needs at least 16 (openssl rand -hex 32 > FILE)", key.size());
    return std::nullopt;
  }
  return key;
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
