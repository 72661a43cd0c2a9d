// fusion-jit: run, check, time and explain TorchScript models through fusion_jit.
//
//   fusion-jit run MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu] [--seed N] [--check]
//                  [--bench N] [--json] [--save-outputs FILE]
//   fusion-jit explain MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu|cuda[:N]] [--dump-source]
//   fusion-jit compile MODEL.pt (--input SPEC ... | --inputs FILE) --device cuda [--arch sm_90] --out DIR
//
// `compile` is ahead-of-time CUDA compilation with NVRTC and needs no GPU: it writes DIR/plan.cu, the
// binary (DIR/plan.cubin, or DIR/plan.ptx for compute_XY), DIR/kernels.json (each kernel's registers,
// shared memory, stack and spills) and DIR/explain.txt.
//
// Exit codes: 0 success, 1 a --check mismatch, 2 bad input (one line on stderr, no stack trace).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/Context.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/fuzzer.h"
#include "cost/cost_model.h"
#include "ir/dtype.h"
#include "kernels_cache/kernels_cache.h"
#include "runtime/cuda_driver.h"
#include "runtime/plan.h"
#include "support/error.h"
#include "support/parse.h"
#include "fusion_jit/fusion_jit.h"
#include "torch/cuda_support.h"
#include "torch/executor.h"
#include "torch/tolerance.h"

namespace fj = fusion_jit;

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void usage_error(const std::string& msg) { throw UsageError(msg); }

const char* kUsage =
    "usage: fusion-jit run MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu|cuda[:N]] [--seed N]\n"
    "                      [--check] [--bench N] [--json] [--save-outputs FILE]\n"
    "       fusion-jit explain MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu|cuda[:N]] [--dump-source]\n"
    "       fusion-jit compile MODEL.pt (--input SPEC ... | --inputs FILE) --device cuda [--arch sm_90] --out DIR\n"
    "       fusion-jit fuzz [--graphs N] [--minutes M] [--seed S] [--batch B] [--out DIR] [--device cpu|cuda]\n"
    "                       [--nvrtc ARCH] [--graph-seeds S1,S2,...]\n"
    "       fusion-jit cache stats | ls | verify | clear | prune [--max-size SIZE]\n"
    "SPEC: DTYPE[SIZES] with optional {STRIDES}, e.g. f32[64,1024], bf16[8,3,32,32], i64[16], b8[4,4],\n"
    "      f32[1024,64]{1,1024}. DTYPE: f32 f64 f16 bf16 i8 i16 i32 i64 u8 b8.\n";

