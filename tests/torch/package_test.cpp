// Ahead-of-time packages (fusion_jit/package.h): built, loaded with no compiler, run bit-identically to the
// JIT plan, and every refusal named.
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn_like.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/randn.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>

#include "fusion_jit/fusion_jit.h"
#include "fusion_jit/package.h"
#include "support/archive.h"
#include "targets/cpu/host_compiler.h"
#include "targets/cuda/nvrtc.h"
#include "torch/cuda_support.h"
#include "torch/executor.h"
#include "torch/graph_function.h"
#include "torch/tolerance.h"

namespace fusion_jit {
namespace {

std::string scratch_dir() {
  static const std::string dir = [] {
    char t[] = "/tmp/fj_package_test_XXXXXX";
    return std::string(::mkdtemp(t));
  }();
  return dir;
}

// A block with a matmul (an ATen step), a layer norm and a softmax (reductions), elementwise chains and a
// second output.
torch::jit::Module block() {
  at::manual_seed(42);  // the same weights in every instance
  torch::jit::Module m("Block");
  m.register_parameter("w", at::randn({32, 32}), false);
  m.register_parameter("g", at::randn({32}), false);
  m.define(R"(
def forward(self, x, y):
    h = torch.matmul(x, self.w) + y
    n = torch.layer_norm(h, [32], self.g, None, 1e-5)
    return torch.softmax(torch.gelu(n) * 2.0, -1), torch.sigmoid(h).sum(-1)
)");
  return m;
}

std::vector<c10::IValue> inputs(int64_t rows, uint64_t seed = 0) {
  at::manual_seed(seed);
  return {at::randn({rows, 32}), at::randn({rows, 32})};
}

std::vector<at::Tensor> tensors(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The package at `path` with its manifest changed by `edit`, written (checksummed) to `out`.
void rewrite_manifest(const std::string& path, const std::string& out, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = read_whole_file(path);
  ArchiveSections s = copy_sections(decode_archive(bytes, path));
  nlohmann::json m = nlohmann::json::parse(s.at("manifest"));
  edit(m);
  s["manifest"] = m.dump();
  write_file_atomically(out, encode_archive(s));
}

// One package of two signatures, built once for the tests below.
const std::string& two_signature_package() {
  static const std::string path = [] {
    std::string p = scratch_dir() + "/block.fjpkg";
    torch::jit::Module m = block();
    PackageInfo info = package(m, {inputs(8), inputs(5)}, p);
    EXPECT_EQ(info.signatures, 2);
    EXPECT_GE(info.kernels, 2);  // at least one per signature
    EXPECT_EQ(info.constant_bytes, (32 * 32 + 32) * 4);  // the weights, once for both signatures
    return p;
  }();
  return path;
}

TEST(Package, TwoSignaturesRunWithNoCompilerBitIdenticalToTheJitPlan) {
  c10::NoGradGuard no_grad;
  const std::string& path = two_signature_package();
  LoadedPackage p = load_package(path);
  ASSERT_EQ(p.signatures().size(), 2u);
  EXPECT_EQ(p.signatures()[0], "(f32[8,32], f32[8,32])");
  CompiledModule jit = compile(block());
  torch::jit::Module eager = block();
  for (int64_t rows : {8, 5}) {
    for (uint64_t seed : {1, 2}) {
      auto in = inputs(rows, seed);
      std::vector<at::Tensor> got = tensors(p(in));
      jit(in);  // the call that compiles gives the capture run's result, eager's
      std::vector<at::Tensor> want = tensors(jit(in));
      std::vector<at::Tensor> ref = tensors(eager.forward(in));
      ASSERT_EQ(got.size(), 2u);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(at::equal(got[i], want[i])) << "rows " << rows << " output " << i;
        EXPECT_TRUE(check_close(got[i], ref[i]).ok) << check_close(got[i], ref[i]).message;
      }
    }
  }
  EXPECT_NE(p.explain().find("code 0: cpu variant native"), std::string::npos) << p.explain();
  EXPECT_NE(p.explain().find("signature 1: (f32[5,32], f32[5,32])"), std::string::npos) << p.explain();
}

TEST(Package, LoadingAndRunningCompilesNothing) {
  c10::NoGradGuard no_grad;
  const std::string& path = two_signature_package();
  const int64_t compiles = host_compile_stats().compiles;
  const HostCompileStats before = host_compile_stats();
  LoadedPackage p = load_package(path);
  p(inputs(8));
  p(inputs(5));
  const HostCompileStats after = host_compile_stats();
  EXPECT_EQ(after.compiles, compiles);
  EXPECT_EQ(after.disk_hits, before.disk_hits);  // no kernel cache read either
  EXPECT_EQ(after.memory_hits, before.memory_hits);
}

TEST(Package, ACallOfAnotherSignatureNamesWhatItGotAndWhatThePackageServes) {
  c10::NoGradGuard no_grad;
  LoadedPackage p = load_package(two_signature_package());
  std::string e = error_of([&] { p(inputs(7)); });
  EXPECT_NE(e.find("no packaged signature matches the inputs (f32[7,32], f32[7,32]); the package serves "
                   "(f32[8,32], f32[8,32]), (f32[5,32], f32[5,32])"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find(two_signature_package()), std::string::npos) << e;
  // With a fallback, such a call runs there.
  torch::jit::Module eager = block();
  LoadOptions o;
  o.fallback = [&eager](const std::vector<c10::IValue>& in) { return eager.forward(in); };
  LoadedPackage q = load_package(two_signature_package(), o);
  auto in = inputs(7);
  EXPECT_TRUE(at::equal(tensors(q(in))[0], tensors(eager.forward(in))[0]));
  EXPECT_EQ(q.fallback_calls(), 1);
  q(inputs(8));
  EXPECT_EQ(q.fallback_calls(), 1);
}

TEST(Package, InputsThatRequireGradUnderGradModeAreRefused) {
  LoadedPackage p = load_package(two_signature_package());
  auto in = inputs(8);
  in[1].toTensor().requires_grad_(true);
  std::string e = error_of([&] { p(in); });
  EXPECT_NE(e.find("input 1 requires grad and grad mode is on"), std::string::npos) << e;
}

TEST(Package, AnotherFormatBuildOrTorchVersionIsRefused) {
  const std::string& path = two_signature_package();
  const std::string out = scratch_dir() + "/edited.fjpkg";
  rewrite_manifest(path, out, [](nlohmann::json& m) { m["format"] = 99; });
  EXPECT_NE(error_of([&] { load_package(out); }).find(out + ": package format 99, but this fusion_jit reads format 4"),
            std::string::npos);
  rewrite_manifest(path, out, [](nlohmann::json& m) { m["fusion_jit"]["build"] = "0123456789abcdef"; });
  std::string e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find("(build 0123456789ab), but this is fusion_jit"), std::string::npos) << e;
  rewrite_manifest(path, out, [](nlohmann::json& m) { m["torch"] = "1.13.1"; });
  e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find(out + ": built with torch 1.13.1, but this fusion_jit runs on torch 2.11.0"), std::string::npos) << e;
  // What the plans require of the machine: a requirement this build does not know, and oneDNN's bfloat16
  // kernels (Note [Prepacked weights]), refused where this CPU's oneDNN does not take bfloat16.
  rewrite_manifest(path, out, [](nlohmann::json& m) { m["requires"] = {"quantum"}; });
  e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find(out + ": its plans require 'quantum', which this fusion_jit does not know"), std::string::npos) << e;
  rewrite_manifest(path, out, [](nlohmann::json& m) { m["requires"] = {"onednn_bf16"}; });
  e = error_of([&] { load_package(out); });
  if (onednn_bf16_supported())
    EXPECT_EQ(e, "");
  else
    EXPECT_NE(e.find(out + ": its plans call oneDNN on bfloat16, which this CPU's oneDNN does not take"), std::string::npos)
        << e;
  rewrite_manifest(path, out, [](nlohmann::json& m) { m.erase("signatures"); });
  e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find(out + ": not a valid package: its manifest"), std::string::npos) << e;
}

