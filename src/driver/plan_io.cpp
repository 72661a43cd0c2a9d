#include "driver/plan_io.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "targets/targets.h"

namespace fusion_jit {
namespace {

// A plan on disk holds numbers: a symbolic one is read as a number here (Note [Symbolic sizes]).
int64_t number(const SymInt& v) { return static_cast<int64_t>(v); }
std::vector<int64_t> numbers(const SymSizes& v) { return static_cast<std::vector<int64_t>>(v); }

// The layout's version, written into every plan: a change of layout changes it, and a plan of another
// format is never read (the plan cache counts it as a miss).
// 3: kernels keep their shape, not their code (the source holds it). 4: sources per target. 5: pieces
// (Note [Cats of unequal items]). 6: kernels' size arguments (Note [Sizes as kernel arguments]); a source
// may be a `source_ref` instead (the plan cache's, which a reader without one refuses as it refuses any
// field missing).
constexpr int kPlanFormat = 6;

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
                      {"args", k.spec.args}};
    if (k.spec.is_reduction()) {
      kj["kept_dims"] = k.spec.kept_dims;
      kj["rows"] = number(k.spec.rows);
      kj["row_len"] = number(k.spec.row_len);
      kj["passes"] = k.spec.passes.size();
      kj["scratch"] = k.spec.scratch.size();
    }
    for (const auto& pc : k.spec.pieces) kj["pieces"].push_back({pc.parent, pc.dim, number(pc.start), number(pc.end)});
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
  return j.dump();
}

namespace {

bool read_plan(const nlohmann::json& j, ExecutablePlan* p, const FindSource& find) {
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
    k.spec.sizes = kj.at("sizes").get<std::vector<int64_t>>();
    k.spec.numel = kj.at("numel").get<int64_t>();
    k.spec.index32 = kj.at("index32").get<bool>();
    k.spec.args = kj.at("args").get<std::vector<int64_t>>();
    k.spec.arg_exprs.assign(k.spec.args.begin(), k.spec.args.end());
    // The kernel reads exactly these: never past the end of its arguments.
    if (k.spec.args.size() != arguments_read(c.source, k.spec.name)) return false;
    if (kj.contains("passes")) {
      k.spec.kept_dims = kj.at("kept_dims").get<int>();
      k.spec.rows = kj.at("rows").get<int64_t>();
      k.spec.row_len = kj.at("row_len").get<int64_t>();
      const size_t passes = kj.at("passes").get<size_t>(), scratch = kj.at("scratch").get<size_t>();
      if (passes == 0 || passes > 64 || scratch > 64) return false;  // more than any kernel has
      k.spec.passes.resize(passes);
      k.spec.scratch.resize(scratch);
    }
    for (const auto& pj : kj.value("pieces", nlohmann::json::array())) {
      // Note [Cats of unequal items]: parents first; a piece lies inside the iteration space (and inside
      // its parent where it splits the same dim).
      const auto v = pj.get<std::vector<int64_t>>();
      const int64_t n = static_cast<int64_t>(k.spec.pieces.size());
      if (v.size() != 4 || n >= 256 || k.spec.is_reduction() || v[0] < -1 || v[0] >= n || v[1] < 0 ||
          v[1] >= static_cast<int64_t>(k.spec.sizes.size()) || v[2] < 0 || v[2] >= v[3] || v[3] > k.spec.sizes[v[1]])
        return false;
      for (int64_t q = v[0]; q >= 0; q = k.spec.pieces[q].parent) {
        const KernelPiece& up = k.spec.pieces[q];
        if (up.dim == v[1] && (v[2] < up.start || v[3] > up.end)) return false;
      }
      KernelPiece& pc = k.spec.pieces.emplace_back();
      pc.parent = static_cast<int>(v[0]);
      pc.dim = static_cast<int>(v[1]);
      pc.start = v[2];
      pc.end = v[3];
    }
    for (const auto& bj : kj.at("buffers")) {
      auto it = values.find(bj.at("value").get<int>());
      if (it == values.end() || !it->second->is_tensor()) return false;
      KernelBuffer b;
      b.value = it->second;
      b.dtype = static_cast<DType>(bj.at("dtype").get<int>());
      b.is_output = bj.at("out").get<bool>();
      b.strides = bj.at("strides").get<std::vector<int64_t>>();
      b.extent = bj.at("extent").get<int64_t>();
      b.offset = bj.value("offset", int64_t{0});
      b.piece = bj.value("piece", -1);
      if (b.piece != -1 && (b.piece < 0 || b.piece >= static_cast<int>(k.spec.pieces.size()) || b.is_output)) return false;
      if (b.dtype != b.value->tensor_type().dtype || b.extent != b.value->tensor_type().extent()) return false;
      if (b.strides.size() != k.spec.sizes.size()) return false;
      // Every element the kernel reaches lies inside the tensor; a slice (offset) of an output follows
      // that output's first buffer in the same kernel.
      constexpr int64_t kLimit = int64_t{1} << 48;  // no tensor has that many elements
      if (b.offset < 0 || b.offset >= kLimit) return false;
      bool empty = false;
      double reach = static_cast<double>(b.offset);
      for (size_t d = 0; d < b.strides.size(); ++d) {
        if (k.spec.sizes[d] < 0 || k.spec.sizes[d] >= kLimit || b.strides[d] < 0 || b.strides[d] >= kLimit) return false;
        // A piece's buffer is read over the deepest of its pieces that splits the dim, from its start.
        int64_t n = k.spec.sizes[d];
        if (b.piece >= 0)
          for (int q : k.spec.piece_path(b.piece))
            if (k.spec.pieces[q].dim == static_cast<int>(d)) n = k.spec.pieces[q].end - k.spec.pieces[q].start;
        empty |= n == 0;
        reach += static_cast<double>(n - 1) * static_cast<double>(b.strides[d]);
      }
      if (bj.contains("gather")) {
        // Note [Gathered loads]: an earlier input of integer indices picks rows of this input's 2-d
        // table (embedding), or its elements along dim g[3] (gather); the rows and their stride are the
        // table's own.
        const auto g = bj.at("gather").get<std::vector<int64_t>>();
        if (g.size() < 3 || g.size() > 4 || b.is_output || g[0] < 0 || g[0] >= static_cast<int64_t>(k.spec.buffers.size()))
          return false;
        const KernelBuffer& index = k.spec.buffers[g[0]];
        const TensorType& table = b.value->tensor_type();
        const int64_t dim = g.size() == 4 ? g[3] : 0;
        if (index.is_output || index.piece != b.piece || (index.dtype != DType::kInt64 && index.dtype != DType::kInt32) ||
            (g.size() == 3 && table.dim() != 2) || dim < 0 || dim >= table.dim() || g[1] != table.strides[dim] ||
            g[2] != table.sizes[dim] || g[1] < 0)
          return false;
        b.gather = static_cast<int>(g[0]);
        b.gather_stride = g[1];
        b.gather_rows = g[2];
        b.gather_dim = g.size() == 4 ? dim : -1;
        reach += static_cast<double>(std::max<int64_t>(b.gather_rows - 1, 0)) * static_cast<double>(b.gather_stride);
      }
      if (!empty && reach >= static_cast<double>(b.extent)) return false;
      if (b.offset > 0) {
        bool first = false;
        for (const auto& e : k.spec.buffers) first |= e.value == b.value && e.is_output && b.is_output && e.offset == 0;
        if (!first) return false;
      }
      k.spec.buffers.push_back(std::move(b));
    }
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
  return true;
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
  }
  p->code.clear();
  p->kernels.clear();
  p->steps.clear();
  return false;
}

}  // namespace fusion_jit
