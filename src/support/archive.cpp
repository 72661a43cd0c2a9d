#include "support/archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "support/error.h"

namespace fusion_jit {
namespace {

constexpr char kMagic[8] = {'F', 'J', 'P', 'K', 'G', '\n', '\0', '\0'};
constexpr size_t kDigest = 16;

// XXH3-128 of `bytes`, low 64 bits first, little-endian.
std::string checksum(std::string_view bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  std::string out;
  for (uint64_t half : {h.low64, h.high64})
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((half >> (8 * i)) & 0xff));
  return out;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads little-endian fields from a bounded range; every read is checked against what is left.
class Reader {
 public:
  Reader(std::string_view bytes, size_t end, const std::string& what) : bytes_(bytes), end_(end), what_(what) {}
  uint64_t uint(int width, const char* field) {
    need(static_cast<uint64_t>(width), field);
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += static_cast<size_t>(width);
    return v;
  }
  std::string_view bytes(uint64_t n, const char* field) {
    need(n, field);
    std::string_view s = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  bool done() const { return pos_ == end_; }
  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n, const char* field) {
    FJ_CHECK(n <= end_ - pos_, "{}: not a valid package: its {} at byte {} runs past the end", what_, field, pos_);
  }
  std::string_view bytes_;
  size_t end_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

std::string encode_archive(const ArchiveSections& sections) {
  std::string out(kMagic, sizeof(kMagic));
  put_u32(out, kArchiveVersion);
  put_u32(out, static_cast<uint32_t>(sections.size()));
  for (const auto& [name, data] : sections) {
    put_u32(out, static_cast<uint32_t>(name.size()));
    out += name;
    put_u64(out, data.size());
    out += data;
  }
  out += checksum(out);
  return out;
}

ArchiveView decode_archive(std::string_view bytes, const std::string& what) {
  FJ_CHECK(bytes.size() >= sizeof(kMagic) + 8 + kDigest && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0,
           "{}: not a fusion_jit package (no package header; {} bytes)", what, bytes.size());
  const size_t body = bytes.size() - kDigest;
  Reader r(bytes, body, what);
  r.bytes(sizeof(kMagic), "magic");
  const uint64_t version = r.uint(4, "container version");
  FJ_CHECK(version == kArchiveVersion, "{}: package container version {}, but this fusion_jit reads version {}", what,
           version, kArchiveVersion);
  FJ_CHECK(checksum(bytes.substr(0, body)) == bytes.substr(body),
           "{}: the package's checksum does not match its contents (a truncated or altered file)", what);
  const uint64_t count = r.uint(4, "section count");
  ArchiveView out;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t name_bytes = r.uint(4, "section name length");
    std::string name(r.bytes(name_bytes, "section name"));
    const uint64_t data_bytes = r.uint(8, "section length");
    FJ_CHECK(out.emplace(std::move(name), r.bytes(data_bytes, "section data")).second,
             "{}: not a valid package: section {} appears twice", what, i);
  }
  FJ_CHECK(r.done(), "{}: not a valid package: {} bytes after its last section", what, body - r.pos());
  return out;
}

ArchiveSections copy_sections(const ArchiveView& view) {
  ArchiveSections out;
  for (const auto& [name, data] : view) out.emplace(name, std::string(data));
  return out;
}

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FJ_CHECK(fd >= 0, "cannot read {}: {}", path, std::strerror(errno));
  struct stat st;
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  if (!err && !S_ISREG(st.st_mode)) err = EISDIR;
  if (!err && st.st_size > 0) {
    size_ = static_cast<size_t>(st.st_size);
    data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (data_ == MAP_FAILED) {
      err = errno;
      data_ = nullptr;
      size_ = 0;
    }
  }
  ::close(fd);
  FJ_CHECK(err == 0, "cannot read {}: {}", path, std::strerror(err));
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  FJ_CHECK(fd >= 0, "cannot write {}: cannot create a temporary file next to it: {}", path, std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    FJ_CHECK(false, "cannot write {}: {}", path, std::strerror(err));
  }
}

std::string read_whole_file(const std::string& path) {
  const MappedFile f(path);
  return std::string(f.bytes());
}

}  // namespace fusion_jit
