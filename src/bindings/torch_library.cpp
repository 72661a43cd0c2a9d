// The Python binding: TORCH_LIBRARY registrations, loaded by the Python package with
// torch.ops.load_library. No Python headers: torch's own bindings carry the calls. It uses the public API
// (fusion_jit/fusion_jit.h, fusion_jit/cache.h, fusion_jit/package.h), the tolerance rule, the step
// profiler, the option table and the cost model's layout estimate only.
//
//   torch.classes.fusion_jit.GraphFunction(name, enable_fusion, cuda_graphs, specialization_limit, disable,
//                                          dynamic)
//     specialization_limit < 0: the FUSION_JIT_SPECIALIZATION_LIMIT option; disable: CompileOptions::disable;
//     dynamic: CompileOptions::dynamic, "" for the FUSION_JIT_DYNAMIC option
//     .run(tensors, key) -> (status, outputs)      status 0: ran, 1: no plan yet (add one), 2: runs eagerly
//     .add(tensors, key, ir, constants) -> [compiled, kernels, fused_ops, aten_ops, compile_ms,
//                                           from_plan_cache, added_here]
//     .add_run(tensors, key, ir, constants) -> (add's list, outputs)   add, and the new plan run once on
//                                           the tensors with its ATen steps' results checked against the
//                                           graph's types (outputs empty: another thread added it)
//     .add_from_class(tensors, key, class_ir, symbols, values, constants) -> (add's list + [class built here],
//                                           outputs, outside)   Note [Plans of a shape class]: this
//                                           signature's plan from the class's (built at its first use), run
//                                           once as add_run's; `outside` says why the call is not in the
//                                           class ("" inside), and then nothing is added
//     .add_at(tensors, key, class_ir, symbols, values, constants, run) -> (add's list, outputs)   add (run:
//                                           add_run) of the class's graph concretized at the values
//     .num_classes() -> int                        class plans built
//     .take_warnings() -> [str]                    warnings since the last call (each given once)
//     .explain(tensors, key) -> str, .num_plans() -> int, .plans_dropped() -> int, .clear()
//   torch.classes.fusion_jit.Package(path, key_file)   an ahead-of-time package loaded (fusion_jit/package.h;
//     key_file: LoadOptions::key_file, "" for FUSION_JIT_PACKAGE_KEY's)
//     .run(tensors) -> [tensors]  (the result flattened), .signatures() -> [str], .explain() -> str,
//     .load_ms() -> float, .constants_ms() -> float, .prepack_ms() -> float, .device() -> str,
//     .verified_with() -> str
//   torch.ops.fusion_jit.package_file(model_path, tensors, counts, out, cpu_variants, device, cuda_archs, key_file)
//     -> [signatures, kernels, sources, bytes, constant bytes, signed (0 or 1)]   the TorchScript model at
//     model_path packaged for the signatures of tensors (counts[i] each, in order); key_file:
//     PackageOptions::key_file
//   torch.ops.fusion_jit.package_graphs_file(name, tensors, counts, irs, constants, constant_counts, out,
//     cpu_variants, device, cuda_archs, key_file) -> as package_file   graphs lowered to IR text, one per signature
//   torch.ops.fusion_jit.counters() -> [cache hits, cache misses, host compiles, NVRTC compiles]
//   torch.ops.fusion_jit.use_cache_dir(dir), torch.ops.fusion_jit.cache_dir() -> str
//   torch.ops.fusion_jit.check_close(actual, expected, reference64?) -> (ok, max error, why not)
//     the accuracy rule of DESIGN.md (torch/tolerance.h), for the Python tests
//   torch.ops.fusion_jit.channels_last_estimate(written, weights, copied, edges) -> [gain_us, cost_us]
//     Note [Channels-last activations]: the cost model's estimate on this CPU (cost/cost_model.h)
//   torch.ops.fusion_jit.conv_timing(x, w, stride, padding, dilation, groups, bfloat16, bias) -> [us x 4] or []
//     Note [Convolutions timed on this machine] (passes/conv_common.h): ATen's, oneDNN's channels-last and
//     NCHW calls, the copy to NCHW
//   torch.ops.fusion_jit.option(name) -> str   the FUSION_JIT_* variable `name` as the option table parses it
//     from the environment as it is now (Options::value, support/options.h): how the package reads its
//     options, so that their parsing, checks and errors are the table's
//
// fusion_jit::Error reaches Python as ValueError, fusion_jit::TypeError as TypeError (c10's ValueError
// and TypeError, which torch translates), anything else as RuntimeError.
#include <torch/csrc/jit/serialization/import.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <mutex>
#include <utility>

