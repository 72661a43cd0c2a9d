// Ahead-of-time packages (fusion_jit/package.h): building one from a module, loading and running it.
//
// Note [Package layout]
// The archive (Note [Package archives], support/archive.h) has these sections:
//   manifest          JSON: format, the fusion_jit version and build, the torch version, the machine it was
//                     built on, the device its plans run on, `requires` (what the plans need of the machine
//                     besides their code: "onednn_bf16"), `code` (per distinct generated source: its target, arch, SHA-256 and
//                     compiled variants, each with what it requires and its section) and `signatures` (per
//                     signature: its bytes as input_signature gives them, in hex, the inputs described, the
//                     output kind, whether steps may write into dying arguments, and the code each of its
//                     plan's TargetCodes is, by index into `code`)
//   graph/<i>         the optimized graph of signature i, as IR text (parsed back to the same value ids)
//   plan/<i>          its plan, as plan_io writes it (the sources inside)
//   constants         every signature's constants table, one tuple each, in one pickle (torch::pickle_save):
//                     the weights the signatures share are stored once
//   explain/<i>       its explain text at build
//   image/<c>/<k>     variant k of code c: the bytes the target loads (a shared object for the CPU)
//   signature         with a package key: the MAC of every other section (Note [Package signatures])
// Loading verifies the signature where a key is configured, checks the manifest's versions, picks each
// code's first variant this machine can run (Target::cannot_load), unpickles the constants, then per
// signature parses the graph, reads the plan against it, checks that each TargetCode's source is the one
// that code was compiled from (its SHA-256) and that every kernel name is its group's kernel, defined in that
// source, prepacks weights (Note [Prepacked weights]: the steps the JIT folds at plan build, run once here)
// and resolves the ATen steps, as the JIT path does after build_plan; only then does it load the code
// (Target::load_image) and check that every kernel is in it (Note [Checks before code]). The explain text
// is the build's: it lists those steps among the ATen steps, and a line added at load says they ran.
//
// Note [Package signatures]
// A package holds native code that loading runs: a CPU image is dlopened, and an ELF constructor in it runs
// inside dlopen, before any check after it could refuse the package. The archive's checksum cannot be that
// check: XXH3 has no key, so whoever can write the file can recompute it. With a package key configured
// (PackageOptions::key_file or LoadOptions::key_file, else FUSION_JIT_PACKAGE_KEY; the file checked by
// read_key_file, as the remote tier's: ours, mode 600, 16 to 4096 bytes), the builder adds a section
// "signature": HMAC-SHA256 under the key over the domain string kSignatureDomain and then every other
// section in the archive's (name) order, each as u32 name length, name, u64 data length, data,
// little-endian. The lengths keep bytes from moving between a name and its data or from one section to
// the next, and the domain string keeps the MAC apart from the remote tier's, which may use the same key.
// A loader with a key verifies it (CRYPTO_memcmp, support/hash.h) right after the checksum and before it
// parses anything, and refuses a package that has no signature or whose MAC differs (another key, or a
// change after signing): the error names the path, the key file and the cause, and nothing of the package
// was loaded. A loader without a key does not check a signature: an unsigned package is trusted code, as a
// shared library is, and explain says so. Verifying reads every byte once more through SHA-256 (its
// cost: bench/RESULTS.md, "Figures moved out of Notes"); without a key it costs nothing.
//
// Note [Checks before code]
// Signed or not, everything of a package that is data is read and checked before any of its code is loaded:
// the manifest, the graphs, the plans (plan_io checks them against their graphs), the code each plan names
// (by index and source hash), every kernel name, the constants, prepacking and the ATen steps. A kernel
// name is looked up with dlsym in the loaded library, whose search reaches its dependencies (libc), so a
// name must be "fj_kernel_<its group>", as codegen names it (codegen/kernel_spec.h), and be defined in the
// source its code was compiled from. A malformed package is so refused before a library constructor could
// run, whether or not it is signed; after loading, each kernel is looked up in its code (Artifact::has_kernel).
#include "fusion_jit/package.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "driver/build_plan.h"
#include "driver/plan_io.h"
#include "ir/graph.h"
#include "support/archive.h"
#include "support/error.h"
#include "support/hash.h"
#include "support/options.h"
#include "targets/targets.h"
#include "torch/cuda_support.h"
#include "torch/executor.h"
#include "torch/graph_function.h"
#include "torch/module_access.h"
#include "torch/session.h"

#ifndef FJ_BUILD_ID
#define FJ_BUILD_ID "unknown"
#endif
#ifndef FJ_VERSION
#define FJ_VERSION "unknown"
#endif
#ifndef FJ_TORCH_VERSION
#define FJ_TORCH_VERSION "unknown"
#endif

