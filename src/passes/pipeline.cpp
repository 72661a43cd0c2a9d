#include <chrono>
#include <cstdio>

#include "passes/passes.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

// One step of the pipeline: a pass, or a rule set run to its fixed point (`rules`).
struct Step {
  const char* name;
  std::function<bool(Graph&)> run;
  const RuleSet* rules = nullptr;
};

// The rule of constant_fold that FUSION_JIT_DISABLE (or a caller's skip) may leave out (Note [Prepacked
// weights]).
constexpr const char* kFoldPrepacked = "constant_fold.prepacked";

std::vector<Step> steps(const ConstantEvaluator& eval, const std::set<std::string>& disabled) {
  return {
      // Before decompose, which would take the softmax apart.
      {"attention", nullptr, &attention_rules()},
      {"decompose", nullptr, &decompositions()},
      {"dce", dce},
      // Before constant_fold, which evaluates the folded weights and biases the fold rules build.
      {"fold", nullptr, &fold_rules()},
      // oneDNN convolutions with post-ops and prepacked weights where the plan is channels-last (Note
      // [Convolution rules]).
      {"epilogue", nullptr, &epilogue_rules()},
      {"prepack", nullptr, &prepack_rules()},
      // After prepack, whose nchw_result leaves an NCHW input to a call with an NCHW result.
      {"layout", nullptr, &layout_rules()},
      // After prepack, which takes the frozen linears: what is left has its weight given at each call.
      {"gemm", nullptr, &gemm_rules()},
      {"dce", dce},
      {"constant_fold",
       [&eval, &disabled](Graph& gr) { return constant_fold(gr, eval, !disabled.count(kFoldPrepacked)); }},
      {"cse", cse},
      {"dce", dce},
      // After the rules above, whose patterns read views where the graph has them, and after cse, which
      // makes one value of two equal ops before each would take a view of its own.
      {"views", nullptr, &view_rules()},
      {"cse", cse},
  };
}

// FUSION_JIT_DISABLE knows the pipeline's names as soon as the library is loaded.
const bool kNamesRegistered = (Options::register_disable_names(pipeline_names()), true);

}  // namespace

std::vector<std::string> pipeline_names() {
  std::vector<std::string> names;
  for (const Step& s : steps(nullptr, {})) {
    names.push_back(s.name);
    if (std::string(s.name) == "constant_fold") names.push_back(kFoldPrepacked);
    if (s.rules)
      for (const auto& r : s.rules->rule_names()) names.push_back(r);
  }
  return names;
}

std::vector<PassTiming> run_pipeline(Graph& g, const ConstantEvaluator& eval, const std::set<std::string>& skip) {
  (void)kNamesRegistered;
  const Options& opt = Options::get();
  std::vector<PassTiming> timings;
  std::vector<RuleApplication> all;
  if (opt.dumps("ir")) std::fprintf(stderr, "== IR after capture ==\n%s", print_graph(g).c_str());
  std::set<std::string> disabled = opt.disabled;
  disabled.insert(skip.begin(), skip.end());
  verify_graph(g);  // as the steps get it; then after each step that changes it
  for (const Step& p : steps(eval, disabled)) {
    if (disabled.count(p.name)) continue;
    PassTiming t{p.name, 0, false, {}};
    if (ShapeGuards* guards = current_guards()) guards->set_phase(std::string("pass ") + p.name);
    auto t0 = std::chrono::steady_clock::now();
    t.changed = p.rules ? run_rules(g, *p.rules, disabled, &t.rewrites) : p.run(g);
    t.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // A step that changed nothing left the graph as verified before it.
    if (t.changed) verify_graph(g);
    if (t.changed && opt.dumps("ir")) {
      std::string rules = summarize(t.rewrites);
      std::fprintf(stderr, "== IR after %s (%.3f ms)%s%s ==\n", p.name, t.ms, rules.empty() ? "" : ": ", rules.c_str());
      for (const auto& a : t.rewrites)
        if (a.declined.empty()) std::fprintf(stderr, "  rule %s replaced %s\n", a.rule.c_str(), a.replaced.c_str());
      std::fprintf(stderr, "%s", print_graph(g).c_str());
    }
    all.insert(all.end(), t.rewrites.begin(), t.rewrites.end());
    timings.push_back(std::move(t));
  }
  const std::string applied = summarize(all);
  if (!applied.empty()) g.notes().push_back("rewrites: " + applied);
  for (const auto& a : all)
    if (!a.declined.empty()) g.notes().push_back("declined: " + a.rule + " at " + a.replaced + ": " + a.declined);
  return timings;
}

}  // namespace fusion_jit