#include "cost/cost_model.h"
#include "fusion_jit/cache.h"
#include "fusion_jit/error.h"
#include "fusion_jit/fusion_jit.h"
#include "fusion_jit/package.h"
#include "runtime/profile.h"
#include "passes/passes.h"
#include "support/options.h"
#include "torch/executor.h"
#include "torch/tolerance.h"

extern char** environ;

namespace fusion_jit {
namespace {

template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const TypeError& e) {
    TORCH_CHECK_TYPE(false, e.what());
  } catch (const Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const InternalError& e) {
    TORCH_CHECK(false, "fusion_jit internal error: ", e.what());
  }
}

struct PyGraphFunction : torch::CustomClassHolder {
  PyGraphFunction(const std::string& name, bool enable_fusion, bool cuda_graphs, int64_t limit,
                  const std::vector<std::string>& disable, const std::string& dynamic)
      : fn(name, [&] {
          CompileOptions o;
          o.enable_fusion = enable_fusion;
          if (!dynamic.empty()) o.dynamic = dynamic;
          o.disable = disable;
          o.cuda_graphs = cuda_graphs;
          if (limit >= 0) o.specialization_limit = static_cast<int>(limit);
          // Python's warnings module reports them (the package takes them after each call).
          o.on_warning = [this](const std::string& message) {
            std::lock_guard<std::mutex> g(mu);
            warnings.push_back(message);
          };
          return o;
        }()) {}
  std::mutex mu;
  std::vector<std::string> warnings;
  // Freezing (Note [Freezing] in the package): the frozen inputs as compiled, their version counters and
  // data pointers, checked at each call in one native call instead of a Python loop over them.
  struct Frozen {
    at::Tensor tensor;
    int64_t version;
    const void* data;
  };
  std::vector<Frozen> frozen;
  GraphFunction fn;  // last: its warning handler uses the members above
};

using Self = c10::intrusive_ptr<PyGraphFunction>;

std::tuple<int64_t, std::vector<at::Tensor>> run(const Self& self, const std::vector<at::Tensor>& inputs,
                                                 const std::string& key) {
  return translate_errors([&] {
    std::vector<at::Tensor> outs;
    GraphFunction::Status st = self->fn.run(inputs, key, &outs);
    return std::make_tuple(static_cast<int64_t>(st), std::move(outs));
  });
}

std::vector<double> info_list(const GraphPlanInfo& i) {
  return {i.compiled ? 1.0 : 0.0, static_cast<double>(i.kernels), static_cast<double>(i.fused_ops),
          static_cast<double>(i.aten_ops), i.compile_ms, i.from_plan_cache ? 1.0 : 0.0, i.added_here ? 1.0 : 0.0};
}

std::vector<double> add(const Self& self, const std::vector<at::Tensor>& inputs, const std::string& key,
                        const std::string& ir, const std::vector<at::Tensor>& constants) {
  return translate_errors([&] { return info_list(self->fn.add(inputs, key, ir, constants)); });
}

std::tuple<std::vector<double>, std::vector<at::Tensor>> add_run(const Self& self, const std::vector<at::Tensor>& inputs,
                                                                  const std::string& key, const std::string& ir,
                                                                  const std::vector<at::Tensor>& constants) {
  return translate_errors([&] {
    std::vector<at::Tensor> outs;
    GraphPlanInfo i = self->fn.add(inputs, key, ir, constants, &outs);
    return std::make_tuple(info_list(i), std::move(outs));
  });
}

std::map<std::string, int64_t> bindings_of(const char* what, const std::vector<std::string>& symbols,
                                          const std::vector<int64_t>& values) {
  if (symbols.size() != values.size())
    throw Error(std::string(what) + ": " + std::to_string(symbols.size()) + " symbols and " +
                std::to_string(values.size()) + " values");
  std::map<std::string, int64_t> bindings;
  for (size_t i = 0; i < symbols.size(); ++i) bindings[symbols[i]] = values[i];
  return bindings;
}