TEST(Package, ATruncatedOrAlteredFileIsRefused) {
  const std::string bytes = read_whole_file(two_signature_package());
  const std::string out = scratch_dir() + "/damaged.fjpkg";
  write_file_atomically(out, bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(error_of([&] { load_package(out); }).find(out + ": the package's checksum does not match"), std::string::npos);
  std::string altered = bytes;
  altered[altered.size() / 3] ^= 0x40;
  write_file_atomically(out, altered);
  EXPECT_NE(error_of([&] { load_package(out); }).find(out + ": the package's checksum does not match"), std::string::npos);
  EXPECT_NE(error_of([&] { load_package(scratch_dir() + "/none.fjpkg"); }).find("cannot read " + scratch_dir() + "/none.fjpkg"),
            std::string::npos);
}

TEST(Package, NativeCodeForAnotherCpuRunsThePortableVariantOrIsRefused) {
  c10::NoGradGuard no_grad;
  const std::string& path = two_signature_package();
  const std::string out = scratch_dir() + "/foreign.fjpkg";
  auto foreign = [](nlohmann::json& m) {
    for (auto& c : m["code"]) c["images"][0]["requires"] = "model name\t: Another CPU | 0123456789abcdef";
  };
  rewrite_manifest(path, out, foreign);
  LoadedPackage p = load_package(out);
  EXPECT_NE(p.explain().find("code 0: cpu variant x86-64-v2"), std::string::npos) << p.explain();
  torch::jit::Module eager = block();
  auto in = inputs(8, 3);
  std::vector<at::Tensor> got = tensors(p(in)), ref = tensors(eager.forward(in));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(check_close(got[i], ref[i]).ok) << check_close(got[i], ref[i]).message;
  // Native code only: refused, each variant's reason given.
  rewrite_manifest(path, out, [&](nlohmann::json& m) {
    foreign(m);
    for (auto& c : m["code"]) c["images"].erase(1);
  });
  std::string e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find(out + ": none of the compiled variants of its cpu code runs on this machine (native: native code for "
                         "another CPU"),
            std::string::npos)
      << e;
}