namespace fusion_jit {
namespace {

using json = nlohmann::json;
// 2: the manifest names the device its plans run on. 3: weights are prepacked when the package loads (Note
// [Prepacked weights]), and the manifest lists what the plans require of the machine ("requires").
// 4: a package may carry a "signature" section (Note [Package signatures]).
constexpr int kPackageFormat = 4;
// What a package's plans may require of the machine that loads it, besides what its code's images require.
constexpr const char* kRequiresOnednnBf16 = "onednn_bf16";
// Note [Package signatures].
constexpr const char* kSignatureSection = "signature";
constexpr std::string_view kSignatureDomain = "fusion_jit package signature 1\n";

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// `on_cuda`: as the CPU tensors would be on cuda:0 (a CUDA package's signatures).
std::string describe_inputs(const std::vector<c10::IValue>& inputs, bool on_cuda = false) {
  std::vector<std::string> parts;
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      parts.push_back(tensor_type_of(t).str() + (on_cuda ? "@cuda:0" : "") + (t.requires_grad() ? " requires_grad" : ""));
    } else {
      std::ostringstream os;
      os << v;
      parts.push_back(os.str());
    }
  }
  return fmt::format("({})", fmt::join(parts, ", "));
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string from_hex(const std::string& hex, const std::string& what) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    detail::throw_error(fmt::format("{}: not a valid package: a signature is not hex", what));
  };
  FJ_CHECK(hex.size() % 2 == 0, "{}: not a valid package: a signature is not hex", what);
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  return out;
}

// A package key: the file it was read from and the secret in it.
struct PackageKey {
  std::string file;
  std::string secret;
};

// The key of `given`, else of FUSION_JIT_PACKAGE_KEY; none where neither names a file. A file that fails
// read_key_file's check is an error beginning with `what` that names the file and the fix: a key that was
// asked for is never silently not used (a package would be written unsigned, or loaded unverified).
std::optional<PackageKey> package_key(const std::string& given, const std::string& what) {
  const std::string file = given.empty() ? Options::get().package_key_file : given;
  if (file.empty()) return std::nullopt;
  std::string why;
  std::optional<std::string> secret = read_key_file(file, &why);
  FJ_CHECK(secret.has_value(), "{}: the package key file {}{} cannot be used: {}", what, file,
           given.empty() ? " (FUSION_JIT_PACKAGE_KEY)" : "", why);
  return PackageKey{file, std::move(*secret)};
}

void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Note [Package signatures]: the MAC of every section but the signature, under `key`. `Sections` maps
// names to bytes (ArchiveSections when writing, ArchiveView when loading), in name order.
template <typename Sections>
std::string package_mac(std::string_view key, const Sections& sections) {
  std::vector<std::string> heads;
  heads.reserve(sections.size());  // no reallocation: `parts` points into these strings
  std::vector<std::string_view> parts{kSignatureDomain};
  for (const auto& [name, data] : sections) {
    if (name == kSignatureSection) continue;
    std::string head;
    put_le(&head, name.size(), 4);
    head += name;
    put_le(&head, data.size(), 8);
    heads.push_back(std::move(head));
    parts.push_back(heads.back());
    parts.push_back(std::string_view(data));
  }
  return hmac_sha256(key, parts);
}

// `v` on cuda:0 when it is a tensor (`moved`: the tensors moved already, by their CPU original).
c10::IValue on_cuda0(const c10::IValue& v, std::unordered_map<const c10::TensorImpl*, at::Tensor>* moved) {
  if (!v.isTensor() || !v.toTensor().defined()) return v;
  const at::Tensor& t = v.toTensor();
  auto it = moved->find(t.unsafeGetTensorImpl());
  if (it == moved->end()) it = moved->emplace(t.unsafeGetTensorImpl(), t.to(c10::Device(c10::kCUDA, 0))).first;
  return it->second;
}

std::string grad_blocker(const std::vector<c10::IValue>& inputs) {
  const int i = grad_requiring_input(inputs);
  if (i < 0) return "";
  return fmt::format("input {} requires grad and grad mode is on: packaged plans record no autograd history "
                     "(call under torch::NoGradGuard)",
                     i);
}

// Copies of the tensors among `inputs` (same sizes and strides), the other values as they are.
std::vector<c10::IValue> copies_of(const std::vector<c10::IValue>& inputs) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& v : inputs)
    out.push_back(v.isTensor() && v.toTensor().defined() ? c10::IValue(clone_same_layout(v.toTensor())) : v);
  return out;
}

