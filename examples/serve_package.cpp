// Serving an ahead-of-time package: no capture, no compiler, no TorchScript interpreter, no cache.
//
//   fusion-jit package model.pt --input f32[32,256] --signature "f32[8,256]" --out model.fjpkg   (any machine)
//   serve_package model.fjpkg 32 256                                                           (the server)
//
// Loads the package, runs it on a float32 input of the given sizes and prints the time of each step.
// `--save FILE` after the sizes writes the input, then the first output, as raw float32 values (what
// tests/install_test.sh compares with eager's result).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fusion_jit/package.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PACKAGE SIZE [SIZE ...] [--save FILE]   (one float32 input of these sizes)\n",
                 argv[0]);
    return 2;
  }
  std::string save;
  if (argc >= 5 && std::strcmp(argv[argc - 2], "--save") == 0) {
    save = argv[argc - 1];
    argc -= 2;
  }
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point t0) { return std::chrono::duration<double, std::milli>(clock::now() - t0).count(); };
  std::vector<int64_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  try {
    const fusion_jit::LoadedPackage served = fusion_jit::load_package(argv[1]);
    std::printf("loaded %s in %.2f ms (constants %.2f ms, of which prepacking %.2f ms); it serves:\n", argv[1],
                served.load_ms(), served.constants_ms(), served.prepack_ms());
    for (const std::string& s : served.signatures()) std::printf("  %s\n", s.c_str());
    c10::NoGradGuard no_grad;
    const at::Tensor x = at::randn(sizes);
    auto t0 = clock::now();
    c10::IValue out = served({x});
    std::printf("first call: %.3f ms\n", ms(t0));
    std::vector<double> times;
    for (int i = 0; i < 50; ++i) {
      auto t1 = clock::now();
      out = served({x});
      times.push_back(ms(t1));
    }
    std::sort(times.begin(), times.end());
    std::printf("median of 50 calls: %.3f ms\n", times[25]);
    const at::Tensor y = out.isTensor() ? out.toTensor() : out.toTupleRef().elements()[0].toTensor();
    std::printf("output: %s, sum %.6g\n", c10::str(y.sizes()).c_str(), y.sum().item<double>());
    if (!save.empty()) {
      std::ofstream f(save, std::ios::binary);
      for (const at::Tensor& t : {x, y.to(at::kFloat).contiguous()})
        f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
      if (!f) {
        std::fprintf(stderr, "serve_package: cannot write %s\n", save.c_str());
        return 1;
      }
    }
  } catch (const fusion_jit::Error& e) {
    std::fprintf(stderr, "serve_package: %s\n", e.what());
    return 1;
  }
  return 0;
}
