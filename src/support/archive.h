// Note [Package archives]
// One file of named sections, as `fusion-jit package` writes an ahead-of-time package (torch/package.h):
//
//   "FJPKG\n\0\0"                          8 bytes of magic
//   u32 container version, u32 sections    little-endian
//   per section: u32 name bytes, name, u64 data bytes, data
//   XXH3-128 of every byte above           16 bytes, little-endian (low 64 bits first)
//
// Reading checks the magic, the container version and the checksum before it parses anything, then every
// length against what is left: a truncated or altered file is refused with an error naming the path and
// what is wrong, never half read. The checksum guards against damage (a truncated copy, a flipped bit), not
// against someone who rewrites the file: no checksum without a key could, and a package holds code that is
// run, so it is trusted as a shared library is. So it is xxHash's XXH3-128 (Debian's libxxhash, header
// only), several times faster than SHA-256 (bench/RESULTS.md, "Figures moved out of Notes"). Writing goes
// to a temporary file in the same directory, flushed to disk and renamed over the path: a reader sees the
// old file or the new one, never a part.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace fusion_jit {

constexpr uint32_t kArchiveVersion = 2;  // 2: XXH3-128 instead of SHA-256

// Section name -> bytes.
using ArchiveSections = std::map<std::string, std::string>;
// Section name -> its bytes inside the archive's bytes (which must outlive it).
using ArchiveView = std::map<std::string, std::string_view>;

// The file's bytes for `sections`.
std::string encode_archive(const ArchiveSections& sections);
// The sections of an archive's bytes, as views into them (no copy); throws fusion_jit::Error naming `what`
// (the path) and the defect.
ArchiveView decode_archive(std::string_view bytes, const std::string& what);
ArchiveSections copy_sections(const ArchiveView& view);

// A file mapped read-only (its pages come from the page cache, not copied); throws fusion_jit::Error
// naming the path when it cannot be read.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Writes `bytes` to `path` through a temporary file and a rename; throws fusion_jit::Error naming the path
// (the temporary file is removed then, and `path` is left as it was).
void write_file_atomically(const std::string& path, const std::string& bytes);
// The whole file; throws fusion_jit::Error naming the path when it cannot be read.
std::string read_whole_file(const std::string& path);

}  // namespace fusion_jit