// add_run of the class's graph concretized at the symbols' values (GraphFunction::add_at); `run`: with the
// checked first run and its outputs.
std::tuple<std::vector<double>, std::vector<at::Tensor>> add_at(const Self& self, const std::vector<at::Tensor>& inputs,
                                                                 const std::string& key, const std::string& class_ir,
                                                                 const std::vector<std::string>& symbols,
                                                                 const std::vector<int64_t>& values,
                                                                 const std::vector<at::Tensor>& constants, bool run) {
  return translate_errors([&] {
    std::vector<at::Tensor> outs;
    GraphPlanInfo i = self->fn.add_at(inputs, key, class_ir, bindings_of("add_at", symbols, values), constants,
                                      run ? &outs : nullptr);
    return std::make_tuple(info_list(i), std::move(outs));
  });
}

std::tuple<std::vector<double>, std::vector<at::Tensor>, std::string> add_from_class(
    const Self& self, const std::vector<at::Tensor>& inputs, const std::string& key, const std::string& class_ir,
    const std::vector<std::string>& symbols, const std::vector<int64_t>& values, const std::vector<at::Tensor>& constants) {
  return translate_errors([&] {
    const std::map<std::string, int64_t> bindings = bindings_of("add_from_class", symbols, values);
    std::vector<at::Tensor> outs;
    GraphPlanInfo i = self->fn.add_from_class(inputs, key, class_ir, bindings, constants, &outs);
    std::vector<double> info = info_list(i);
    info.push_back(i.class_built_here ? 1.0 : 0.0);
    return std::make_tuple(std::move(info), std::move(outs), i.outside_class);
  });
}

std::vector<std::string> take_warnings(const Self& self) {
  std::lock_guard<std::mutex> g(self->mu);
  return std::exchange(self->warnings, {});
}

std::vector<int64_t> counter_list() {
  Counters c = fusion_jit::counters();
  return {c.cache_hits,  c.cache_misses,  c.host_compiles,  c.nvrtc_compiles,
          c.remote_hits, c.remote_misses, c.remote_refused, c.remote_errors,
          static_cast<int64_t>(c.remote_ms * 1000.0)};  // microseconds
}

// A tensor's version counter, or -1 for an inference tensor, which has none (reading it throws): such a
// tensor can only be changed in place under torch.inference_mode, which nothing here can see (Note
// [Freezing] in the package says so).
int64_t version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

void set_frozen(const Self& self, const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> g(self->mu);
  self->frozen.clear();
  for (const at::Tensor& t : tensors) self->frozen.push_back({t, version_of(t), t.data_ptr()});
}

// The indices (into the frozen list) of the tensors in `now` (those at the frozen positions in this call)
// that are not the frozen ones unchanged: another tensor object, changed in place (version counter), or
// given other data (`.data =`). Empty: all unchanged.
std::vector<int64_t> frozen_changed(const Self& self, const std::vector<at::Tensor>& now) {
  std::lock_guard<std::mutex> g(self->mu);
  std::vector<int64_t> changed;
  for (size_t i = 0; i < self->frozen.size(); ++i) {
    const auto& f = self->frozen[i];
    if (i >= now.size() || now[i].unsafeGetTensorImpl() != f.tensor.unsafeGetTensorImpl() ||
        version_of(now[i]) != f.version || now[i].data_ptr() != f.data)
      changed.push_back(static_cast<int64_t>(i));
  }
  return changed;
}

// The step profiler's figures: (name, calls, ns) for "plan" (run_plan's wall time), "kernels",
// "aten_compute", "aten_other", then each ATen schema (and "fj::kernel").
std::vector<std::tuple<std::string, int64_t, int64_t>> profile_list() {
  Profile p = profile_snapshot();
  std::vector<std::tuple<std::string, int64_t, int64_t>> out = {
      {"plan", p.plan_runs, p.plan_ns},
      {"kernels", p.kernels.calls, p.kernels.ns},
      {"aten_compute", p.aten_compute.calls, p.aten_compute.ns},
      {"aten_other", p.aten_other.calls, p.aten_other.ns}};
  for (const auto& [name, e] : p.by_op) out.emplace_back(name, e.calls, e.ns);
  return out;
}

// An ahead-of-time package loaded (fusion_jit/package.h).
struct PyPackage : torch::CustomClassHolder {
  explicit PyPackage(LoadedPackage p) : package(std::move(p)) {}
  LoadedPackage package;
};