struct Args {
  std::string command, model;
  std::vector<std::string> specs;
  std::string inputs_file, save_outputs, device = "cpu", arch = "sm_90", out_dir;
  int64_t seed = 0;
  int bench = 0;
  bool check = false, json = false, dump_source = false;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo,
                  int64_t hi = std::numeric_limits<int64_t>::max()) {
  int64_t x = 0;
  fj::ParseStatus st = fj::parse_int64(v, &x);
  if (st == fj::ParseStatus::kMalformed || (st == fj::ParseStatus::kOk && x < lo))
    usage_error(flag + " expects an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  if (st == fj::ParseStatus::kOutOfRange || x > hi)
    usage_error(flag + " " + v + ": too large (at most " + std::to_string(hi) + ")");
  return x;
}

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) usage_error("missing command (run, explain, compile, fuzz or cache)");
  a.command = argv[1];
  if (a.command == "-h" || a.command == "--help") {
    std::fputs(kUsage, stdout);
    std::exit(0);
  }
  if (a.command != "run" && a.command != "explain" && a.command != "compile")
    usage_error("unknown command '" + a.command + "' (run, explain, compile, fuzz or cache)");
  std::vector<std::string> rest(argv + 2, argv + argc);
  auto value = [&](size_t& i, const std::string& flag) {
    if (i + 1 >= rest.size()) usage_error(flag + " needs a value");
    return rest[++i];
  };
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& r = rest[i];
    bool is_run = a.command == "run";
    if (r == "--input") {
      a.specs.push_back(value(i, r));
      while (i + 1 < rest.size() && rest[i + 1].rfind("--", 0) != 0) a.specs.push_back(rest[++i]);
    } else if (r == "--inputs") {
      a.inputs_file = value(i, r);
    } else if (r == "--device") {
      a.device = value(i, r);
    } else if (r == "--seed") {
      a.seed = parse_int(r, value(i, r), 0);
    } else if (r == "--check" && is_run) {
      a.check = true;
    } else if (r == "--bench" && is_run) {
      a.bench = static_cast<int>(parse_int(r, value(i, r), 1, std::numeric_limits<int>::max()));
    } else if (r == "--json" && is_run) {
      a.json = true;
    } else if (r == "--save-outputs" && is_run) {
      a.save_outputs = value(i, r);
    } else if (r == "--dump-source" && a.command == "explain") {
      a.dump_source = true;
    } else if (r == "--arch" && a.command == "compile") {
      a.arch = value(i, r);
    } else if (r == "--out" && a.command == "compile") {
      a.out_dir = value(i, r);
    } else if (r.rfind("--", 0) == 0) {
      usage_error("unknown option " + r + " for " + a.command);
    } else if (a.model.empty()) {
      a.model = r;
    } else {
      usage_error("unexpected argument '" + r + "'");
    }
  }
  if (a.model.empty()) usage_error("missing MODEL.pt");
  if (a.specs.empty() == a.inputs_file.empty()) usage_error("give the inputs with --input SPEC ... or with --inputs FILE (one of the two)");
  static const std::regex device_re("cpu|cuda(:[0-9]+)?");
  if (!std::regex_match(a.device, device_re)) usage_error("--device " + a.device + ": unknown device (cpu, cuda or cuda:N)");
  if (a.command == "compile") {
    if (a.device != "cuda") usage_error("compile: --device cuda is required (CPU plans are compiled when they first run)");
    if (a.out_dir.empty()) usage_error("compile: --out DIR is required");
  } else if (a.device != "cpu") {
    std::string why;
    if (!fj::cuda_driver_available(&why)) usage_error("--device " + a.device + ": " + why);
    if (fj::torch_cuda_device_count() == 0) usage_error("--device " + a.device + ": torch sees no CUDA device");
  }
  return a;
}

at::Tensor make_input(const std::string& spec, size_t index) {
  static const std::regex re(R"(^([a-z0-9]+)\[([0-9,\s]*)\](\{([0-9,\s]*)\})?$)");
  std::smatch m;
  if (!std::regex_match(spec, m, re))
    usage_error("input " + std::to_string(index) + ": malformed SPEC '" + spec + "' (expected DTYPE[SIZES]{STRIDES}, e.g. f32[64,1024])");
  auto dt = fj::dtype_from_name(m[1]);
  if (!dt || *dt == fj::DType::kOther)
    usage_error("input " + std::to_string(index) + ": unknown dtype '" + std::string(m[1]) + "' in SPEC '" + spec + "'");
  const std::string where = "input " + std::to_string(index) + ": ";
  auto ints = [&](const std::string& s, const char* what) {
    std::vector<int64_t> v;
    std::string cur;
    for (char c : s + ",") {
      if (c == ',') {
        if (!cur.empty()) {
          int64_t x = 0;
          if (fj::parse_int64(cur, &x) != fj::ParseStatus::kOk)
            usage_error(where + what + " " + cur + " in SPEC '" + spec + "' is too large (at most " +
                        std::to_string(std::numeric_limits<int64_t>::max()) + ")");
          v.push_back(x);
        }
        cur.clear();
      } else if (!std::isspace(static_cast<unsigned char>(c))) {
        cur += c;
      }
    }
    return v;
  };
  std::vector<int64_t> sizes = ints(m[2], "size");
  // The element count and the extent in memory must fit int64_t (torch computes both).
  int64_t numel = 1;
  for (int64_t d : sizes)
    if (!fj::checked_mul(numel, d, &numel))
      usage_error(where + "SPEC '" + spec + "' has more elements than int64_t can count");
  std::vector<int64_t> strides = m[3].matched ? ints(m[4], "stride") : fj::contiguous_strides(sizes);
  if (strides.size() != sizes.size())
    usage_error(where + "SPEC '" + spec + "' has " + std::to_string(sizes.size()) + " sizes but " +
                std::to_string(strides.size()) + " strides");
  int64_t extent = 1;
  for (size_t d = 0; d < sizes.size() && numel > 0; ++d) {
    int64_t span = 0;
    if (!fj::checked_mul(sizes[d] - 1, strides[d], &span) || extent > std::numeric_limits<int64_t>::max() - span)
      usage_error(where + "SPEC '" + spec + "' spans more memory than int64_t can address");
    extent += span;
  }
  if (numel == 0) extent = 1;
  auto st = static_cast<at::ScalarType>(fj::dtype_to_torch_code(*dt));
  at::Tensor base;
  if (fj::is_floating(*dt)) base = at::randn({extent}, at::TensorOptions().dtype(at::kFloat)).to(st);
  else if (*dt == fj::DType::kBool) base = at::randint(0, 2, {extent}).to(st);
  else base = at::randint(-8, 9, {extent}, at::TensorOptions().dtype(at::kLong)).to(st);
  return base.as_strided(sizes, strides);
}