// The CUDA variants of a package: a CUBIN per architecture asked for, newest first, then PTX for the newest
// unless PTX was asked for (Note [Packaged binaries]); the CUDA target's default when none is asked for.
std::vector<std::string> cuda_variants(const std::vector<std::string>& archs, const std::string& path) {
  const Target* cuda = target_named("cuda");
  FJ_INTERNAL_ASSERT(cuda != nullptr, "no cuda target");
  if (archs.empty()) return cuda->default_package_variants();
  std::vector<std::pair<int, std::string>> cubins, ptx;
  for (const std::string& a : archs) {
    try {
      cuda->check_arch(a);
    } catch (const Error& e) {
      detail::throw_error(fmt::format("package {}: {}", path, e.what()));
    }
    const size_t us = a.find('_');
    (a.rfind("sm_", 0) == 0 ? cubins : ptx).emplace_back(std::stoi(a.substr(us + 1)), a);
  }
  std::sort(cubins.rbegin(), cubins.rend());
  cubins.erase(std::unique(cubins.begin(), cubins.end()), cubins.end());
  std::sort(ptx.rbegin(), ptx.rend());
  ptx.erase(std::unique(ptx.begin(), ptx.end()), ptx.end());
  if (ptx.empty()) ptx.emplace_back(cubins.front().first, fmt::format("compute_{}", cubins.front().first));
  std::vector<std::string> out;
  for (const auto& c : cubins) out.push_back(c.second);
  for (const auto& c : ptx) out.push_back(c.second);
  return out;
}

// What the pipeline leaves out of a package's plans (PlanSource::prepare).
constexpr const char* kPackageSkip = "constant_fold.prepacked";

// What signature `where`'s plan requires of the machine that runs it: oneDNN's bfloat16 kernels (Note
// [Convolution rules]: the rules take bfloat16 only where this CPU's oneDNN does).
void add_requirements(const ExecutablePlan& plan, std::set<std::string>* requires) {
  for (const Node* n : plan.graph->nodes()) {
    if (n->schema().rfind("mkldnn::", 0) != 0) continue;
    for (const Value* v : n->value_inputs())
      if (v->is_tensor() && v->tensor_type().dtype == DType::kBFloat16) requires->insert(kRequiresOnednnBf16);
  }
}

// Why this machine cannot run plans that require `what`, or "".
std::string unmet(const std::string& what) {
  if (what == kRequiresOnednnBf16)
    return onednn_bf16_supported() ? ""
                                   : "its plans call oneDNN on bfloat16, which this CPU's oneDNN does not take (it "
                                     "needs AVX512BW, AVX512VL and AVX512DQ, or AVX-NE-CONVERT)";
  return fmt::format("its plans require '{}', which this fusion_jit does not know", what);
}

// Where a package's plans come from: a TorchScript module or graphs given as IR text.
struct PlanSource {
  std::string name;  // the model's, for the manifest
  bool enable_fusion = true;
  bool size_args = false;  // CompileOptions::dynamic "on"
  bool in_place = true;    // the disable option does not name "in_place"
  // Signature i's graph, captured on its (CPU) inputs and optimized, in `captured`, with the rule
  // "constant_fold.prepacked" left out: the steps that reorder weights into the layouts of this CPU's
  // oneDNN and MKL kernels, which another CPU's may not read, run when the package loads (Note [Prepacked
  // weights]). `cuda`: the graph is moved to cuda:0 before the passes, as CompiledModule::compile_cuda
  // moves it.
  std::function<std::unique_ptr<PlanInstance>(size_t i, const std::vector<c10::IValue>& inputs, bool cuda)> prepare;
};

// Builds one signature's plan, as the JIT path does, on a graph printed and parsed back (the loader parses
// the same text, so value ids and node order are the ones the plan's JSON names). `cuda_arch` non-empty: a
// plan for cuda:0, built from the CPU inputs as CompiledModule::compile_cuda builds it, whose code the
// caller compiles (there may be no GPU here to run it on).
std::unique_ptr<PlanInstance> build_signature(const PlanSource& source, size_t i, const std::vector<c10::IValue>& inputs,
                                              const std::string& where, const std::string& cuda_arch) {
  const bool cuda = !cuda_arch.empty();
  std::unique_ptr<PlanInstance> inst;
  try {
    inst = source.prepare(i, inputs, cuda);
  } catch (const std::exception& e) {
    detail::throw_error(fmt::format("{} cannot be captured: {}", where, message_of(e)));
  }
  // Parsing numbers the values afresh; the text of the parsed graph parses back to itself.
  std::unique_ptr<Graph> graph = parse_graph(print_graph(*inst->captured.graph));
  const std::string text = print_graph(*graph);
  FJ_INTERNAL_ASSERT(print_graph(*parse_graph(text)) == text, "{}: the graph's text does not parse back to itself:\n{}", where, text);
  PlanTarget target;
  target.enable_fusion = source.enable_fusion;
  target.size_args = source.size_args;
  if (cuda) {
    target.arch["cuda"] = cuda_arch;
    target.compile = false;
  }
  inst->plan = build_plan(std::move(graph), target);
  inst->captured.graph = nullptr;
  FJ_CHECK(inst->plan->fallback_groups.empty(), "{}: kernels failed to compile ({}); see the warning above", where,
           fmt::join(inst->plan->fallback_groups, ", "));
  resolve_aten_steps(*inst, source.in_place);
  if (cuda) return inst;  // run by the GPU tests (tests/gpu)
  try {
    // Once, as a served call would (every step resolves and every kernel loads), on copies: a model that
    // changes its inputs has changed the caller's once already, in the capture run, as eager would.
    run_plan(*inst, copies_of(inputs));
  } catch (const std::exception& e) {
    detail::throw_error(fmt::format("{}: the plan fails on the example inputs: {}", where, message_of(e)));
  }
  return inst;
}