// The result's tensors, in order (a tensor, or a tuple or list of them, nested).
void flatten_result(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) out->push_back(v.toTensor());
  else if (v.isTuple()) for (const auto& e : v.toTupleRef().elements()) flatten_result(e, out);
  else if (v.isList()) for (const auto& e : v.toListRef()) flatten_result(e, out);
}

// `items` split into consecutive runs of counts[i] each (a flat list of every signature's tensors).
std::vector<std::vector<at::Tensor>> split_by_counts(const std::vector<at::Tensor>& items,
                                                     const std::vector<int64_t>& counts, const char* what) {
  std::vector<std::vector<at::Tensor>> out;
  size_t at = 0;
  for (int64_t n : counts) {
    TORCH_CHECK_VALUE(n >= 0 && at + static_cast<size_t>(n) <= items.size(), "package: the signatures' ", what,
                      " counts do not add up");
    out.emplace_back(items.begin() + static_cast<int64_t>(at), items.begin() + static_cast<int64_t>(at) + n);
    at += static_cast<size_t>(n);
  }
  TORCH_CHECK_VALUE(at == items.size(), "package: the signatures' ", what, " counts do not add up");
  return out;
}

PackageOptions package_options(const std::vector<std::string>& cpu_variants, const std::string& device,
                               const std::vector<std::string>& cuda_archs, const std::string& key_file) {
  PackageOptions options;
  options.cpu_variants = cpu_variants;
  options.device = device;
  options.cuda_archs = cuda_archs;
  options.key_file = key_file;
  return options;
}

std::vector<int64_t> info_list(const PackageInfo& info) {
  return {info.signatures, info.kernels, info.sources, info.bytes, info.constant_bytes, !info.key_file.empty()};
}

// Packages the TorchScript model at `model_path` for the signatures of `inputs` (`counts[i]` tensors each, in
// order) into `out`; returns [signatures, kernels, sources, bytes, constant bytes].
std::vector<int64_t> package_file(const std::string& model_path, const std::vector<at::Tensor>& inputs,
                                  const std::vector<int64_t>& counts, const std::string& out,
                                  const std::vector<std::string>& cpu_variants, const std::string& device,
                                  const std::vector<std::string>& cuda_archs, const std::string& key_file) {
  return translate_errors([&] {
    std::vector<std::vector<c10::IValue>> signatures;
    for (const auto& sig : split_by_counts(inputs, counts, "input")) signatures.emplace_back(sig.begin(), sig.end());
    torch::jit::Module module = torch::jit::load(model_path);
    return info_list(package(module, signatures, out, package_options(cpu_variants, device, cuda_archs, key_file)));
  });
}

// Packages graphs lowered to IR text, one per signature: signature i has counts[i] of `inputs`, the IR
// irs[i] and constant_counts[i] of `constants`, in order. Returns what package_file returns.
std::vector<int64_t> package_graphs_file(const std::string& name, const std::vector<at::Tensor>& inputs,
                                         const std::vector<int64_t>& counts, const std::vector<std::string>& irs,
                                         const std::vector<at::Tensor>& constants,
                                         const std::vector<int64_t>& constant_counts, const std::string& out,
                                         const std::vector<std::string>& cpu_variants, const std::string& device,
                                         const std::vector<std::string>& cuda_archs, const std::string& key_file) {
  return translate_errors([&] {
    TORCH_CHECK_VALUE(counts.size() == irs.size() && constant_counts.size() == irs.size(), "package: ", irs.size(),
                      " graphs, ", counts.size(), " input counts, ", constant_counts.size(), " constant counts");
    const auto split_inputs = split_by_counts(inputs, counts, "input");
    const auto split_constants = split_by_counts(constants, constant_counts, "constant");
    std::vector<GraphSignature> signatures;
    for (size_t i = 0; i < irs.size(); ++i) signatures.push_back({split_inputs[i], irs[i], split_constants[i]});
    return info_list(
        package_graphs(name, signatures, out, package_options(cpu_variants, device, cuda_archs, key_file)));
  });
}

}  // namespace
}  // namespace fusion_jit