std::vector<char> read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

std::vector<c10::IValue> load_inputs(const std::string& path) {
  auto data = read_file(path, "--inputs");
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(data);
  } catch (const c10::Error& e) {
    usage_error("--inputs " + path + ": not a file written by torch.save: " + e.what_without_backtrace());
  }
  std::vector<c10::IValue> out;
  if (v.isTensor()) {
    out.push_back(v);
  } else if (v.isList() || v.isTuple()) {
    auto items = v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].isTensor()) usage_error("--inputs " + path + ": item " + std::to_string(i) + " is not a tensor");
      out.push_back(items[i]);
    }
  } else {
    usage_error("--inputs " + path + ": expected a list of tensors");
  }
  return out;
}

std::vector<at::Tensor> flatten(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTuple()) for (const auto& e : v.toTupleRef().elements()) { auto f = flatten(e); out.insert(out.end(), f.begin(), f.end()); }
  else if (v.isList()) for (const auto& e : v.toListRef()) { auto f = flatten(e); out.insert(out.end(), f.begin(), f.end()); }
  return out;
}

// Writes a whole file or nothing: a temporary file in the same directory, renamed into place.
void write_atomically(const std::string& what, const std::string& path, const char* data, size_t size) {
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) usage_error(what + " " + path + ": cannot write (" + std::strerror(errno) + ")");
    f.write(data, static_cast<std::streamsize>(size));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      usage_error(what + " " + path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    usage_error(what + " " + path + ": cannot rename into place (" + std::strerror(errno) + ")");
  }
}

