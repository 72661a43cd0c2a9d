#include <chrono>
#include <cstdio>

#include "passes/passes.h"
#include "support/options.h"

namespace fusion_jit {

std::vector<PassTiming> run_pipeline(Graph& g, const ConstantEvaluator& eval) {
  const Options& opt = Options::get();
  struct Pass {
    const char* name;
    std::function<bool(Graph&)> run;
  };
  const Pass passes[] = {
      {"decompose", decompose},
      {"dce", dce},
      {"constant_fold", [&](Graph& gr) { return constant_fold(gr, eval); }},
      {"cse", cse},
      {"dce", dce},
  };
  std::vector<PassTiming> timings;
  if (opt.dumps("ir")) std::fprintf(stderr, "== IR after capture ==\n%s", print_graph(g).c_str());
  for (const auto& p : passes) {
    if (opt.is_disabled(p.name)) continue;
    auto t0 = std::chrono::steady_clock::now();
    bool changed = p.run(g);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    verify_graph(g);
    timings.push_back({p.name, ms, changed});
    if (changed && opt.dumps("ir"))
      std::fprintf(stderr, "== IR after %s (%.3f ms) ==\n%s", p.name, ms, print_graph(g).c_str());
  }
  return timings;
}

}  // namespace fusion_jit