TORCH_LIBRARY(fusion_jit, m) {
  using namespace fusion_jit;
  m.class_<PyGraphFunction>("GraphFunction")
      .def(torch::init([](const std::string& name, bool enable_fusion, bool cuda_graphs, int64_t limit,
                          const std::vector<std::string>& disable, const std::string& dynamic) {
        // The limit's default is read here, from FUSION_JIT_SPECIALIZATION_LIMIT: a bad value is a ValueError,
        // and so is a disable name that is not a pass or rule.
        return translate_errors([&] {
          return c10::make_intrusive<PyGraphFunction>(name, enable_fusion, cuda_graphs, limit, disable, dynamic);
        });
      }))
      .def("run", &run)
      .def("add", &add)
      .def("add_run", &add_run)
      .def("add_from_class", &add_from_class)
      .def("add_at", &add_at)
      .def("num_classes", [](const Self& self) { return static_cast<int64_t>(self->fn.num_classes()); })
      .def("take_warnings", &take_warnings)
      .def("explain",
           [](const Self& self, const std::vector<at::Tensor>& inputs, const std::string& key) {
             return translate_errors([&] { return self->fn.explain(inputs, key); });
           })
      .def("set_frozen", &set_frozen)
      .def("frozen_changed", &frozen_changed)
      .def("num_plans", [](const Self& self) { return static_cast<int64_t>(self->fn.num_plans()); })
      .def("plans_dropped", [](const Self& self) { return static_cast<int64_t>(self->fn.plans_dropped()); })
      .def("clear", [](const Self& self) { self->fn.clear(); });
  using PackageSelf = c10::intrusive_ptr<PyPackage>;
  m.class_<PyPackage>("Package")
      .def(torch::init([](const std::string& path, const std::string& key_file) {
        return translate_errors([&] {
          LoadOptions options;
          options.key_file = key_file;
          return c10::make_intrusive<PyPackage>(load_package(path, std::move(options)));
        });
      }))
      .def("run",
           [](const PackageSelf& self, const std::vector<at::Tensor>& inputs) {
             return translate_errors([&] {
               std::vector<c10::IValue> in(inputs.begin(), inputs.end());
               std::vector<at::Tensor> out;
               flatten_result(self->package(in), &out);
               return out;
             });
           })
      .def("signatures", [](const PackageSelf& self) { return self->package.signatures(); })
      .def("explain", [](const PackageSelf& self) { return self->package.explain(); })
      .def("load_ms", [](const PackageSelf& self) { return self->package.load_ms(); })
      .def("constants_ms", [](const PackageSelf& self) { return self->package.constants_ms(); })
      .def("prepack_ms", [](const PackageSelf& self) { return self->package.prepack_ms(); })
      .def("device", [](const PackageSelf& self) { return self->package.device(); })
      .def("verified_with", [](const PackageSelf& self) { return self->package.verified_with(); });
  m.def("package_file", &package_file);
  m.def("package_graphs_file", &package_graphs_file);
  m.def("counters", &counter_list);
  m.def("profile_enable", [](bool on) {
    if (on) profile_reset();
    set_profiling(on);
  });
  m.def("profile_read", &profile_list);
  m.def("use_cache_dir", [](const std::string& dir) { translate_errors([&] { cache::use_dir(dir); }); });
  m.def("cache_dir", []() { return cache::dir(); });
  m.def("use_remote_cache", [](const std::string& url, const std::string& key_file) {
    translate_errors([&] { cache::use_remote(url, key_file); });
  });
  m.def("channels_last_estimate", [](int64_t written, int64_t weights, int64_t copied, int64_t edges) {
    static const DeviceDescription cpu = host_cpu_description();
    const LayoutEstimate e = channels_last_estimate(cpu, written, weights, copied, edges);
    return std::vector<double>{e.gain_us, e.cost_us};
  });
  m.def("conv_timing", [](std::vector<int64_t> x, std::vector<int64_t> w, std::vector<int64_t> stride,
                          std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups, bool bfloat16,
                          bool bias) {
    const ConvShape shape{x, w, stride, padding, dilation, groups, bfloat16 ? DType::kBFloat16 : DType::kFloat32, bias};
    const std::optional<ConvTiming> t = time_convolution(shape);
    return t ? std::vector<double>{t->aten_us, t->onednn_cl_us, t->onednn_nchw_us, t->copy_us} : std::vector<double>{};
  });
  m.def("option", [](const std::string& name) {
    return translate_errors([&] { return Options::value(name, environ); });
  });
  m.def("check_close", [](const at::Tensor& actual, const at::Tensor& expected, const std::optional<at::Tensor>& ref64) {
    CheckResult r = check_close(actual, expected, ref64);
    return std::make_tuple(r.ok, r.max_abs_err, r.message);
  });
}