// Builds the package of `source` for `signatures` and writes it to `path` (package, package_graphs).
PackageInfo write_package(const PlanSource& source, const std::vector<std::vector<c10::IValue>>& signatures,
                          const std::string& path, const PackageOptions& options,
                          std::chrono::steady_clock::time_point t0) {
  FJ_CHECK(!signatures.empty(), "package {}: no input signature was given", path);
  FJ_CHECK(options.device == "cpu" || options.device == "cuda", "package {}: device '{}': expected cpu or cuda", path,
           options.device);
  // The key first: a key file that cannot be used fails before minutes of building, not after.
  const std::optional<PackageKey> key = package_key(options.key_file, fmt::format("package {}", path));
  const bool cuda = options.device == "cuda";
  const std::vector<std::string> variants_of_cuda = cuda ? cuda_variants(options.cuda_archs, path) : std::vector<std::string>{};
  const c10::Device cuda0(c10::kCUDA, 0);
  c10::NoGradGuard no_grad;
  ArchiveSections sections;
  json sigs = json::array(), codes = json::array();
  std::map<std::string, int> code_index;  // target name and source hash -> index in codes
  std::map<std::string, size_t> seen;     // signature -> its index
  std::vector<c10::IValue> constants;     // per signature, a tuple of its constants
  std::set<const c10::StorageImpl*> storages;  // those counted in info.constant_bytes
  std::unordered_map<std::string, at::Tensor> distinct;  // constant tensors by type and contents
  std::set<std::string> requires;                        // of the machine that loads it
  PackageInfo info;
  info.path = path;
  for (size_t i = 0; i < signatures.size(); ++i) {
    const std::vector<c10::IValue>& inputs = signatures[i];
    const std::string described = describe_inputs(inputs, cuda);
    const std::string where = fmt::format("package {}: signature {} {}", path, i, described);
    for (size_t j = 0; j < inputs.size(); ++j)
      FJ_CHECK(!inputs[j].isTensor() || !inputs[j].toTensor().defined() || inputs[j].toTensor().is_cpu(),
               "{}: input {} is on {}: give CPU inputs (a CUDA package is built from CPU inputs, with no GPU "
               "needed)",
               where, j,
               inputs[j].toTensor().device().str());
    const std::string sig = input_signature(inputs, cuda ? &cuda0 : nullptr);
    auto [it, fresh] = seen.emplace(sig, i);
    FJ_CHECK(fresh, "{}: the same signature as signature {}", where, it->second);
    std::unique_ptr<PlanInstance> inst = build_signature(source, i, inputs, where, cuda ? variants_of_cuda.front() : "");
    const ExecutablePlan& plan = *inst->plan;
    add_requirements(plan, &requires);

    json refs = json::array();
    for (const TargetCode& c : plan.code) {
      const std::string key = std::string(c.target->name()) + " " + c.arch + " " + sha256_hex(c.source);
      auto [ci, added] = code_index.emplace(key, static_cast<int>(codes.size()));
      if (added) {
        std::vector<std::string> variants = c.target->default_package_variants();
        if (c.target->device() == Device::kCPU && !options.cpu_variants.empty()) variants = options.cpu_variants;
        if (c.target->device() == Device::kCUDA) variants = variants_of_cuda;
        json images = json::array();
        std::vector<PackagedImage> built;
        try {
          built = c.target->package_images(c.source, variants);
        } catch (const Error& e) {
          detail::throw_error(fmt::format("{}: compiling its {} code as {}: {}", where, c.target->name(),
                                          fmt::join(variants, ", "), e.what()));
        }
        for (size_t k = 0; k < built.size(); ++k) {
          std::string name = fmt::format("image/{}/{}", ci->second, k);
          images.push_back({{"variant", built[k].variant}, {"requires", built[k].requires}, {"section", name}});
          sections[name] = std::move(built[k].bytes);
        }
        codes.push_back({{"target", c.target->name()}, {"arch", c.arch}, {"source_sha256", sha256_hex(c.source)},
                         {"images", images}});
        info.sources++;
      }
      refs.push_back(ci->second);
    }

    // Only the constants the plan's graph reads are stored: folding leaves in the table the originals of
    // what it folded (a convolution's weight before a batch norm was folded into it). The others become
    // None, so that the graph's constant indices stay as they are.
    std::vector<bool> read(inst->captured.constants.size(), false);
    for (const Node* n : plan.graph->nodes())
      if (n->is_constant()) read.at(static_cast<size_t>(n->constant_index())) = true;
    for (size_t k = 0; k < read.size(); ++k)
      if (!read[k]) inst->captured.constants[k] = c10::IValue();
    // Signatures fold the same weights each on their own (a batch norm into the convolution before it):
    // equal tensors, the same dtype, sizes, strides and bytes, are stored once.
    for (c10::IValue& v : inst->captured.constants) {
      if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().is_cpu() || v.toTensor().layout() != at::kStrided)
        continue;
      const at::Tensor& t = v.toTensor();
      const at::Tensor dense = t.contiguous();
      const std::string key =
          fmt::format("{} {} {} ", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ","), fmt::join(t.strides(), ",")) +
          sha256_hex(std::string_view(static_cast<const char*>(dense.data_ptr()), dense.nbytes()));
      auto [it, fresh] = distinct.emplace(key, t);
      if (!fresh) v = it->second;
    }
    for (const c10::IValue& v : inst->captured.constants) {
      FJ_CHECK(v.isTensor() || v.isNone() || v.isScalar() || v.isIntList() || v.isDoubleList() || v.isBoolList(),
               "{}: a constant of kind {} cannot be stored in a package", where, v.tagKind());
      if (v.isTensor() && v.toTensor().defined()) {
        FJ_CHECK(v.toTensor().layout() == at::kStrided && v.toTensor().is_cpu(),
                 "{}: a constant tensor of layout {} on {} cannot be stored in a package", where,
                 c10::str(v.toTensor().layout()), v.toTensor().device().str());
        if (storages.insert(v.toTensor().storage().unsafeGetStorageImpl()).second)
          info.constant_bytes += static_cast<int64_t>(v.toTensor().storage().nbytes());
      }
    }
    constants.emplace_back(c10::ivalue::Tuple::create(inst->captured.constants));
    sections[fmt::format("graph/{}", i)] = print_graph(*plan.graph);
    sections[fmt::format("plan/{}", i)] = serialize_plan(plan);
    sections[fmt::format("explain/{}", i)] = plan.explain() + instance_explain(*inst);
    sigs.push_back({{"signature", to_hex(sig)},
                    {"inputs", described},
                    {"output_kind", static_cast<int>(inst->captured.output_kind)},
                    {"in_place", source.in_place},
                    {"kernels", plan.kernels.size()},
                    {"code", refs}});
    info.kernels += static_cast<int>(plan.kernels.size());
  }
  // One pickle for every signature's constants: the weights they share are stored once.
  std::vector<char> pickled;
  try {
    pickled = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(constants)));
  } catch (const std::exception& e) {
    detail::throw_error(fmt::format("package {}: the constants cannot be stored: {}", path, message_of(e)));
  }
  sections["constants"] = std::string(pickled.begin(), pickled.end());
  json manifest{{"format", kPackageFormat},
                {"fusion_jit", {{"version", FJ_VERSION}, {"build", FJ_BUILD_ID}}},
                {"torch", FJ_TORCH_VERSION},
                {"model", source.name},
                {"device", options.device},
                {"requires", requires},
                {"code", codes},
                {"signatures", sigs}};
  sections["manifest"] = manifest.dump(1);
  if (key) {
    sections[kSignatureSection] = package_mac(key->secret, sections);
    info.key_file = key->file;
  }
  const std::string bytes = encode_archive(sections);
  write_file_atomically(path, bytes);
  info.bytes = static_cast<int64_t>(bytes.size());
  info.signatures = static_cast<int>(signatures.size());
  info.build_ms = ms_since(t0);
  return info;
}

}  // namespace