double median_ms(int n, const std::function<void()>& fn) {
  for (int i = 0; i < std::min(n, 3); ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string first_line(std::string s) {
  s.erase(0, s.find_first_not_of("\n \t"));
  auto p = s.find('\n');
  return p == std::string::npos ? s : s.substr(0, p);
}

// "these inputs (input 0 f32[4,4], input 1 f32[5,3])": what eager was given, for its error messages.
std::string describe_inputs(const std::vector<c10::IValue>& inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    s += (i ? ", input " : "these inputs (input ") + std::to_string(i) + " ";
    if (!inputs[i].isTensor()) {
      s += inputs[i].tagKind();
      continue;
    }
    const at::Tensor& t = inputs[i].toTensor();
    fj::DType dt = fj::dtype_from_torch_code(static_cast<int>(t.scalar_type()));
    s += std::string(dt != fj::DType::kOther ? fj::dtype_name(dt) : c10::toString(t.scalar_type())) + "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
    s += "]";
  }
  return s + (inputs.empty() ? "these inputs" : ")");
}

// The op's message in an error from TorchScript's interpreter ("The following operation failed in the
// TorchScript interpreter. Traceback ... RuntimeError: MESSAGE"): MESSAGE, else the first line.
std::string eager_error_message(const std::string& what) {
  static const std::regex error_line(R"(^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception): (.*)$)");
  std::istringstream in(what);
  std::string line, found;
  std::smatch m;
  while (std::getline(in, line))
    if (found.empty() && std::regex_match(line, m, error_line) && !m[2].str().empty()) found = m[2].str();
  return found.empty() ? first_line(what) : found;
}

// `fusion-jit compile`: the plan's CUDA kernels through NVRTC, written to a directory.
int compile_cuda(const Args& a, torch::jit::Module& module, const std::vector<c10::IValue>& inputs) {
  std::string why;
  if (!fj::nvrtc_available(&why)) usage_error("compile: " + why);
  fj::check_cuda_arch(a.arch);
  struct stat st;
  if (::stat(a.out_dir.c_str(), &st) != 0 && ::mkdir(a.out_dir.c_str(), 0755) != 0)
    usage_error("--out " + a.out_dir + ": cannot create (" + std::strerror(errno) + ")");
  if (::stat(a.out_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) usage_error("--out " + a.out_dir + ": not a directory");
  torch::jit::setGraphExecutorOptimize(false);
  module.eval();
  auto t0 = std::chrono::steady_clock::now();
  auto fused = fj::compile(module);
  auto plan = fused.compile_cuda(inputs, a.arch);
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string dir = a.out_dir + "/";
  nlohmann::json j;
  j["model"] = a.model;
  j["arch"] = a.arch;
  j["nvrtc_version"] = fj::nvrtc_version();
  j["codegen_ms"] = plan->codegen_ms;
  j["nvrtc_ms"] = plan->cuda_binary ? plan->cuda_binary->compile_ms : 0.0;
  j["nvrtc_calls"] = plan->cuda_binary ? 1 : 0;
  j["total_ms"] = total_ms;
  j["aten_ops"] = plan->aten_ops;
  j["kernels"] = nlohmann::json::array();
  for (const auto& k : plan->kernels) {
    nlohmann::json kj;
    kj["name"] = k.spec.name;
    kj["ops"] = plan->group_ops.at(&k - plan->kernels.data());
    kj["elements"] = k.spec.numel;
    kj["vector_width"] = k.cuda_vector;
    kj["index_bits"] = k.spec.index32 ? 32 : 64;
    if (const fj::CudaKernelInfo* info = plan->cuda_binary ? plan->cuda_binary->kernel(k.spec.name) : nullptr) {
      kj["registers"] = info->registers;
      kj["shared_bytes"] = info->shared_bytes;
      kj["stack_bytes"] = info->stack_bytes;
      kj["spill_stores"] = info->spill_stores;
      kj["spill_loads"] = info->spill_loads;
    }
    j["kernels"].push_back(kj);
  }
  std::string json = j.dump(2) + "\n", explain = plan->explain();
  write_atomically("--out", dir + "plan.cu", plan->cuda_source.data(), plan->cuda_source.size());
  if (plan->cuda_binary) {
    const std::string& image = plan->cuda_binary->image;
    write_atomically("--out", dir + (plan->cuda_binary->is_ptx ? "plan.ptx" : "plan.cubin"), image.data(), image.size());
  }
  write_atomically("--out", dir + "kernels.json", json.data(), json.size());
  write_atomically("--out", dir + "explain.txt", explain.data(), explain.size());
  std::printf("%s: %zu CUDA kernels for %s, %zu ATen ops; codegen %.1f ms, NVRTC %.1f ms (1 call), total %.1f ms; "
              "written to %s\n", a.model.c_str(), plan->kernels.size(), a.arch.c_str(), plan->aten_ops.size(),
              plan->codegen_ms, j["nvrtc_ms"].get<double>(), total_ms, a.out_dir.c_str());
  return 0;
}

int run(const Args& a) {
  struct stat st;
  if (::stat(a.model.c_str(), &st) != 0) usage_error(a.model + ": no such file");
  torch::jit::Module module;
  try {
    module = torch::jit::load(a.model);
  } catch (const std::exception& e) {
    usage_error(a.model + ": not a TorchScript model (" + first_line(e.what()) + ")");
  }
  at::manual_seed(static_cast<uint64_t>(a.seed));
  std::vector<c10::IValue> inputs;
  if (!a.inputs_file.empty()) inputs = load_inputs(a.inputs_file);
  else for (size_t i = 0; i < a.specs.size(); ++i) inputs.push_back(make_input(a.specs[i], i));
  size_t expected = module.get_method("forward").function().getSchema().arguments().size() - 1;
  if (inputs.size() != expected)
    usage_error(a.model + " takes " + std::to_string(expected) + " input" + (expected == 1 ? "" : "s") + ", " +
                std::to_string(inputs.size()) + " given");
  if (a.command == "compile") return compile_cuda(a, module, inputs);
  if (a.device != "cpu") {
    const at::Device dev(a.device);
    module.to(dev);
    for (auto& v : inputs) v = v.toTensor().to(dev);
  }
  // The reference: TorchScript's interpreter without its optimizing executor (so without torch's fusers).
  torch::jit::setGraphExecutorOptimize(false);
  module.eval();
  // Eager runs on copies of the inputs: a model that changes its inputs changes each set once, and the
  // fused call's inputs must end as eager's do.
  std::vector<c10::IValue> eager_inputs;
  for (auto& v : inputs) eager_inputs.emplace_back(fj::clone_same_layout(v.toTensor()));
  c10::IValue eager_out;
  double eager_first_ms = 0;
  try {
    auto t_eager = std::chrono::steady_clock::now();
    eager_out = module.forward(eager_inputs);
    eager_first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_eager).count();
  } catch (const c10::Error& e) {
    usage_error(a.model + " rejects " + describe_inputs(inputs) + ": " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // TorchScript's interpreter rethrows an op's c10::Error as a std::runtime_error whose text is the
    // interpreter's stack, then the op's error: the model's own message on these inputs.
    usage_error(a.model + " rejects " + describe_inputs(inputs) + ": " + eager_error_message(e.what()));
  }
  auto fused = fj::compile(module);
  const fj::ExecutablePlan* plan = nullptr;
  auto t_first = std::chrono::steady_clock::now();
  plan = fused.plan_for(inputs);
  if (a.command == "explain") {
    std::cout << fused.explain(inputs);
    if (plan) {
      std::cout << "compile: " << fused.last_compile_report() << "\n";
      if (a.dump_source) {
        if (plan->source.empty() && plan->cuda_source.empty()) std::cout << "\n// no generated source\n";
        if (!plan->source.empty()) std::cout << "\n" << plan->source;
        if (!plan->cuda_source.empty()) std::cout << "\n" << plan->cuda_source;
      }
    }
    return 0;
  }
  c10::IValue out = fused(inputs);
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_first).count();
  auto outs = flatten(out), eager_outs = flatten(eager_out);
  std::string check = "skipped", why;
  double max_err = 0;
  if (a.check) {
    check = "pass";
    if (outs.size() != eager_outs.size()) {
      check = "fail";
      why = "fused returns " + std::to_string(outs.size()) + " tensors, eager " + std::to_string(eager_outs.size());
    }
    std::optional<c10::IValue> ref64;
    for (size_t i = 0; i < outs.size() && check == "pass"; ++i) {
      auto r = fj::check_close(outs[i], eager_outs[i]);
      if (!r.ok && at::isFloatingType(outs[i].scalar_type())) {
        if (!ref64) {
          auto m64 = module.clone();
          m64.to(at::kDouble);
          std::vector<c10::IValue> in64;
          for (auto& v : inputs) {
            auto t = v.toTensor();
            in64.push_back(at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t);
          }
          ref64 = m64.forward(in64);
        }
        auto refs = flatten(*ref64);
        r = fj::check_close(outs[i], eager_outs[i], refs.at(i).to(at::kDouble));
      }
      max_err = std::max(max_err, r.max_abs_err);
      if (!r.ok) {
        check = "fail";
        why = "output " + std::to_string(i) + ": " + r.message;
      }
    }
    for (size_t i = 0; i < inputs.size() && check == "pass"; ++i)
      if (!fj::same_values(inputs[i].toTensor(), eager_inputs[i].toTensor())) {
        check = "fail";
        why = "input " + std::to_string(i) + " after the call differs from eager's";
      }
  }
  double eager_ms = -1, fused_ms = -1;
  if (a.bench > 0) {
    eager_ms = median_ms(a.bench, [&] { module.forward(inputs); });
    fused_ms = median_ms(a.bench, [&] { fused(inputs); });
  }
  if (!a.save_outputs.empty()) {
    // A tuple: LibTorch's pickler tags lists with their type, which torch.load(weights_only=True), the
    // default, refuses; a tuple of tensors loads everywhere.
    std::vector<c10::IValue> items(outs.begin(), outs.end());
    auto bytes = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
    write_atomically("--save-outputs", a.save_outputs, bytes.data(), bytes.size());
  }
  auto stats = fused.stats();
  int ops = 0, groups = 0, kernels = 0;
  std::map<std::string, int> fallback;
  if (plan) {
    ops = plan->fused_ops;
    for (auto& [k, v] : plan->aten_ops) ops += v;
    groups = plan->num_groups;
    kernels = static_cast<int>(plan->kernels.size());
    fallback = plan->aten_ops;
  }
  if (a.json) {
    nlohmann::json j;
    j["check"] = check;
    if (!why.empty()) j["check_message"] = why;
    j["ops"] = ops;
    j["fused_groups"] = groups;
    j["kernels"] = kernels;
    j["fallback_ops"] = fallback;
    j["max_abs_err"] = max_err;
    j["eager_ms"] = eager_ms >= 0 ? nlohmann::json(eager_ms) : nlohmann::json(nullptr);
    j["fused_ms"] = fused_ms >= 0 ? nlohmann::json(fused_ms) : nlohmann::json(nullptr);
    j["compile_ms"] = stats.compile_ms;
    j["eager_first_ms"] = eager_first_ms;  // eager's first call in this process
    j["first_call_ms"] = first_ms;         // the fused first call: capture, plan (or cache), run
    j["compiler_invocations"] = fj::host_compile_stats().compiles + fj::nvrtc_stats().compiles;
    const fj::CacheStats cs = fj::KernelsCache::instance().stats();
    j["cache"] = {{"hits", cs.hits}, {"misses", cs.misses}, {"corrupt", cs.corrupt}, {"evictions", cs.evictions},
                  {"bytes_read", cs.bytes_read}, {"bytes_written", cs.bytes_written}};
    j["eager_fallback"] = plan ? nlohmann::json(nullptr) : nlohmann::json(first_line(fused.explain(inputs)));
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %d ops, %d fused groups, %d kernels per call, %zu ATen ops, compile %.1f ms\n", a.model.c_str(), ops,
                groups, kernels, fallback.size(), stats.compile_ms);
    if (!plan) std::printf("%s", fused.explain(inputs).c_str());
    if (a.check) std::printf("check: %s (max abs error %.3g)%s%s\n", check.c_str(), max_err, why.empty() ? "" : ": ", why.c_str());
    if (a.bench > 0) std::printf("eager %.3f ms, fused %.3f ms, speedup %.2fx\n", eager_ms, fused_ms, eager_ms / fused_ms);
  }
  return check == "fail" ? 1 : 0;
}

}  // namespace