// A shared object whose ELF constructor writes `marker` when it is loaded (dlopen runs it before it
// returns), with one symbol of a kernel's name: what someone who can write a package puts in place of its
// code. Compiled with g++ here, as the tests compile kernels anyway.
std::string constructor_library(const std::string& marker) {
  const std::string src = scratch_dir() + "/constructor.cpp", so = scratch_dir() + "/constructor.so";
  write_file_atomically(src, fmt::format(R"(#include <cstdio>
__attribute__((constructor)) static void fj_test_constructor() {{
  if (FILE* f = std::fopen("{}", "w")) {{
    std::fputs("the constructor ran\n", f);
    std::fclose(f);
  }}
}}
extern "C" void fj_kernel_0() {{}}
)",
                                         marker));
  const std::string cmd = fmt::format("g++ -shared -fPIC -o {} {}", so, src);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return read_whole_file(so);
}

// The package at `path` with every code image replaced by `image` (none when empty) and its sections
// changed by `edit`, written to `out` with the checksum recomputed: what anyone who can write the file can
// make, since XXH3 has no key.
void rewrite_package(const std::string& path, const std::string& out, const std::string& image,
                     const std::function<void(ArchiveSections&)>& edit = {}) {
  const std::string bytes = read_whole_file(path);
  ArchiveSections s = copy_sections(decode_archive(bytes, path));
  if (!image.empty())
    for (auto& [name, data] : s)
      if (name.rfind("image/", 0) == 0) data = image;
  if (edit) edit(s);
  write_file_atomically(out, encode_archive(s));
}