PackageInfo package(const torch::jit::Module& module, const std::vector<std::vector<c10::IValue>>& signatures,
                    const std::string& path, const PackageOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  CompiledModule m = compile(module, options.compile);
  PlanSource source;
  source.name = ModuleAccess::name(m);
  source.enable_fusion = ModuleAccess::enable_fusion(m);
  source.size_args = ModuleAccess::dynamic(m) == DynamicSizes::kOn;
  source.in_place = ModuleAccess::in_place(m);
  source.prepare = [&m](size_t, const std::vector<c10::IValue>& inputs, bool cuda) {
    c10::IValue eager;
    return ModuleAccess::prepare(m, inputs, {kPackageSkip}, &eager, cuda);
  };
  return write_package(source, signatures, path, options, t0);
}

PackageInfo package_graphs(const std::string& name, const std::vector<GraphSignature>& signatures,
                           const std::string& path, const PackageOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanSession session(name, options.compile);  // Note [The plan session]
  PlanSource source;
  source.name = name;
  source.enable_fusion = session.enable_fusion();
  source.size_args = session.dynamic() == DynamicSizes::kOn;
  source.in_place = session.in_place();
  source.prepare = [&](size_t i, const std::vector<c10::IValue>&, bool cuda) {
    const GraphSignature& sig = signatures[i];
    auto inst = std::make_unique<PlanInstance>();
    inst->captured = captured_from_ir(name, sig.inputs, sig.ir, sig.constants);
    std::set<std::string> skip = session.disable();
    skip.insert(kPackageSkip);  // PlanSource::prepare
    session.optimize(inst->captured, skip, cuda);
    return inst;
  };
  std::vector<std::vector<c10::IValue>> inputs;
  for (const GraphSignature& sig : signatures) inputs.emplace_back(sig.inputs.begin(), sig.inputs.end());
  return write_package(source, inputs, path, options, t0);
}

