// The Python binding: TORCH_LIBRARY registrations, loaded by the Python package with
// torch.ops.load_library. No Python headers: torch's own bindings carry the calls.
//
//   torch.classes.fusion_jit.GraphFunction(name, enable_fusion, cuda_graphs)
//     .run(tensors, key) -> (found, outputs)       the plan of this signature, if one was added
//     .add(tensors, key, ir, constants) -> [kernels, fused_ops, aten_ops, compile_ms, from_plan_cache]
//     .explain(tensors, key) -> str, .num_plans() -> int, .clear()
//   torch.ops.fusion_jit.counters() -> [cache hits, cache misses, host compiles, NVRTC compiles]
//   torch.ops.fusion_jit.use_cache_dir(dir), torch.ops.fusion_jit.cache_dir() -> str
//   torch.ops.fusion_jit.check_close(actual, expected, reference64?) -> (ok, max error, why not)
//     the accuracy rule of DESIGN.md (torch/tolerance.h), for the Python tests
//
// fusion_jit::Error reaches Python as ValueError, fusion_jit::TypeError as TypeError (c10's ValueError
// and TypeError, which torch translates), anything else as RuntimeError.
#include <torch/custom_class.h>
#include <torch/library.h>

#include "compile/host_compiler.h"
#include "compile/nvrtc.h"
#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "torch/api.h"
#include "torch/tolerance.h"

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
  PyGraphFunction(const std::string& name, bool enable_fusion, bool cuda_graphs)
      : fn(name, [&] {
          CompileOptions o;
          o.enable_fusion = enable_fusion;
          o.cuda_graphs = cuda_graphs;
          return o;
        }()) {}
  GraphFunction fn;
};

using Self = c10::intrusive_ptr<PyGraphFunction>;

std::tuple<bool, std::vector<at::Tensor>> run(const Self& self, const std::vector<at::Tensor>& inputs,
                                              const std::string& key) {
  return translate_errors([&] {
    std::vector<at::Tensor> outs;
    bool found = self->fn.run(inputs, key, &outs);
    return std::make_tuple(found, std::move(outs));
  });
}

std::vector<double> add(const Self& self, const std::vector<at::Tensor>& inputs, const std::string& key,
                        const std::string& ir, const std::vector<at::Tensor>& constants) {
  return translate_errors([&] {
    GraphPlanInfo i = self->fn.add(inputs, key, ir, constants);
    return std::vector<double>{static_cast<double>(i.kernels), static_cast<double>(i.fused_ops),
                               static_cast<double>(i.aten_ops), i.compile_ms, i.from_plan_cache ? 1.0 : 0.0};
  });
}

std::vector<int64_t> counters() {
  CacheStats c = KernelsCache::instance().stats();
  return {c.hits, c.misses, host_compile_stats().compiles, nvrtc_stats().compiles};
}

}  // namespace
}  // namespace fusion_jit

TORCH_LIBRARY(fusion_jit, m) {
  using namespace fusion_jit;
  m.class_<PyGraphFunction>("GraphFunction")
      .def(torch::init<std::string, bool, bool>())
      .def("run", &run)
      .def("add", &add)
      .def("explain",
           [](const Self& self, const std::vector<at::Tensor>& inputs, const std::string& key) {
             return translate_errors([&] { return self->fn.explain(inputs, key); });
           })
      .def("num_plans", [](const Self& self) { return static_cast<int64_t>(self->fn.num_plans()); })
      .def("clear", [](const Self& self) { self->fn.clear(); });
  m.def("counters", &counters);
  m.def("use_cache_dir", [](const std::string& dir) { translate_errors([&] { KernelsCache::use_dir(dir); }); });
  m.def("cache_dir", []() { return KernelsCache::instance().dir(); });
  m.def("check_close", [](const at::Tensor& actual, const at::Tensor& expected, const std::optional<at::Tensor>& ref64) {
    CheckResult r = check_close(actual, expected, ref64);
    return std::make_tuple(r.ok, r.max_abs_err, r.message);
  });
}
