// Loads a TorchScript model, compiles it with fusion_jit, checks the fused result against eager and
// prints timings.
//
//   fusion_jit_example MODEL.pt [SIZE ...]   MODEL.pt takes one float32 tensor of these sizes (default 64 1024)
//   fusion_jit_example                        the same with a small model defined below
//
// Prints "match: yes" when every output agrees with eager (float32: rtol 1.3e-6, atol 1e-5); exits with
// 1 when one does not, 2 for a bad command line or model.
#include <fusion_jit/fusion_jit.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median_ms(int n, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The model used without an argument: a GELU-like chain and a softmax, which fuse into few kernels.
torch::jit::Module builtin_model() {
  torch::jit::Module m("Example");
  m.register_parameter("scale", at::randn({1024}), /*is_buffer=*/false);
  m.define(R"(
def forward(self, x):
    y = x * self.scale + 1.0
    y = 0.5 * y * (1.0 + torch.tanh(0.7978845608 * (y + 0.044715 * y * y * y)))
    return torch.softmax(y, -1)
)");
  return m;
}

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple() || v.isList()) {
    auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
    for (const auto& e : items) {
      auto inner = tensors_of(e);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {64, 1024};
  torch::jit::Module model;
  std::string name = "built-in model";
  try {
    if (argc > 1) {
      name = argv[1];
      model = torch::jit::load(name);
      if (argc > 2) sizes.clear();
      for (int i = 2; i < argc; ++i) sizes.push_back(std::stoll(argv[i]));
    } else {
      model = builtin_model();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_jit_example: %s: %s\n", name.c_str(), e.what());
    return 2;
  }
  model.eval();
  std::vector<c10::IValue> inputs = {at::randn(sizes)};

  auto fused = fusion_jit::compile(model);
  auto t0 = std::chrono::steady_clock::now();
  fused(inputs);  // captures, fuses and compiles for this signature
  const double first_ms = ms_since(t0);
  const c10::IValue eager = model.forward(inputs);
  const c10::IValue out = fused(inputs);  // runs the compiled plan

  auto got = tensors_of(out), want = tensors_of(eager);
  bool match = got.size() == want.size() && !got.empty();
  double max_err = 0;
  for (size_t i = 0; match && i < got.size(); ++i) {
    match = got[i].sizes() == want[i].sizes() && got[i].scalar_type() == want[i].scalar_type() &&
            at::allclose(got[i], want[i], 1.3e-6, 1e-5, /*equal_nan=*/true);
    if (got[i].sizes() == want[i].sizes())
      max_err = std::max(max_err, (got[i] - want[i]).abs().max().item<double>());
  }

  const int runs = 50;
  const double eager_ms = median_ms(runs, [&] { model.forward(inputs); });
  const double fused_ms = median_ms(runs, [&] { fused(inputs); });
  const fusion_jit::ModuleStats stats = fused.stats();
  std::printf("%s: first call %.1f ms (compile %.1f ms)\n", name.c_str(), first_ms, stats.compile_ms);
  std::printf("eager %.3f ms, fused %.3f ms per call (median of %d), speedup %.2fx\n", eager_ms, fused_ms, runs,
              eager_ms / fused_ms);
  std::printf("match: %s (max abs error %.3g over %zu outputs)\n", match ? "yes" : "no", max_err, got.size());
  return match ? 0 : 1;
}