struct LoadedPackage::Impl {
  std::string path;
  LoadOptions options;
  std::unordered_map<std::string, std::shared_ptr<PlanInstance>> plans;  // by input_signature
  std::vector<std::string> described;
  std::string explain;
  std::string device;
  std::string verified_with;  // the key file; "" = no key configured
  double load_ms = 0, constants_ms = 0, prepack_ms = 0;
  mutable std::atomic<int64_t> fallback_calls{0};
};

namespace {

// Note [Checks before code]: whether `name` is the kernel codegen names for `group` and `source` defines it
// (as plan_io finds a kernel's arguments: " name(").
bool kernel_name_is_valid(const std::string& name, int group, const std::string& source) {
  return group >= 0 && name == fmt::format("fj_kernel_{}", group) && source.find(" " + name + "(") != std::string::npos;
}

// A code of the package: the variant this machine runs, chosen before anything is loaded.
struct ChosenCode {
  const Target* target = nullptr;
  PackagedImage image;  // its bytes read only when it is loaded
  std::string section;
  std::string key;      // target, arch and source SHA-256, as the plans' TargetCodes must match
};

}  // namespace

LoadedPackage load_package(const std::string& path, LoadOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_shared<LoadedPackage::Impl>();
  impl->path = path;
  impl->options = std::move(options);
  const std::optional<PackageKey> key = package_key(impl->options.key_file, path + ": refused");
  const MappedFile file(path);
  const ArchiveView sections = decode_archive(file.bytes(), path);
  auto section = [&](const std::string& name) -> std::string_view {
    auto it = sections.find(name);
    FJ_CHECK(it != sections.end(), "{}: not a valid package: its section {} is missing", path, name);
    return it->second;
  };
  // Note [Package signatures]: before anything of the package is parsed.
  const auto signature = sections.find(kSignatureSection);
  if (key) {
    FJ_CHECK(signature != sections.end(),
             "{}: refused: the package is not signed, and a package key is configured ({}): only packages signed "
             "with that key load (build it again with the key: FUSION_JIT_PACKAGE_KEY, or PackageOptions::key_file); "
             "nothing of it was loaded",
             path, key->file);
    FJ_CHECK(equal_in_constant_time(package_mac(key->secret, sections), signature->second),
             "{}: refused: its signature does not verify under the key in {}: it was signed with another key, or "
             "changed after it was signed; nothing of it was loaded",
             path, key->file);
    impl->verified_with = key->file;
  }
  const std::string signed_line =
      key ? fmt::format("signature verified with the key in {}\n", key->file)
          : signature != sections.end()
              ? "signed, but not verified: no package key is configured (FUSION_JIT_PACKAGE_KEY)\n"
              : "not signed: trusted as a shared library is (no package key is configured)\n";
  json manifest;
  try {
    manifest = json::parse(section("manifest"));
    const int format = manifest.at("format").get<int>();
    FJ_CHECK(format == kPackageFormat, "{}: package format {}, but this fusion_jit reads format {}: build the package again",
             path, format, kPackageFormat);
    const std::string version = manifest.at("fusion_jit").at("version").get<std::string>();
    const std::string build = manifest.at("fusion_jit").at("build").get<std::string>();
    FJ_CHECK(build == FJ_BUILD_ID,
             "{}: built by fusion_jit {} (build {}), but this is fusion_jit {} (build {}): plans and generated code "
             "belong to the build that made them; build the package again with this one",
             path, version, build.substr(0, 12), FJ_VERSION, std::string(FJ_BUILD_ID).substr(0, 12));
    const std::string torch_version = manifest.at("torch").get<std::string>();
    FJ_CHECK(torch_version == FJ_TORCH_VERSION, "{}: built with torch {}, but this fusion_jit runs on torch {}", path,
             torch_version, FJ_TORCH_VERSION);
    const std::string device = manifest.at("device").get<std::string>();
    FJ_CHECK(device == "cpu" || device == "cuda", "{}: not a valid package: device '{}'", path, device);
    const bool cuda = device == "cuda";
    impl->device = device;
    if (cuda) {
      std::string why;
      const bool driver = target_named("cuda")->device_present(&why);
      FJ_CHECK(driver && torch_cuda_device_count() > 0,
               "{}: its plans run on a GPU (cuda:0), but this machine has none that torch and fusion_jit can use ({}): "
               "build a CPU package for it (fusion-jit package --device cpu)",
               path, driver ? std::string("torch sees no CUDA device") : why);
    }

    for (const json& r : manifest.at("requires")) {
      const std::string why = unmet(r.get<std::string>());
      FJ_CHECK(why.empty(), "{}: {}{}", path, why,
               r.get<std::string>() == kRequiresOnednnBf16
                   ? ": build the package on a machine like this one, or with FUSION_JIT_DISABLE=epilogue,prepack"
                   : "");
    }

    // Each distinct source: the first compiled variant this machine can run, chosen here and loaded last.
    std::vector<ChosenCode> codes;
    std::string loaded_lines;
    for (const json& c : manifest.at("code")) {
      const std::string target_name = c.at("target").get<std::string>();
      ChosenCode chosen;
      chosen.target = target_named(target_name);
      FJ_CHECK(chosen.target != nullptr, "{}: it has code for target '{}', which this fusion_jit does not have", path,
               target_name);
      const std::string arch = c.at("arch").get<std::string>();
      chosen.key = target_name + " " + arch + " " + c.at("source_sha256").get<std::string>();
      std::vector<std::string> refused;
      for (const json& im : c.at("images")) {
        PackagedImage image{im.at("variant").get<std::string>(), im.at("requires").get<std::string>(), ""};
        std::string why = chosen.target->cannot_load(image);
        if (!why.empty()) {
          refused.push_back(image.variant + ": " + why);
          continue;
        }
        chosen.section = im.at("section").get<std::string>();
        section(chosen.section);  // present
        loaded_lines += fmt::format("code {}: {}{} variant {} (for {})\n", codes.size(), target_name,
                                    arch.empty() ? "" : " " + arch, image.variant, image.requires);
        chosen.image = std::move(image);
        break;
      }
      FJ_CHECK(!chosen.section.empty(), "{}: none of the compiled variants of its {} code runs on this machine ({})", path,
               target_name, fmt::join(refused, "; "));
      codes.push_back(std::move(chosen));
    }

    impl->explain = fmt::format("package {}: format {}, fusion_jit {}, torch {}, model {}, plans on {}\n", path, format,
                                version, torch_version, manifest.at("model").get<std::string>(), cuda ? "cuda:0" : "cpu") +
                    signed_line + loaded_lines;
    const auto tc = std::chrono::steady_clock::now();
    std::vector<c10::IValue> constants;
    try {
      c10::IValue all = torch::jit::pickle_load_obj(section("constants"));
      if (all.isTuple()) constants = all.toTupleRef().elements().vec();
    } catch (const std::exception& e) {
      detail::throw_error(fmt::format("{}: not a valid package: its constants cannot be read: {}", path, message_of(e)));
    }
    // A CUDA package's constants are stored from the CPU; each tensor is moved to cuda:0 once, however
    // many signatures share it.
    std::unordered_map<const c10::TensorImpl*, at::Tensor> moved;
    std::map<std::string, c10::IValue> prepacked;  // Note [Prepacked weights], shared by the signatures
    impl->constants_ms = ms_since(tc);
    // Every signature's plan, read and checked; the code indices of its TargetCodes.
    std::vector<std::pair<std::string, std::shared_ptr<PlanInstance>>> plans;
    std::vector<std::vector<size_t>> code_refs;
    std::set<std::string> seen;
    const json& sigs = manifest.at("signatures");
    for (size_t i = 0; i < sigs.size(); ++i) {
      const json& s = sigs[i];
      const std::string described = s.at("inputs").get<std::string>();
      auto plan = std::make_unique<ExecutablePlan>();
      try {
        plan->graph = parse_graph(std::string(section(fmt::format("graph/{}", i))));
      } catch (const Error& e) {
        detail::throw_error(fmt::format("{}: not a valid package: the graph of signature {} {} does not parse: {}", path,
                                        i, described, e.what()));
      }
      FJ_CHECK(plan->graph->symbols().empty(),
               "{}: not a valid package: the graph of signature {} {} has symbolic sizes; a package holds plans "
               "for numbers", path, i, described);
      FJ_CHECK(deserialize_plan(std::string(section(fmt::format("plan/{}", i))), plan.get()),
               "{}: not a valid package: the plan of signature {} {} does not fit its graph", path, i, described);
      const json& refs = s.at("code");
      FJ_CHECK(refs.size() == plan->code.size(), "{}: not a valid package: signature {} names {} codes, its plan has {}",
               path, i, refs.size(), plan->code.size());
      std::vector<size_t> code_of;
      for (size_t k = 0; k < plan->code.size(); ++k) {
        const TargetCode& c = plan->code[k];
        const size_t ref = refs[k].get<size_t>();
        FJ_CHECK(ref < codes.size() &&
                     codes[ref].key == std::string(c.target->name()) + " " + c.arch + " " + sha256_hex(c.source),
                 "{}: not a valid package: signature {}'s {} source is not the one its code was compiled from", path, i,
                 c.target->name());
        for (int kernel : c.kernels) {
          const KernelSpec& spec = plan->kernels.at(kernel).spec;
          FJ_CHECK(kernel_name_is_valid(spec.name, spec.group, c.source),
                   "{}: not a valid package: signature {} calls kernel '{}', which is not the kernel of its group {} "
                   "(fj_kernel_{}) defined in its {} source",
                   path, i, spec.name, spec.group, spec.group, c.target->name());
        }
        code_of.push_back(ref);
      }
      auto inst = std::make_shared<PlanInstance>();
      inst->plan = std::move(plan);
      const int kind = s.at("output_kind").get<int>();
      FJ_CHECK(kind >= 0 && kind <= static_cast<int>(OutputKind::kList), "{}: not a valid package: output kind {}", path, kind);
      inst->captured.output_kind = static_cast<OutputKind>(kind);
      const std::string sig = from_hex(s.at("signature").get<std::string>(), path);
      FJ_CHECK(seen.insert(sig).second, "{}: not a valid package: signature {} appears twice", path, i);
      FJ_CHECK(i < constants.size() && constants[i].isTuple(),
               "{}: not a valid package: the constants of signature {} are missing", path, i);
      for (const c10::IValue& v : constants[i].toTupleRef().elements())
        inst->captured.constants.push_back(cuda ? on_cuda0(v, &moved) : v);
      const auto tp = std::chrono::steady_clock::now();
      const int steps = prepack_at_load(*inst, &prepacked, fmt::format("{}: signature {} {}", path, i, described));
      const double prepack_ms = ms_since(tp);
      impl->prepack_ms += prepack_ms;
      resolve_aten_steps(*inst, s.at("in_place").get<bool>());
      impl->described.push_back(described);
      impl->explain += fmt::format("\nsignature {}: {}\n{}", i, described, section(fmt::format("explain/{}", i)));
      if (steps > 0)
        impl->explain += fmt::format("weights prepacked at load: {} step{} ({:.2f} ms), constants of this plan from then on\n",
                                     steps, steps == 1 ? "" : "s", prepack_ms);
      plans.emplace_back(sig, std::move(inst));
      code_refs.push_back(std::move(code_of));
    }

    // Note [Checks before code]: everything above was data; the code is loaded last.
    std::vector<std::shared_ptr<const Artifact>> artifacts;
    for (ChosenCode& c : codes) {
      c.image.bytes = std::string(section(c.section));
      artifacts.push_back(c.target->load_image(c.image));
    }
    for (size_t i = 0; i < plans.size(); ++i) {
      ExecutablePlan& plan = *plans[i].second->plan;
      for (size_t k = 0; k < plan.code.size(); ++k) {
        TargetCode& c = plan.code[k];
        c.artifact = artifacts[code_refs[i][k]];
        c.arch = codes[code_refs[i][k]].image.variant;
        for (int kernel : c.kernels) {
          const std::string& name = plan.kernels.at(kernel).spec.name;
          FJ_CHECK(c.artifact->has_kernel(name), "{}: not a valid package: kernel {} of signature {} is missing from its code",
                   path, name, i);
        }
      }
      impl->plans.emplace(std::move(plans[i].first), std::move(plans[i].second));
    }
  } catch (const json::exception& e) {
    detail::throw_error(fmt::format("{}: not a valid package: its manifest is not what this fusion_jit writes: {}", path,
                                    e.what()));
  }
  impl->load_ms = ms_since(t0);
  impl->constants_ms += impl->prepack_ms;
  return LoadedPackage(std::move(impl));
}

