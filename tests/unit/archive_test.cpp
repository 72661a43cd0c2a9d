// Note [Package archives]: round trip, and every defect of a file refused with its path named.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <fstream>

#include "support/archive.h"
#include "support/error.h"
#include "targets/cpu/host_compiler.h"
#include "codegen/target.h"
#include "targets/targets.h"

namespace fusion_jit {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ArchiveSections sample() {
  return {{"manifest", "{\"format\": 1}"}, {"image/0/0", std::string("\0\1\2binary\xff", 10)}, {"empty", ""}};
}

TEST(Archive, RoundTripsEverySectionByteForByte) {
  const std::string bytes = encode_archive(sample());
  EXPECT_EQ(copy_sections(decode_archive(bytes, "p.fjpkg")), sample());
  EXPECT_EQ(copy_sections(decode_archive(encode_archive({}), "p.fjpkg")), ArchiveSections{});
  // Mapped from a file, the same.
  char name[] = "/tmp/fj_archive_map_XXXXXX";
  int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  ::close(fd);
  write_file_atomically(name, bytes);
  {
    MappedFile f(name);
    EXPECT_EQ(copy_sections(decode_archive(f.bytes(), name)), sample());
  }
  ::unlink(name);
}

TEST(Archive, RefusesTruncatedAlteredAndForeignBytes) {
  const std::string bytes = encode_archive(sample());
  // Every truncation: refused, the path named.
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string cut = bytes.substr(0, n);
    std::string e = error_of([&] { decode_archive(cut, "cut.fjpkg"); });
    ASSERT_NE(e.find("cut.fjpkg: "), std::string::npos) << "length " << n << ": " << e;
  }
  // Every byte flipped: refused (the header's checks or the checksum).
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x20);
    std::string e = error_of([&] { decode_archive(b, "flip.fjpkg"); });
    ASSERT_NE(e.find("flip.fjpkg: "), std::string::npos) << "byte " << i << ": " << e;
  }
  std::string b = bytes;
  b[b.size() / 2] ^= 1;
  EXPECT_NE(error_of([&] { decode_archive(b, "x"); }).find("checksum does not match"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_archive("PK\3\4 a zip file, not a package at all......", "m.pt"); })
                .find("m.pt: not a fusion_jit package"),
            std::string::npos);
  b = bytes;
  b[8] = 9;  // container version 9, checked before the checksum
  EXPECT_NE(error_of([&] { decode_archive(b, "x"); }).find("container version 9, but this fusion_jit reads version 2"),
            std::string::npos);
}

TEST(Archive, AtomicWriteLeavesTheOldFileWhenItFails) {
  char dir_template[] = "/tmp/fj_archive_XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string path = dir + "/p.fjpkg";
  write_file_atomically(path, "old");
  write_file_atomically(path, "new contents");
  EXPECT_EQ(read_whole_file(path), "new contents");
  // A rename that fails (the path is a directory, which even root cannot replace by a file): the error
  // names the path and the temporary file is removed.
  const std::string taken = dir + "/taken.fjpkg";
  ASSERT_EQ(::mkdir(taken.c_str(), 0700), 0);
  std::string e = error_of([&] { write_file_atomically(taken, "newer"); });
  EXPECT_NE(e.find("cannot write " + taken), std::string::npos) << e;
  // A directory that does not exist.
  e = error_of([&] { write_file_atomically(dir + "/no/such/dir/p.fjpkg", "x"); });
  EXPECT_NE(e.find("cannot write " + dir + "/no/such/dir/p.fjpkg"), std::string::npos) << e;
  EXPECT_EQ(read_whole_file(path), "new contents");
  // No temporary file is left behind.
  int entries = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* ent = ::readdir(d)) entries += ent->d_name[0] != '.';
    ::closedir(d);
  }
  EXPECT_EQ(entries, 2);  // p.fjpkg and taken.fjpkg
  EXPECT_NE(error_of([&] { read_whole_file(dir + "/missing.fjpkg"); }).find("cannot read " + dir + "/missing.fjpkg"),
            std::string::npos);
  EXPECT_NE(error_of([&] { MappedFile f(dir + "/missing.fjpkg"); }).find("cannot read " + dir + "/missing.fjpkg"),
            std::string::npos);
  EXPECT_NE(error_of([&] { MappedFile f(taken); }).find("cannot read " + taken), std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(taken.c_str());
  ::rmdir(dir.c_str());
}

// Note [Packaged binaries]: the host's variants load with no compiler; native code names its CPU.
TEST(PackagedImages, CpuVariantsLoadAndNativeCodeForAnotherCpuIsRefused) {
  const Target& cpu = target_for(Device::kCPU);
  const std::string source = "extern \"C\" int fj_answer() { return 42; }\n";
  std::vector<PackagedImage> images = cpu.package_images(source, {"native", "x86-64-v2"});
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].requires, host_isa());
  EXPECT_EQ(images[1].requires, "x86-64-v2");
  for (const PackagedImage& im : images) {
    EXPECT_EQ(cpu.cannot_load(im), "");
    auto artifact = cpu.load_image(im);
    EXPECT_TRUE(artifact->has_kernel("fj_answer"));
    EXPECT_FALSE(artifact->has_kernel("fj_other"));
  }
  PackagedImage foreign = images[0];
  foreign.requires = "model name\t: Another CPU | 0123456789abcdef";
  EXPECT_NE(cpu.cannot_load(foreign).find("native code for another CPU"), std::string::npos);
  EXPECT_NE(error_of([&] { cpu.load_image(foreign); }).find("native code for another CPU"), std::string::npos);
  PackagedImage level = images[1];
  level.requires = level.variant = "x86-64-v9";
  EXPECT_NE(cpu.cannot_load(level).find("unknown CPU code variant 'x86-64-v9'"), std::string::npos);
  EXPECT_NE(error_of([&] { cpu.package_images(source, {"pentium"}); }).find("unknown CPU code variant 'pentium'"),
            std::string::npos);
  PackagedImage junk{"native", host_isa(), "not a shared object"};
  EXPECT_NE(error_of([&] { cpu.load_image(junk); }).find("cannot load the CPU kernels of a package's native code"),
            std::string::npos);
}

}  // namespace
}  // namespace fusion_jit