// `section` of a package, as JSON, changed by `edit`.
std::function<void(ArchiveSections&)> edit_json(const std::string& section, std::function<void(nlohmann::json&)> edit) {
  return [section, edit](ArchiveSections& s) {
    nlohmann::json j = nlohmann::json::parse(s.at(section));
    edit(j);
    s[section] = j.dump();
  };
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Note [Checks before code]: signed or not, a package's manifest, graphs, plans, kernel names and constants
// are read and checked before any of its code is loaded, so a malformed package is refused before a
// library constructor in it could run. Each case below replaces the code with a library whose constructor
// leaves a marker file, recomputes the checksum, and breaks one thing.
TEST(Package, MalformedManifestPlansAndKernelNamesAreRefusedBeforeAnyCodeIsLoaded) {
  const std::string& path = two_signature_package();
  const std::string out = scratch_dir() + "/malformed.fjpkg", marker = scratch_dir() + "/constructor-ran";
  const std::string library = constructor_library(marker);
  auto refused_before_code = [&](const std::string& what, const std::function<void(ArchiveSections&)>& edit,
                                 const std::string& expected) {
    ::unlink(marker.c_str());
    rewrite_package(path, out, library, edit);
    const std::string e = error_of([&] { load_package(out); });
    EXPECT_NE(e.find(out + ": " + expected), std::string::npos) << what << ": " << e;
    EXPECT_FALSE(exists(marker)) << what << ": the package's library was loaded (its constructor ran) before the "
                                            "package was refused";
  };
  auto kernel_named = [](const std::string& name) {
    // No size arguments, so that the plan reader's count of the arguments the source reads (none for a
    // name it does not define) agrees and the name itself is what is checked.
    return edit_json("plan/0", [name](nlohmann::json& j) {
      j["kernels"][0]["name"] = name;
      j["kernels"][0]["args"] = nlohmann::json::array();
      j["kernels"][0].erase("arg_of");
    });
  };
  // A name dlsym would find in libc, through the library's dependencies.
  refused_before_code("a kernel named system", kernel_named("system"),
                      "not a valid package: signature 0 calls kernel 'system', which is not the kernel of its group 0");
  refused_before_code("a kernel named after another group", kernel_named("fj_kernel_999"),
                      "not a valid package: signature 0 calls kernel 'fj_kernel_999', which is not the kernel of its group");
  refused_before_code("a plan that is not JSON", [](ArchiveSections& s) { s["plan/1"] = "{"; },
                      "not a valid package: the plan of signature 1 (f32[5,32], f32[5,32]) does not fit its graph");
  refused_before_code("a graph that does not parse", [](ArchiveSections& s) { s["graph/0"] = "graph(%0 : f32[8,32]"; },
                      "not a valid package: the graph of signature 0 (f32[8,32], f32[8,32]) does not parse");
  refused_before_code("a code index out of range",
                      edit_json("manifest", [](nlohmann::json& m) { m["signatures"][0]["code"] = {7}; }),
                      "not a valid package: signature 0's cpu source is not the one its code was compiled from");
  refused_before_code("an output kind out of range",
                      edit_json("manifest", [](nlohmann::json& m) { m["signatures"][1]["output_kind"] = 99; }),
                      "not a valid package: output kind 99");
  refused_before_code("an image section that is missing",
                      edit_json("manifest", [](nlohmann::json& m) { m["code"][0]["images"][0]["section"] = "image/9/9"; }),
                      "not a valid package: its section image/9/9 is missing");
  refused_before_code("a manifest without signatures", edit_json("manifest", [](nlohmann::json& m) { m.erase("signatures"); }),
                      "not a valid package: its manifest is not what this fusion_jit writes");
  refused_before_code("constants that do not unpickle", [](ArchiveSections& s) { s["constants"] = "not a pickle"; },
                      "not a valid package: its constants cannot be read");
  // The plans as built: nothing is malformed, so the code is loaded, and with no package key configured
  // an unsigned package is trusted as a shared library is: its constructor runs (this also shows that the
  // marker above would have been written had the library been loaded).
  ::unlink(marker.c_str());
  rewrite_package(path, out, library);
  error_of([&] { load_package(out); });  // refused or not, depending on which kernels the library has
  EXPECT_TRUE(exists(marker));
}

// A key file of `contents` at `path` with mode `mode`.
std::string key_file(const std::string& name, const std::string& contents, mode_t mode = 0600) {
  const std::string path = scratch_dir() + "/" + name;
  write_file_atomically(path, contents);
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return path;
}

// The two-signature package, signed with `key`.
const std::string& signed_package(const std::string& key) {
  static const std::string path = [&] {
    std::string p = scratch_dir() + "/signed.fjpkg";
    PackageOptions o;
    o.key_file = key;
    PackageInfo info = package(block(), {inputs(8), inputs(5)}, p, o);
    EXPECT_EQ(info.key_file, key);
    return p;
  }();
  return path;
}

LoadOptions with_key(const std::string& key) {
  LoadOptions o;
  o.key_file = key;
  return o;
}

// Note [Package signatures]: with a package key, a package is signed when built and verified when loaded,
// and one that is not signed with that key is refused before anything of it is loaded.
TEST(Package, ASignedPackageLoadsUnderItsKeyAndRunsAsEager) {
  c10::NoGradGuard no_grad;
  const std::string key = key_file("package.key", "0123456789abcdef0123456789abcdef\n");
  LoadedPackage p = load_package(signed_package(key), with_key(key));
  EXPECT_EQ(p.verified_with(), key);
  EXPECT_NE(p.explain().find("signature verified with the key in " + key), std::string::npos) << p.explain();
  torch::jit::Module eager = block();
  for (int64_t rows : {8, 5}) {
    auto in = inputs(rows, 4);
    std::vector<at::Tensor> got = tensors(p(in)), ref = tensors(eager.forward(in));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(check_close(got[i], ref[i]).ok) << check_close(got[i], ref[i]).message;
  }
  // Without a key its signature is not checked, and explain says so.
  LoadedPackage unverified = load_package(signed_package(key));
  EXPECT_EQ(unverified.verified_with(), "");
  EXPECT_NE(unverified.explain().find("signed, but not verified: no package key is configured"), std::string::npos)
      << unverified.explain();
  EXPECT_NE(load_package(two_signature_package()).explain().find("not signed: trusted as a shared library is"),
            std::string::npos);
}

TEST(Package, WithAKeyAnUnsignedPackageOrAnotherKeysIsRefused) {
  const std::string key = key_file("package.key", "0123456789abcdef0123456789abcdef\n");
  const std::string other = key_file("other.key", "fedcba9876543210fedcba9876543210\n");
  const std::string& unsigned_path = two_signature_package();
  std::string e = error_of([&] { load_package(unsigned_path, with_key(key)); });
  EXPECT_NE(e.find(unsigned_path + ": refused: the package is not signed, and a package key is configured (" + key + ")"),
            std::string::npos)
      << e;
  e = error_of([&] { load_package(signed_package(key), with_key(other)); });
  EXPECT_NE(e.find(signed_package(key) + ": refused: its signature does not verify under the key in " + other +
                   ": it was signed with another key, or changed after it was signed; nothing of it was loaded"),
            std::string::npos)
      << e;
  // A section changed after signing (an explain text: data, not code), the checksum recomputed.
  const std::string out = scratch_dir() + "/resigned.fjpkg";
  rewrite_package(signed_package(key), out, "", [](ArchiveSections& s) { s["explain/0"] += "edited\n"; });
  e = error_of([&] { load_package(out, with_key(key)); });
  EXPECT_NE(e.find(out + ": refused: its signature does not verify under the key in " + key), std::string::npos) << e;
}

// The attack of issue 63: the code replaced by a shared object with an ELF constructor, the checksum
// recomputed. With a key configured it is refused, and the constructor never runs, whether the signature
// was kept (it no longer verifies) or removed (the package is then unsigned).
TEST(Package, WithAKeyReplacedCodeIsRefusedBeforeItsConstructorRuns) {
  const std::string key = key_file("package.key", "0123456789abcdef0123456789abcdef\n");
  const std::string out = scratch_dir() + "/replaced.fjpkg", marker = scratch_dir() + "/constructor-ran-signed";
  const std::string library = constructor_library(marker);
  ::unlink(marker.c_str());
  rewrite_package(signed_package(key), out, library);
  std::string e = error_of([&] { load_package(out, with_key(key)); });
  EXPECT_NE(e.find(out + ": refused: its signature does not verify under the key in " + key), std::string::npos) << e;
  EXPECT_FALSE(exists(marker)) << "the replaced code's constructor ran";
  rewrite_package(signed_package(key), out, library, [](ArchiveSections& s) { s.erase("signature"); });
  e = error_of([&] { load_package(out, with_key(key)); });
  EXPECT_NE(e.find(out + ": refused: the package is not signed, and a package key is configured"), std::string::npos) << e;
  EXPECT_FALSE(exists(marker)) << "the replaced code's constructor ran";
}

// The key file is checked as the remote tier's (read_key_file): building and loading refuse one that
// group or others may read, naming it and the fix, and building leaves the path as it was.
TEST(Package, AKeyFileThatFailsItsCheckIsRefusedNamingIt) {
  const std::string loose = key_file("loose.key", "0123456789abcdef0123456789abcdef\n", 0644);
  std::string e = error_of([&] { load_package(two_signature_package(), with_key(loose)); });
  EXPECT_NE(e.find(two_signature_package() + ": refused: the package key file " + loose +
                   " cannot be used: group or others may read or write it (mode 644); chmod 600 it"),
            std::string::npos)
      << e;
  const std::string path = scratch_dir() + "/unsigned-kept.fjpkg";
  write_file_atomically(path, "an older file");
  PackageOptions o;
  o.key_file = loose;
  e = error_of([&] { package(block(), {inputs(4)}, path, o); });
  EXPECT_NE(e.find("package " + path + ": the package key file " + loose + " cannot be used: group or others may read"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_whole_file(path), "an older file");
  const std::string short_key = key_file("short.key", "abc\n");
  e = error_of([&] { load_package(two_signature_package(), with_key(short_key)); });
  EXPECT_NE(e.find("it holds 3 bytes; a key needs at least 16"), std::string::npos) << e;
  e = error_of([&] { load_package(two_signature_package(), with_key(scratch_dir() + "/no.key")); });
  EXPECT_NE(e.find("cannot open it (No such file or directory)"), std::string::npos) << e;
}

TEST(Package, BadSignaturesAreNamedAndLeaveThePathAsItWas) {
  const std::string path = scratch_dir() + "/kept.fjpkg";
  write_file_atomically(path, "an older file");
  torch::jit::Module m = block();
  std::string e = error_of([&] { package(m, {inputs(4), {at::randn({4, 31}), at::randn({4, 32})}}, path); });
  EXPECT_NE(e.find("package " + path + ": signature 1 (f32[4,31], f32[4,32]) cannot be captured"), std::string::npos) << e;
  e = error_of([&] { package(m, {inputs(4), inputs(4, 9)}, path); });
  EXPECT_NE(e.find("signature 1 (f32[4,32], f32[4,32]): the same signature as signature 0"), std::string::npos) << e;
  e = error_of([&] { package(m, {}, path); });
  EXPECT_NE(e.find("no input signature was given"), std::string::npos) << e;
  PackageOptions bad;
  bad.cpu_variants = {"native", "i386"};
  e = error_of([&] { package(m, {inputs(4)}, path, bad); });
  EXPECT_NE(e.find("unknown CPU code variant 'i386'"), std::string::npos) << e;
  EXPECT_EQ(read_whole_file(path), "an older file");
}

// A CUDA package, built here from CPU inputs with no GPU: per distinct source a CUBIN per architecture
// asked for, newest first (ELF images of NVIDIA's machine type that hold every kernel of the plans using
// it), then PTX for the newest; the signatures are the inputs' on cuda:0. Loading it where there is no
// GPU is refused; tests/gpu runs one on a GPU.
TEST(Package, CudaPackagesHoldACubinPerArchitectureAndPtxAndNeedAGpu) {
  std::string why;
  if (!nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC to build CUDA code: " << why;
  const std::string path = scratch_dir() + "/block-cuda.fjpkg";
  PackageOptions options;
  options.device = "cuda";
  options.cuda_archs = {"sm_80", "sm_90", "sm_80"};
  torch::jit::Module m = block();
  PackageInfo info = package(m, {inputs(8), inputs(5)}, path, options);
  EXPECT_EQ(info.signatures, 2);
  const std::string bytes = read_whole_file(path);
  const ArchiveView s = decode_archive(bytes, path);
  const nlohmann::json manifest = nlohmann::json::parse(s.at("manifest"));
  EXPECT_EQ(manifest["device"], "cuda");
  EXPECT_EQ(manifest["signatures"][1]["inputs"], "(f32[5,32]@cuda:0, f32[5,32]@cuda:0)");
  ASSERT_FALSE(manifest["code"].empty());
  std::map<int, std::vector<std::string>> kernels_of_code;
  for (size_t i = 0; i < manifest["signatures"].size(); ++i) {
    const std::string plan(s.at("plan/" + std::to_string(i)));
    static const std::regex kernel(R"(__launch_bounds__\(\d+, \d+\) (\w+)\()");
    for (const nlohmann::json& ref : manifest["signatures"][i]["code"])
      for (auto it = std::sregex_iterator(plan.begin(), plan.end(), kernel); it != std::sregex_iterator(); ++it)
        kernels_of_code[ref.get<int>()].push_back((*it)[1].str());
  }
  for (size_t c = 0; c < manifest["code"].size(); ++c) {
    const nlohmann::json& code = manifest["code"][c];
    EXPECT_EQ(code["target"], "cuda");
    ASSERT_FALSE(kernels_of_code[c].empty()) << "code " << c << " has no kernel";
    std::vector<std::string> variants;
    for (const nlohmann::json& im : code["images"]) {
      const std::string v = im["variant"].get<std::string>();
      variants.push_back(v);
      const std::string_view image = s.at(im["section"].get<std::string>());
      if (v.rfind("sm_", 0) == 0) {
        ASSERT_GT(image.size(), 20u);
        EXPECT_EQ(image.substr(0, 4), "\x7f" "ELF") << v;
        EXPECT_EQ(static_cast<unsigned char>(image[18]) | static_cast<unsigned char>(image[19]) << 8, 190) << v << ": EM_CUDA";
        for (const std::string& k : kernels_of_code[c]) EXPECT_NE(image.find(k), std::string::npos) << v << " lacks " << k;
      } else {
        EXPECT_NE(image.find(".target sm_90"), std::string::npos) << v;
        for (const std::string& k : kernels_of_code[c])
          EXPECT_NE(image.find(".entry " + k), std::string::npos) << v << " lacks " << k;
      }
    }
    EXPECT_EQ(variants, (std::vector<std::string>{"sm_90", "sm_80", "compute_90"}));
  }
  if (torch_cuda_device_count() == 0) {
    const std::string e = error_of([&] { load_package(path); });
    EXPECT_NE(e.find(path + ": its plans run on a GPU (cuda:0), but this machine has none"), std::string::npos) << e;
  }
  // Bad devices and architectures are named, and the path is left as it was.
  options.cuda_archs = {"sm_90", "sm_12"};
  std::string e = error_of([&] { package(m, {inputs(8)}, path, options); });
  EXPECT_NE(e.find("package " + path + ": --arch sm_12"), std::string::npos) << e;
  options.device = "tpu";
  e = error_of([&] { package(m, {inputs(8)}, path, options); });
  EXPECT_NE(e.find("device 'tpu': expected cpu or cuda"), std::string::npos) << e;
  EXPECT_EQ(read_whole_file(path), bytes);
}

// Graphs given as IR text with their weights (the path of Python's fusion_jit.package for an nn.Module):
// two signatures, each bit-identical to the JIT's GraphFunction plan with the same rule sets and within
// tolerance of eager; only the constants the plans read are stored (not the convolution's weight and bias
// from before the batch norm was folded into them).
TEST(Package, GraphsGivenAsIrTextRunAsTheJitGraphAndStoreOnlyTheConstantsTheyRead) {
  c10::NoGradGuard no_grad;
  auto ir = [](int64_t n) {
    const std::string x = fmt::format("f32[{},8,10,10]", n), y = fmt::format("f32[{},16,10,10]", n);
    return "graph(%0 : " + x + "):\n"
           "  %1 : f32[16,8,3,3] = fj::constant(0)\n  %2 : f32[16] = fj::constant(1)\n"
           "  %3 : f32[16] = fj::constant(2)\n  %4 : f32[16] = fj::constant(3)\n"
           "  %5 : f32[16] = fj::constant(4)\n  %6 : f32[16] = fj::constant(5)\n"
           "  %7 : " + y + " = aten::conv2d(%0, %1, %2, [1, 1], [1, 1], [1, 1], 1)\n"
           "  %8 : " + y + " = aten::batch_norm(%7, %3, %4, %5, %6, False, 0.1, 1e-05, False)\n"
           "  %9 : " + y + " = aten::relu(%8)\n  return (%9)\n";
  };
  at::manual_seed(5);
  const std::vector<at::Tensor> weights = {at::randn({16, 8, 3, 3}), at::randn({16}), at::randn({16}),
                                           at::randn({16}), at::randn({16}), at::rand({16}).add(0.5)};
  const std::vector<GraphSignature> sigs = {{{at::randn({2, 8, 10, 10})}, ir(2), weights},
                                            {{at::randn({3, 8, 10, 10})}, ir(3), weights}};
  const std::string path = scratch_dir() + "/graphs.fjpkg";
  PackageInfo info = package_graphs("conv_bn_relu", sigs, path);
  EXPECT_EQ(info.signatures, 2);
  EXPECT_EQ(info.constant_bytes, (16 * 8 * 3 * 3 + 16) * 4) << "the folded weight and bias, once for both signatures";
  LoadedPackage p = load_package(path);
  EXPECT_EQ(p.signatures().at(1), "(f32[3,8,10,10])");
  GraphFunction jit("conv_bn_relu", CompileOptions{});
  for (const GraphSignature& sig : sigs) {
    const at::Tensor x = at::randn_like(sig.inputs[0]);
    std::vector<at::Tensor> want;
    jit.add({x}, "", sig.ir, weights);
    ASSERT_EQ(jit.run({x}, "", &want), GraphFunction::Status::kRan);
    const c10::IValue got = p({x});
    ASSERT_TRUE(got.isList());
    const at::Tensor out = got.toListRef()[0].toTensor();
    EXPECT_TRUE(at::equal(out, want.at(0))) << "rows " << x.size(0);
    const at::Tensor eager = at::relu(at::batch_norm(at::conv2d(x, weights[0], weights[1], 1, 1), weights[2], weights[3],
                                                     weights[4], weights[5], false, 0.1, 1e-5, false));
    EXPECT_TRUE(check_close(out, eager).ok) << check_close(out, eager).message;
  }
  // A graph that does not fit its inputs is named, and nothing is written.
  const std::string other = scratch_dir() + "/graphs-bad.fjpkg";
  const std::string e = error_of([&] { package_graphs("conv_bn_relu", {{{at::randn({4, 8, 10, 10})}, ir(2), weights}}, other); });
  EXPECT_NE(e.find("conv_bn_relu: input 0 is f32[4,8,10,10], the graph's input is f32[2,8,10,10]"), std::string::npos) << e;
  EXPECT_NE(e.find("signature 0"), std::string::npos) << e;
  EXPECT_EQ(::access(other.c_str(), F_OK), -1);
  // For a GPU, as the GPU's JIT plans it: the batch norm folded and conv + relu one cuDNN call
  // (epilogue.cuda_conv_relu). Built here with no GPU.
  std::string why;
  if (!nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC to build CUDA code: " << why;
  PackageOptions on_gpu;
  on_gpu.device = "cuda";
  const std::string cuda_path = scratch_dir() + "/graphs-cuda.fjpkg";
  package_graphs("conv_bn_relu", sigs, cuda_path, on_gpu);
  const std::string bytes = read_whole_file(cuda_path);
  const ArchiveView sections = decode_archive(bytes, cuda_path);
  for (const char* sig : {"explain/0", "explain/1"}) {
    const std::string explain(sections.at(sig));
    EXPECT_NE(explain.find("aten::cudnn_convolution_relu"), std::string::npos) << explain;
    EXPECT_EQ(explain.find("aten::batch_norm"), std::string::npos) << explain;
  }
}

// Note [Prepacked weights]: a package stores the plain weights of its oneDNN and MKL calls and reorders
// them when it loads; the plans are the JIT's, rules and all, and run bit-identically to them.
TEST(Package, WeightsArePrepackedWhenThePackageLoads) {
  if (!at::hasMKLDNN() || !at::hasMKL()) GTEST_SKIP() << "this build of torch has no oneDNN or no MKL";
  c10::NoGradGuard no_grad;
  auto model = [] {
    at::manual_seed(11);
    torch::jit::Module m("Prepacked");
    m.register_parameter("cw", at::randn({16, 8, 3, 3}), false);
    m.register_parameter("cb", at::randn({16}), false);
    m.register_parameter("w1", at::randn({256, 256}).div(16), false);
    m.register_parameter("b1", at::randn({256}), false);
    m.register_parameter("w2", at::randn({64, 256}).div(16), false);
    m.register_parameter("b2", at::randn({64}), false);
    // A convolution and relu whose result the plan keeps (oneDNN with a post-op, channels-last), a linear
    // and relu of 2^22 multiply-adds (oneDNN with a post-op) and a float32 linear (MKL's packed GEMM).
    m.define(R"(
def forward(self, x, y):
    a = torch.relu(torch.conv2d(x, self.cw, self.cb, 1, 1)).mean([2, 3])
    b = torch.relu(torch.linear(y, self.w1, self.b1))
    return a, torch.linear(b, self.w2, self.b2)
)");
    return m;
  };
  at::manual_seed(3);
  const std::vector<c10::IValue> in = {at::randn({2, 8, 12, 12}), at::randn({64, 256})};
  const std::string path = scratch_dir() + "/prepacked.fjpkg";
  PackageInfo info = package(model(), {in}, path);
  EXPECT_EQ(info.constant_bytes, (16 * 8 * 9 + 16 + 256 * 256 + 256 + 64 * 256 + 64) * 4)
      << "the plain weights only: no prepacked buffer is stored";
  LoadedPackage p = load_package(path);
  const std::string explain = p.explain();
  // The rules epilogue.conv_relu, epilogue.linear_relu and prepack.linear_mkl fired.
  for (const char* call : {"aten: mkldnn::_convolution_pointwise", "aten: mkldnn::_linear_pointwise", "aten: mkl::_mkl_linear"})
    EXPECT_NE(explain.find(call), std::string::npos) << call << "\n" << explain;
  EXPECT_NE(explain.find("weights prepacked at load: 3 steps"), std::string::npos) << explain;
  EXPECT_GT(p.prepack_ms(), 0.0);
  EXPECT_GE(p.constants_ms(), p.prepack_ms());
  CompiledModule jit = compile(model());
  // The JIT with the rule left out, as packages are built: the same steps, run at each call.
  CompileOptions per_call_options;
  per_call_options.disable = {"constant_fold.prepacked"};
  CompiledModule per_call = compile(model(), per_call_options);
  torch::jit::Module eager = model();
  jit(in);  // compiles
  per_call(in);
  for (uint64_t seed : {1, 2}) {
    at::manual_seed(seed);
    const std::vector<c10::IValue> x = {at::randn({2, 8, 12, 12}), at::randn({64, 256})};
    std::vector<at::Tensor> got = tensors(p(x)), want = tensors(jit(x)), ref = tensors(eager.forward(x));
    std::vector<at::Tensor> unfolded = tensors(per_call(x));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::equal(got[i], want[i])) << "output " << i;
      EXPECT_TRUE(at::equal(unfolded[i], want[i])) << "output " << i;
      EXPECT_TRUE(check_close(got[i], ref[i]).ok) << check_close(got[i], ref[i]).message;
    }
  }
  EXPECT_NE(jit.explain(in).find("epilogue.linear_relu x1"), std::string::npos) << jit.explain(in);
  EXPECT_EQ(jit.explain(in).find("aten: mkl::_mkl_reorder_linear_weight"), std::string::npos) << jit.explain(in);
  EXPECT_NE(per_call.explain(in).find("aten: mkl::_mkl_reorder_linear_weight"), std::string::npos) << per_call.explain(in);
}

// The prepacking steps a package runs at load are checked against their operator's schema first (the
// checksum guards against damage, not against a graph written by hand), and the backend's path runs them at
// each call where the rule that folds them is left out, its first run's layout check included.
TEST(Package, PrepackingStepsAreCheckedAndRunInTheJitWhenNotFolded) {
  if (!at::hasMKL()) GTEST_SKIP() << "this build of torch has no MKL";
  c10::NoGradGuard no_grad;
  const std::string ir =
      "graph(%0 : f32[4,16]):\n  %1 : f32[8,16] = fj::constant(0)\n  %2 : f32[8] = fj::constant(1)\n"
      "  %3 : f32[4,8] = aten::linear(%0, %1, %2)\n  return (%3)\n";
  at::manual_seed(9);
  const std::vector<at::Tensor> weights = {at::randn({8, 16}), at::randn({8})};
  const at::Tensor x = at::randn({4, 16});
  const std::string path = scratch_dir() + "/linear.fjpkg";
  package_graphs("linear", {{{x}, ir, weights}}, path);
  const at::Tensor got = load_package(path)({x}).toListRef()[0].toTensor();
  CompileOptions per_call;
  per_call.disable = {"constant_fold.prepacked"};
  for (const CompileOptions& options : {CompileOptions{}, per_call}) {
    GraphFunction jit("linear", options);
    std::vector<at::Tensor> first;
    GraphPlanInfo info = jit.add({x}, "", ir, weights, &first);
    ASSERT_EQ(info.eager_reason, "");
    std::vector<at::Tensor> want;
    ASSERT_EQ(jit.run({x}, "", &want), GraphFunction::Status::kRan);
    EXPECT_TRUE(at::equal(first.at(0), want.at(0)));
    EXPECT_TRUE(at::equal(got, want.at(0)));
    EXPECT_EQ(jit.explain({x}, "").find("mkl::_mkl_reorder_linear_weight") != std::string::npos,
              !options.disable.empty())
        << jit.explain({x}, "");
  }
  // A package whose prepacking step does not fit the operator's schema is refused by name.
  const std::string bytes = read_whole_file(path);
  ArchiveSections s = copy_sections(decode_archive(bytes, path));
  const std::string call = "mkl::_mkl_reorder_linear_weight(%1, 4)";
  ASSERT_NE(s["graph/0"].find(call), std::string::npos) << s["graph/0"];
  s["graph/0"].replace(s["graph/0"].find(call), call.size(), "mkl::_mkl_reorder_linear_weight(%1)");
  const std::string out = scratch_dir() + "/linear-edited.fjpkg";
  write_file_atomically(out, encode_archive(s));
  const std::string e = error_of([&] { load_package(out); });
  EXPECT_NE(e.find(out + ": signature 0 (f32[4,16]): not a valid package: mkl::_mkl_reorder_linear_weight with 1 "
                         "arguments and 1 results; its schema takes 2"),
            std::string::npos)
      << e;
  // Nor is one whose graph has symbolic sizes (Note [Symbolic sizes]): a package's plans are for numbers.
  ArchiveSections sym = copy_sections(decode_archive(bytes, path));
  std::string& g = sym["graph/0"];
  ASSERT_EQ(g.rfind("graph(", 0), 0u) << g;
  g.replace(0, 6, "graph[s0=4](");
  for (size_t at = g.find("f32[4,"); at != std::string::npos; at = g.find("f32[4,", at)) g.replace(at, 6, "f32[s0,");
  const std::string out2 = scratch_dir() + "/linear-symbolic.fjpkg";
  write_file_atomically(out2, encode_archive(sym));
  const std::string e2 = error_of([&] { load_package(out2); });
  EXPECT_NE(e2.find(out2 + ": not a valid package: the graph of signature 0 "), std::string::npos) << e2;
  EXPECT_NE(e2.find("has symbolic sizes"), std::string::npos) << e2;
}

// Outputs are the caller's: one that is a constant (a frozen weight returned as it is) is a copy, and
// changing it changes no later call.
TEST(Package, OutputsDoNotAliasConstants) {
  c10::NoGradGuard no_grad;
  torch::jit::Module m("Weights");
  m.register_parameter("w", at::randn({4, 4}), false);
  m.define("def forward(self, x):\n    return x * 2.0, self.w\n");
  const std::string path = scratch_dir() + "/weights.fjpkg";
  package(m, {{at::randn({4, 4})}}, path);
  LoadedPackage p = load_package(path);
  at::Tensor x = at::randn({4, 4});
  at::Tensor w = tensors(p({x}))[1];
  const at::Tensor before = w.clone();
  w.add_(1.0);
  EXPECT_TRUE(at::equal(tensors(p({x}))[1], before));
}

}  // namespace
}  // namespace fusion_jit