// fusion-jit cache: the on-disk kernel cache (src/kernels_cache/kernels_cache.h).
int cache_main(int argc, char** argv) {
  if (argc < 3) usage_error("cache: missing command (stats, ls, verify, clear or prune)");
  const std::string cmd = argv[2];
  std::vector<std::string> rest(argv + 3, argv + argc);
  fj::KernelsCache& c = fj::KernelsCache::instance();
  auto human = [](int64_t b) { return fj::format_bytes(b); };
  if (cmd == "stats" || cmd == "ls" || cmd == "verify" || cmd == "clear") {
    if (!rest.empty()) usage_error("cache " + cmd + ": unexpected argument '" + rest[0] + "'");
  } else if (cmd != "prune") {
    usage_error("cache: unknown command '" + cmd + "' (stats, ls, verify, clear or prune)");
  }
  if (cmd == "stats") {
    auto entries = c.list();
    int64_t total = 0;
    for (const auto& e : entries) total += e.bytes;
    const std::string problem = c.unusable_reason();
    std::printf("directory: %s\n", c.dir().empty() ? "none" : c.dir().c_str());
    if (!problem.empty()) std::printf("status: not used (%s); compiled kernels are kept in memory only\n", problem.c_str());
    std::printf("entries: %zu\nsize: %s of %s\n", entries.size(), human(total).c_str(), human(c.max_bytes()).c_str());
    return 0;
  }
  if (cmd == "ls" || cmd == "verify") {
    const time_t now = ::time(nullptr);
    int bad = 0;
    for (const auto& e : c.list(cmd == "verify")) {
      if (cmd == "verify" && !e.valid) {
        bad++;
        std::printf("BAD %s %s\n", e.key.c_str(), e.path.c_str());
      } else if (cmd == "ls") {
        std::printf("%s %10lld %8llds ago\n", e.key.c_str(), static_cast<long long>(e.bytes),
                    static_cast<long long>(now - e.mtime));
      }
    }
    if (cmd == "verify") std::printf("%zu entries checked, %d bad\n", c.list().size(), bad);
    return bad ? 1 : 0;
  }
  if (cmd == "clear") {
    size_t n = c.list().size();
    c.clear();
    std::printf("removed %zu entries from %s\n", n, c.dir().c_str());
    return 0;
  }
  int64_t max = c.max_bytes();
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] != "--max-size" || i + 1 >= rest.size())
      usage_error("cache prune: expected [--max-size SIZE], got '" + rest[i] + "'");
    static const std::regex re(R"(^([0-9]+)([KMG]?)$)");
    std::smatch m;
    const std::string v = rest[++i];
    if (!std::regex_match(v, m, re)) usage_error("cache prune --max-size " + v + ": expected a size such as 512M or 2G");
    const int shift = m[2] == "K" ? 10 : m[2] == "M" ? 20 : m[2] == "G" ? 30 : 0;
    int64_t n = 0;
    if (fj::parse_int64(m[1].str(), &n) != fj::ParseStatus::kOk || !fj::checked_shl(n, shift, &max))
      usage_error("cache prune --max-size " + v + ": too large (at most " +
                  std::to_string(std::numeric_limits<int64_t>::max() >> shift) + m[2].str() + ")");
  }
  int64_t removed = c.prune(max);
  std::printf("removed %s; %zu entries left\n", human(removed).c_str(), c.list().size());
  return 0;
}

