#include "driver/plan_io.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "support/error.h"
#include "targets/targets.h"

namespace fusion_jit {
namespace {

// Note [Symbolic sizes in the plan cache]
// A shape class's plan (Note [Plans of a shape class]) is stored as any plan is, each number that is an
// expression over the symbols written as its text ("64*s0") and its guards with it; a plan of numbers has
// only integers. Reading parses the expressions with the graph's symbols (the graph is the key's, so the
// symbols are the same; their hints are this process's), and the plan is a miss where its guards fail at
// those hints. Nothing read is trusted: the numbers are checked (check_plan_numbers) at the hints when
// read, and again at each size the class is instantiated at, since an expression fine at one size may
// reach outside a tensor at another.
nlohmann::json number(const SymInt& v) {
  if (v.is_symbolic()) return v.str();
  return v.hint();
}
nlohmann::json numbers(const SymSizes& v) {
  nlohmann::json j = nlohmann::json::array();
  for (const SymInt& x : v) j.push_back(number(x));
  return j;
}
SymInt read_number(const nlohmann::json& j, const SymBindings& hints) {
  if (!j.is_string()) return SymInt(j.get<int64_t>());
  const std::string text = j.get<std::string>();
  size_t pos = 0;
  SymInt v = parse_sym(text, pos, hints);
  if (pos != text.size()) throw Error("a number with trailing text: " + text);
  return v;
}
SymSizes read_numbers(const nlohmann::json& j, const SymBindings& hints) {
  SymSizes v;
  for (const auto& x : j) v.push_back(read_number(x, hints));
  return v;
}

// The layout's version, written into every plan: a change of layout changes it, and a plan of another
// format is never read (the plan cache counts it as a miss).
// 3: kernels keep their shape, not their code (the source holds it). 4: sources per target. 5: pieces
// (Note [Cats of unequal items]). 6: kernels' size arguments (Note [Sizes as kernel arguments]); a source
// may be a `source_ref` instead (the plan cache's, which a reader without one refuses as it refuses any
// field missing). 7: a shape class's plan, its numbers expressions and its guards (Note [Symbolic sizes in
// the plan cache]). 8: each kernel's calls by op class and its passes' loads (KernelCalls).
constexpr int kPlanFormat = 8;

// How many of its arguments kernel `name` of `source` reads: the `z_[` (CPU) and `z_.v[` (CUDA) in its
// function's text (each printed once, Note [Sizes as kernel arguments]).
size_t arguments_read(const std::string& source, const std::string& name) {
  size_t at = source.find(" " + name + "(");
  if (at == std::string::npos) return 0;
  const size_t end = source.find("\nextern \"C\"", at);
  size_t n = 0;
  for (const char* read : {"z_[", "z_.v["})
    for (size_t i = source.find(read, at); i < end; i = source.find(read, i + 1)) ++n;
  return n;
}

}  // namespace

// Everything a plan holds besides the graph, as JSON: kernels (specs with value ids), steps (a kernel or
// a node's position), what explain shows.
std::string serialize_plan(const ExecutablePlan& p, const KeepSource& keep) {
  nlohmann::json j;
  j["format"] = kPlanFormat;
  j["code"] = nlohmann::json::array();
  for (const auto& c : p.code) {
    nlohmann::json cj{{"target", c.target->name()}, {"arch", c.arch}};
    if (keep) cj["source_ref"] = keep(c.source);
    else cj["source"] = c.source;
    j["code"].push_back(std::move(cj));
  }
  j["fusion_text"] = p.fusion_text;
  j["num_groups"] = p.num_groups;
  j["group_ops"] = p.group_ops;
  j["fused_ops"] = p.fused_ops;
  j["aten_ops"] = p.aten_ops;
  std::map<const Node*, int> position;
  for (const Node* n : p.graph->nodes()) position.emplace(n, static_cast<int>(position.size()));
  for (const auto& k : p.kernels) {
    nlohmann::json kj{{"name", k.spec.name},   {"group", k.spec.group}, {"code", k.code},
                      {"sizes", numbers(k.spec.sizes)}, {"numel", number(k.spec.numel)}, {"index32", k.spec.index32},
                      {"args", nlohmann::json::array()}};
    // A class's kernels' arguments as their expressions (arg_exprs); a plan of numbers has their values.
    for (size_t i = 0; i < k.spec.args.size(); ++i)
      kj["args"].push_back(i < k.spec.arg_exprs.size() ? number(k.spec.arg_exprs[i]) : nlohmann::json(k.spec.args[i]));
    // Arguments derived from their expression (a CUDA divider's magic number and shift of a size).
    if (std::any_of(k.spec.arg_of.begin(), k.spec.arg_of.end(), [](ArgOf o) { return o != ArgOf::kValue; }))
      for (ArgOf o : k.spec.arg_of) kj["arg_of"].push_back(static_cast<int>(o));
    if (k.spec.is_reduction()) {
      kj["kept_dims"] = k.spec.kept_dims;
      kj["rows"] = number(k.spec.rows);
      kj["row_len"] = number(k.spec.row_len);
      kj["passes"] = k.spec.passes.size();
      kj["scratch"] = k.spec.scratch.size();
    }
    for (const auto& pc : k.spec.pieces) kj["pieces"].push_back({pc.parent, pc.dim, number(pc.start), number(pc.end)});
    kj["calls"] = {{"element", k.calls.per_element}, {"row", k.calls.per_row}, {"passes", k.calls.pass_loads}};
    for (const auto& b : k.spec.buffers) {
      nlohmann::json bj{{"value", b.value->id()}, {"dtype", static_cast<int>(b.dtype)}, {"out", b.is_output},
                        {"strides", numbers(b.strides)}, {"extent", number(b.extent)}, {"offset", number(b.offset)}};
      if (b.gather >= 0) bj["gather"] = {b.gather, number(b.gather_stride), number(b.gather_rows)};
      if (b.gather_dim >= 0) bj["gather"].push_back(b.gather_dim);
      if (b.piece >= 0) bj["piece"] = b.piece;
      kj["buffers"].push_back(bj);
    }
    j["kernels"].push_back(kj);
  }
  for (const auto& st : p.steps)
    j["steps"].push_back({{"kernel", st.kernel}, {"node", st.node ? position.at(st.node) : -1}, {"release", st.release}});
  for (const SymGuard& g : p.guards.guards())
    j["guards"].push_back({g.expr->str(), static_cast<int>(g.rel), g.phase});
  return j.dump();
}

namespace {

// A kernel's calls (KernelCalls, runtime/plan.h): op classes by short name, each a finite count per
// element or row below any kernel's, and per pass of a reduction the buffers it loads, inputs of the
// kernel. Only the time model reads them; still, what does not fit refuses the plan.
bool read_calls(const nlohmann::json& j, const KernelSpec& k, KernelCalls* c) {
  if (j.is_null()) return true;  // none kept: no op classes, no passes read again
  if (!j.is_object()) return false;
  auto counts = [&](const char* key, std::map<std::string, double>* out) {
    if (!j.contains(key)) return true;
    const nlohmann::json& o = j.at(key);
    if (!o.is_object() || o.size() > 32) return false;
    for (const auto& [name, v] : o.items()) {
      if (name.empty() || name.size() > 32 || !v.is_number()) return false;
      const double n = v.get<double>();
      if (!std::isfinite(n) || n < 0 || n > 1e4) return false;
      (*out)[name] = n;
    }
    return true;
  };
  if (!counts("element", &c->per_element) || !counts("row", &c->per_row)) return false;
  if (j.contains("passes")) {
    const nlohmann::json& passes = j.at("passes");
    if (!passes.is_array() || passes.size() != k.passes.size()) return false;
    for (const auto& loads : passes) {
      if (!loads.is_array()) return false;
      std::vector<int>& out = c->pass_loads.emplace_back();
      for (const auto& b : loads) {
        if (!b.is_number_integer()) return false;
        const int64_t i = b.get<int64_t>();
        if (i < 0 || i >= static_cast<int64_t>(k.buffers.size()) || k.buffers[i].is_output) return false;
        out.push_back(static_cast<int>(i));
      }
    }
  }
  return true;
}

bool read_plan(const nlohmann::json& j, ExecutablePlan* p, const FindSource& find) {
  const SymBindings hints = p->graph->symbols();
  std::vector<Node*> nodes = p->graph->nodes();
  std::map<int, const Value*> values;
  for (const Value* v : p->graph->inputs()) values[v->id()] = v;
  for (const Node* n : nodes)
    for (const Value* v : n->outputs()) values[v->id()] = v;
  for (const auto& cj : j.at("code")) {
    TargetCode c;
    c.target = target_named(cj.at("target").get<std::string>());
    if (!c.target) return false;  // a target this build does not have
    c.arch = cj.at("arch").get<std::string>();
    if (cj.contains("source_ref")) {
      if (!find) return false;
      std::optional<std::string> source = find(cj.at("source_ref").get<std::string>());
      if (!source) return false;
      c.source = std::move(*source);
    } else {
      c.source = cj.at("source").get<std::string>();
    }
    p->code.push_back(std::move(c));
  }
  p->fusion_text = j.at("fusion_text").get<std::string>();
  p->num_groups = j.at("num_groups").get<int>();
  p->group_ops = j.at("group_ops").get<std::vector<int>>();
  p->fused_ops = j.at("fused_ops").get<int>();
  p->aten_ops = j.at("aten_ops").get<std::map<std::string, int>>();
  for (const auto& kj : j.value("kernels", nlohmann::json::array())) {
    KernelLaunch k;
    k.spec.name = kj.at("name").get<std::string>();
    k.spec.group = kj.at("group").get<int>();
    k.code = kj.at("code").get<int>();
    if (k.code < 0 || k.code >= static_cast<int>(p->code.size())) return false;
    TargetCode& c = p->code[k.code];
    k.spec.device = c.target->device();
    k.slot = static_cast<int>(c.kernels.size());
    c.kernels.push_back(static_cast<int>(p->kernels.size()));
    k.spec.sizes = read_numbers(kj.at("sizes"), hints);
    k.spec.numel = read_number(kj.at("numel"), hints);
    k.spec.index32 = kj.at("index32").get<bool>();
    for (const auto& a : kj.at("args")) k.spec.arg_exprs.push_back(read_number(a, hints));
    for (const auto& o : kj.value("arg_of", nlohmann::json::array())) {
      const int of = o.get<int>();
      if (of < 0 || of > static_cast<int>(ArgOf::kDividerShift)) return false;
      k.spec.arg_of.push_back(static_cast<ArgOf>(of));
    }
    if (!k.spec.arg_of.empty() && k.spec.arg_of.size() != k.spec.arg_exprs.size()) return false;
    k.spec.args.resize(k.spec.arg_exprs.size());
    k.spec.args = arg_values(k.spec, hints);  // (an Error where a divider's size is out of range)
    // The kernel reads exactly these: never past the end of its arguments.
    if (k.spec.args.size() != arguments_read(c.source, k.spec.name)) return false;
    if (kj.contains("passes")) {
      k.spec.kept_dims = kj.at("kept_dims").get<int>();
      k.spec.rows = read_number(kj.at("rows"), hints);
      k.spec.row_len = read_number(kj.at("row_len"), hints);
      const size_t passes = kj.at("passes").get<size_t>(), scratch = kj.at("scratch").get<size_t>();
      if (passes == 0 || passes > 64 || scratch > 64) return false;  // more than any kernel has
      k.spec.passes.resize(passes);
      k.spec.scratch.resize(scratch);
    }
    for (const auto& pj : kj.value("pieces", nlohmann::json::array())) {
      // Note [Cats of unequal items]: parents first (check_plan_numbers checks the bounds).
      const int64_t n = static_cast<int64_t>(k.spec.pieces.size());
      if (!pj.is_array() || pj.size() != 4 || n >= 256 || k.spec.is_reduction()) return false;
      const auto parent = pj.at(0).get<int64_t>(), dim = pj.at(1).get<int64_t>();
      if (parent < -1 || parent >= n || dim < 0 || dim >= static_cast<int64_t>(k.spec.sizes.size())) return false;
      KernelPiece& pc = k.spec.pieces.emplace_back();
      pc.parent = static_cast<int>(parent);
      pc.dim = static_cast<int>(dim);
      pc.start = read_number(pj.at(2), hints);
      pc.end = read_number(pj.at(3), hints);
    }
    for (const auto& bj : kj.at("buffers")) {
      auto it = values.find(bj.at("value").get<int>());
      if (it == values.end() || !it->second->is_tensor()) return false;
      KernelBuffer b;
      b.value = it->second;
      b.dtype = static_cast<DType>(bj.at("dtype").get<int>());
      b.is_output = bj.at("out").get<bool>();
      b.strides = read_numbers(bj.at("strides"), hints);
      b.extent = read_number(bj.at("extent"), hints);
      b.offset = bj.contains("offset") ? read_number(bj.at("offset"), hints) : SymInt(0);
      b.piece = bj.value("piece", -1);
      if (b.piece != -1 && (b.piece < 0 || b.piece >= static_cast<int>(k.spec.pieces.size()) || b.is_output)) return false;
      if (b.dtype != b.value->tensor_type().dtype || !b.extent.same(b.value->tensor_type().sym_extent())) return false;
      if (b.strides.size() != k.spec.sizes.size()) return false;
      if (bj.contains("gather")) {
        // Note [Gathered loads]: an earlier input of integer indices picks rows of this input's 2-d
        // table (embedding), or its elements along dim g[3] (gather); the rows and their stride are the
        // table's own.
        const auto& g = bj.at("gather");
        if (!g.is_array() || g.size() < 3 || g.size() > 4 || b.is_output) return false;
        const int64_t index_buffer = g.at(0).get<int64_t>();
        if (index_buffer < 0 || index_buffer >= static_cast<int64_t>(k.spec.buffers.size())) return false;
        const KernelBuffer& index = k.spec.buffers[index_buffer];
        const TensorType& table = b.value->tensor_type();
        const int64_t dim = g.size() == 4 ? g.at(3).get<int64_t>() : 0;
        if (index.is_output || index.piece != b.piece || (index.dtype != DType::kInt64 && index.dtype != DType::kInt32) ||
            (g.size() == 3 && table.dim() != 2) || dim < 0 || dim >= table.dim())
          return false;
        b.gather = static_cast<int>(index_buffer);
        b.gather_stride = read_number(g.at(1), hints);
        b.gather_rows = read_number(g.at(2), hints);
        b.gather_dim = g.size() == 4 ? dim : -1;
        if (!b.gather_stride.same(table.strides[dim]) || !b.gather_rows.same(table.sizes[dim])) return false;
      }
      // A slice (offset) of an output follows that output's first buffer in the same kernel.
      if (!b.offset.same(SymInt(0))) {
        bool first = false;
        for (const auto& e : k.spec.buffers) first |= e.value == b.value && e.is_output && b.is_output && e.offset.same(SymInt(0));
        if (!first) return false;
      }
      k.spec.buffers.push_back(std::move(b));
    }
    if (!read_calls(kj.value("calls", nlohmann::json()), k.spec, &k.calls)) return false;
    p->kernels.push_back(std::move(k));
  }
  for (const auto& sj : j.value("steps", nlohmann::json::array())) {
    ExecStep st;
    st.kernel = sj.at("kernel").get<int>();
    int node = sj.at("node").get<int>();
    if (node >= static_cast<int>(nodes.size()) || st.kernel >= static_cast<int>(p->kernels.size())) return false;
    st.node = node >= 0 ? nodes[node] : nullptr;
    st.release = sj.at("release").get<std::vector<int>>();
    p->steps.push_back(std::move(st));
  }
  for (const auto& gj : j.value("guards", nlohmann::json::array())) {
    if (hints.empty() || !gj.is_array() || gj.size() != 3) return false;
    const int rel = gj.at(1).get<int>();
    if (rel < 0 || rel > static_cast<int>(SymRel::kGe)) return false;
    const SymInt e = read_number(gj.at(0), hints);
    if (!e.is_symbolic()) return false;
    p->guards.set_phase(gj.at(2).get<std::string>());
    p->guards.add(SymGuard{e.expr(), static_cast<SymRel>(rel), ""});
  }
  // A class's plan read where its guards fail at this graph's hints is not this graph's plan.
  return p->guards.holds(hints) && check_plan_numbers(*p).empty();
}

}  // namespace

// Fills `p` (whose graph is set) from serialize_plan's text; false when it does not fit the graph or a
// field is missing or of another type (nlohmann's exceptions stop here).
bool deserialize_plan(const std::string& text, ExecutablePlan* p, const FindSource& find) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", 0) != kPlanFormat) return false;
  try {
    if (read_plan(j, p, find)) return true;
  } catch (const nlohmann::json::exception&) {
  } catch (const Error&) {  // an expression that does not parse, or names a symbol the graph lacks
  }
  p->code.clear();
  p->kernels.clear();
  p->steps.clear();
  p->guards = ShapeGuards();
  return false;
}

}  // namespace fusion_jit
