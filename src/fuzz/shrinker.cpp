// The shrinker: a failing recipe made smaller (outputs, ops, shapes, values, layouts) while it still fails.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "fuzz/fuzz_internal.h"

namespace fusion_jit::fuzz {

namespace {

bool still_fails(const Recipe& r, const CheckOptions& co) {
  Replay rp;
  if (!replay(r, make_inputs(r), false, nullptr, &rp)) return false;
  if (co.through_class) {
    ClassCheck c = check_class({r}, co);
    return c.covered[0] && !c.results[0].ok;
  }
  return !check_batch({r}, co).at(0).ok;
}

// The recipe without op k, its uses replaced by value `with`; dead ops dropped.
std::optional<Recipe> bypass(const Recipe& r, size_t k, int with) {
  int n_in = static_cast<int>(r.inputs.size());
  int removed = n_in + static_cast<int>(k);
  Recipe out = r;
  out.ops.clear();
  std::map<int, int> remap;
  for (int i = 0; i < n_in; ++i) remap[i] = i;
  for (size_t j = 0; j < r.ops.size(); ++j) {
    int old = n_in + static_cast<int>(j);
    if (old == removed) {
      remap[old] = remap.at(with);
      continue;
    }
    OpSpec op = r.ops[j];
    for (auto& a : op.args)
      if (a.value >= 0) a.value = remap.at(a.value);
    remap[old] = n_in + static_cast<int>(out.ops.size());
    out.ops.push_back(op);
  }
  out.outputs.clear();
  for (int o : r.outputs) {
    int m = remap.at(o);
    if (m >= n_in && std::find(out.outputs.begin(), out.outputs.end(), m) == out.outputs.end()) out.outputs.push_back(m);
  }
  if (out.outputs.empty() || out.ops.empty()) return std::nullopt;
  return out;
}

}  // namespace

Recipe shrink(const Recipe& start, const std::function<void(const std::string&)>& log, const CheckOptions& co) {
  Recipe r = start;
  int checks = 0;
  const int kMaxChecks = 300;
  bool progress = true;
  while (progress && checks < kMaxChecks) {
    progress = false;
    // One output at a time.
    if (r.outputs.size() > 1) {
      for (int o : r.outputs) {
        Recipe c = r;
        c.outputs = {o};
        ++checks;
        if (still_fails(c, co)) {
          r = c;
          progress = true;
          break;
        }
      }
    }
    // Bypass ops, last first.
    for (size_t k = r.ops.size(); k-- > 0 && checks < kMaxChecks;) {
      std::set<int> withs;
      for (const auto& a : r.ops[k].args)
        if (a.value >= 0) withs.insert(a.value);
      bool done = false;
      for (int w : withs) {
        auto c = bypass(r, k, w);
        if (!c) continue;
        ++checks;
        if (still_fails(*c, co)) {
          r = *c;
          progress = done = true;
          break;
        }
      }
      if (done) break;
    }
    // Smaller shapes, simpler values and layouts.
    for (size_t i = 0; i < r.inputs.size() && checks < kMaxChecks; ++i) {
      auto& in = r.inputs[i];
      for (size_t d = 0; d < in.sizes.size(); ++d) {
        if (in.sizes[d] <= 1 || in.layout == Layout::kHugeStride) continue;
        Recipe c = r;
        c.inputs[i].sizes[d] = (in.sizes[d] + 1) / 2;
        ++checks;
        if (still_fails(c, co)) {
          r = c;
          progress = true;
        }
      }
      if (r.inputs[i].specials) {
        Recipe c = r;
        c.inputs[i].specials = false;
        ++checks;
        if (still_fails(c, co)) r = c, progress = true;
      }
      if (r.inputs[i].layout != Layout::kContiguous && r.inputs[i].layout != Layout::kHugeStride) {
        Recipe c = r;
        c.inputs[i].layout = Layout::kContiguous;
        ++checks;
        if (still_fails(c, co)) r = c, progress = true;
      }
    }
  }
  if (log) log(fmt::format("shrunk from {} ops to {} in {} checks", start.ops.size(), r.ops.size(), checks));
  return r;
}

}  // namespace fusion_jit::fuzz