// fusion-jit fuzz: a differential fuzzing campaign (src/fuzz/fuzzer.h).
int fuzz_main(int argc, char** argv) {
  fj::fuzz::Options opt;
  opt.cli = argv[0];
  opt.max_graphs = -1;
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (size_t i = 0; i < rest.size(); ++i) {
    auto value = [&](const std::string& flag) {
      if (i + 1 >= rest.size()) usage_error(flag + " needs a value");
      return rest[++i];
    };
    const std::string& r = rest[i];
    if (r == "--graphs") opt.max_graphs = parse_int(r, value(r), 1);
    else if (r == "--minutes") opt.max_seconds = 60.0 * static_cast<double>(parse_int(r, value(r), 1));
    else if (r == "--seed") opt.seed = static_cast<uint64_t>(parse_int(r, value(r), 0));
    else if (r == "--batch") opt.batch = static_cast<int>(parse_int(r, value(r), 1, std::numeric_limits<int>::max()));
    else if (r == "--out") opt.repro_dir = value(r);
    else if (r == "--nvrtc") opt.check.nvrtc_arch = value(r);
    else if (r == "--graph-seeds") {
      std::string list = value(r);
      size_t start = 0;
      while (start <= list.size()) {
        size_t end = std::min(list.find(',', start), list.size());
        std::string item = list.substr(start, end - start);
        uint64_t v = 0;
        fj::ParseStatus st = fj::parse_uint64(item, &v);
        if (st == fj::ParseStatus::kMalformed) usage_error("--graph-seeds: '" + item + "' is not a graph seed");
        if (st == fj::ParseStatus::kOutOfRange) usage_error("--graph-seeds: '" + item + "' is too large for a graph seed");
        opt.graph_seeds.push_back(v);
        start = end + 1;
      }
    }
    else if (r == "--device") {
      std::string d = value(r);
      if (d != "cpu" && d != "cuda") usage_error("--device " + d + ": fuzz runs on cpu or cuda");
      opt.check.cuda = d == "cuda";
    } else usage_error("unknown option " + r + " for fuzz");
  }
  if (opt.max_graphs < 0) opt.max_graphs = opt.max_seconds > 0 || !opt.graph_seeds.empty() ? std::numeric_limits<int64_t>::max() : 2000;
  if (opt.repro_dir.empty()) opt.repro_dir = "fuzz-repros";
  if (!opt.check.nvrtc_arch.empty()) {
    std::string why;
    if (!fj::nvrtc_available(&why)) usage_error("--nvrtc: " + why);
    fj::check_cuda_arch(opt.check.nvrtc_arch);
  }
  if (opt.check.cuda) {
    std::string why;
    if (!fj::cuda_driver_available(&why)) usage_error("--device cuda: " + why);
    if (fj::torch_cuda_device_count() == 0) usage_error("--device cuda: torch sees no CUDA device");
  }
  struct stat st;
  if (::stat(opt.repro_dir.c_str(), &st) != 0 && ::mkdir(opt.repro_dir.c_str(), 0755) != 0)
    usage_error("--out " + opt.repro_dir + ": cannot create (" + std::strerror(errno) + ")");
  torch::jit::setGraphExecutorOptimize(false);
  std::fprintf(stderr, "fuzzing: seed %llu, %s, repros in %s\n", static_cast<unsigned long long>(opt.seed),
               opt.max_seconds > 0 ? (std::to_string(static_cast<int>(opt.max_seconds / 60)) + " minutes").c_str()
                                   : (std::to_string(opt.max_graphs) + " graphs").c_str(),
               opt.repro_dir.c_str());
  auto rep = fj::fuzz::run(opt, [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); });
  std::printf("%lld graphs (%lld ops) in %.1f s, %.1f ms per graph; %zu failures%s\n",
              static_cast<long long>(rep.graphs), static_cast<long long>(rep.ops), rep.seconds,
              rep.graphs ? 1e3 * rep.seconds / static_cast<double>(rep.graphs) : 0.0, rep.failures.size(),
              rep.failures.empty() ? "" : (", repros in " + opt.repro_dir).c_str());
  for (const auto& f : rep.failures) std::printf("%s\n", f.c_str());
  if (rep.nvrtc_kernels > 0)
    std::printf("NVRTC (%s): %lld kernels compiled in %.1f s\n", opt.check.nvrtc_arch.c_str(),
                static_cast<long long>(rep.nvrtc_kernels), rep.nvrtc_seconds);
  std::printf("%lld passed, %zu failed\n", static_cast<long long>(rep.graphs) - static_cast<long long>(rep.failures.size()),
              rep.failures.size());
  return rep.failures.empty() ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "fuzz") return fuzz_main(argc, argv);
    if (argc > 1 && std::string(argv[1]) == "cache") return cache_main(argc, argv);
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fusion-jit: %s\n", e.what());
    return 2;
  } catch (const fj::Error& e) {
    std::fprintf(stderr, "fusion-jit: %s\n", first_line(e.what()).c_str());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fusion-jit: %s\n", first_line(e.what_without_backtrace()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-jit: internal error: %s\n", first_line(e.what()).c_str());
    return 3;
  }
}