c10::IValue LoadedPackage::operator()(const std::vector<c10::IValue>& inputs) const {
  const Impl& p = *impl_;
  auto it = p.plans.end();
  std::string why = grad_blocker(inputs);
  if (why.empty()) {
    it = p.plans.find(input_signature(inputs));
    if (it == p.plans.end())
      why = fmt::format("no packaged signature matches the inputs {}; the package serves {}", describe_inputs(inputs),
                        fmt::join(p.described, ", "));
  }
  if (!why.empty()) {
    FJ_CHECK(p.options.fallback != nullptr, "{}: {}", p.path, why);
    p.fallback_calls++;
    return p.options.fallback(inputs);
  }
  bool replayed = false;
  return run_instance(*it->second, inputs, /*cuda_graphs=*/false, p.path, &replayed);
}

std::vector<std::string> LoadedPackage::signatures() const { return impl_->described; }
std::string LoadedPackage::explain() const { return impl_->explain; }
const std::string& LoadedPackage::device() const { return impl_->device; }
const std::string& LoadedPackage::verified_with() const { return impl_->verified_with; }
double LoadedPackage::load_ms() const { return impl_->load_ms; }
double LoadedPackage::constants_ms() const { return impl_->constants_ms; }
double LoadedPackage::prepack_ms() const { return impl_->prepack_ms; }
int64_t LoadedPackage::fallback_calls() const { return impl_->fallback_calls.load(); }

}  // namespace fusion_jit
