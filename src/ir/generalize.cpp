// Shape classes from typed graphs (Note [Graphs of two sizes]): generalize() makes the graph of a class
// from two captures of one program at two sizes, is_instance() says whether a capture is the class's graph
// at some binding of its symbols, and structure_hash() groups captures that may be.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ir/sym.h"

namespace fusion_jit {

namespace {

// A candidate expression and its values at the two sizes.
struct Candidate {
  SymInt e;
  int64_t a = 0, b = 0;
};

// The simplest expression over `monos` (symbols first, then products of two and three) worth `va` at
// the first size and `vb` at the second.
std::optional<SymInt> fit(const std::vector<Candidate>& monos, size_t linear_and_square, int64_t va, int64_t vb) {
  for (const Candidate& m : monos)
    if (m.a == va && m.b == vb) return m.e;
  for (const Candidate& m : monos)  // a multiple
    if (va % m.a == 0 && vb % m.b == 0 && va / m.a == vb / m.b) return SymInt(va / m.a) * m.e;
  for (size_t i = 0; i < linear_and_square; ++i)  // a sum of two (a cat's length, its strides)
    for (size_t j = i; j < linear_and_square; ++j)
      if (monos[i].a + monos[j].a == va && monos[i].b + monos[j].b == vb) return monos[i].e + monos[j].e;
  for (size_t i = 0; i < linear_and_square; ++i) {  // c * m + d (a slice's length)
    const Candidate& m = monos[i];
    if ((vb - va) % (m.b - m.a) != 0) continue;
    const int64_t c = (vb - va) / (m.b - m.a);
    if (c != 0) return SymInt(c) * m.e + SymInt(va - c * m.a);
  }
  return std::nullopt;
}

// What the walk compares an integer of the first graph with one of the second at the same place: "" where
// they agree (the callback may rewrite the first's), else why not.
using OnInt = std::function<std::string(SymInt& a, const SymInt& b)>;

// Walks graphs `a` and `b` in lockstep, and gives each integer of `a` (an input's or a node result's size or
// stride, an integer literal, an item of an integer list) with `b`'s at the same place to `on_int`. Strides
// that `contiguous(a, b)` accepts are not compared; `a`'s become the contiguous strides of its sizes. "" where
// the graphs are one program (the same ops, arguments, dtypes, devices, other literals and outputs) and
// on_int agrees everywhere; else the first place they differ. `a`'s integers are rewritten only through
// on_int (generalize() walks its own copy).
class Walk {
 public:
  using Contiguous = std::function<bool(const TensorType& a, const TensorType& b)>;
  Walk(OnInt on_int, Contiguous contiguous) : on_int_(std::move(on_int)), contiguous_(std::move(contiguous)) {}

  std::string run(const Graph& a, const Graph& b) {
    if (a.inputs().size() != b.inputs().size())
      return fmt::format("{} inputs and {}", a.inputs().size(), b.inputs().size());
    for (size_t i = 0; i < a.inputs().size(); ++i) {
      std::string why = value(a.inputs()[i], b.inputs()[i]);
      if (!why.empty()) return fmt::format("input {}: {}", i, why);
    }
    const std::vector<Node*> na = a.nodes(), nb = b.nodes();
    if (na.size() != nb.size()) return fmt::format("{} nodes and {}", na.size(), nb.size());
    for (size_t k = 0; k < na.size(); ++k) {
      std::string why = node(*na[k], *nb[k]);
      if (!why.empty()) return fmt::format("node {} ({}): {}", k, na[k]->schema(), why);
    }
    if (a.outputs().size() != b.outputs().size())
      return fmt::format("{} outputs and {}", a.outputs().size(), b.outputs().size());
    for (size_t i = 0; i < a.outputs().size(); ++i)
      if (!same_value(a.outputs()[i], b.outputs()[i])) return fmt::format("output {} is another value", i);
    return "";
  }

 private:
  bool same_value(const Value* a, const Value* b) const {
    auto it = values_.find(a);
    return it != values_.end() && it->second == b;
  }

  std::string value(Value* a, const Value* b) {
    values_[a] = b;
    const ValueType &ta = a->type(), &tb = b->type();
    if (ta.is_tensor() != tb.is_tensor() || (!ta.is_tensor() && ta.other != tb.other))
      return fmt::format("a {} and a {}", ta.str(), tb.str());
    if (!ta.is_tensor()) return "";
    TensorType& x = *a->mutable_type().tensor;
    const TensorType& y = *tb.tensor;
    if (x.dtype != y.dtype || x.device != y.device || x.device_index != y.device_index || x.dim() != y.dim())
      return fmt::format("{} and {}", x.str(), y.str());
    const bool contiguous = contiguous_(x, y);
    for (size_t d = 0; d < x.sizes.size(); ++d) {
      std::string why = on_int_(x.sizes[d], y.sizes[d]);
      if (!why.empty()) return fmt::format("size {}: {}", d, why);
    }
    if (contiguous) {
      SymSizes strides = contiguous_strides(x.sizes);
      if (!x.strides.same(strides)) x.strides = std::move(strides);  // a class's graph is not written
      return "";
    }
    for (size_t d = 0; d < x.strides.size(); ++d) {
      std::string why = on_int_(x.strides[d], y.strides[d]);
      if (!why.empty()) return fmt::format("stride {}: {}", d, why);
    }
    return "";
  }

  std::string literal(Literal& a, const Literal& b, bool numbers_may_differ) {
    if (a.index() != b.index()) return fmt::format("{} and {}", literal_str(a), literal_str(b));
    if (auto* i = std::get_if<SymInt>(&a)) {
      if (numbers_may_differ) return on_int_(*i, std::get<SymInt>(b));
      return !i->is_symbolic() && i->hint() == std::get<SymInt>(b).hint() ? "" : fmt::format("{} and {}", i->str(), std::get<SymInt>(b).str());
    }
    if (auto* list = std::get_if<SymSizes>(&a)) {
      const SymSizes& other = std::get<SymSizes>(b);
      if (list->size() != other.size()) return fmt::format("[{}] and [{}]", list->str(), other.str());
      for (size_t k = 0; k < list->size(); ++k) {
        std::string why = on_int_((*list)[k], other[k]);
        if (!why.empty()) return fmt::format("item {}: {}", k, why);
      }
      return "";
    }
    if (auto* d = std::get_if<double>(&a)) {  // the same number, bit for bit (NaN is NaN)
      const double e = std::get<double>(b);
      return std::memcmp(d, &e, sizeof e) == 0 ? "" : fmt::format("{} and {}", *d, e);
    }
    if (auto* v = std::get_if<std::vector<double>>(&a)) {
      const auto& w = std::get<std::vector<double>>(b);
      const bool same = v->size() == w.size() && (v->empty() || std::memcmp(v->data(), w.data(), v->size() * sizeof(double)) == 0);
      return same ? "" : fmt::format("{} and {}", literal_str(a), literal_str(b));
    }
    return literal_str(a) == literal_str(b) ? "" : fmt::format("{} and {}", literal_str(a), literal_str(b));
  }

  std::string node(Node& a, const Node& b) {
    if (a.schema() != b.schema()) return fmt::format("and {}", b.schema());
    if (a.side_effects() != b.side_effects()) return "side effects differ";
    if (a.args().size() != b.args().size()) return fmt::format("{} arguments and {}", a.args().size(), b.args().size());
    if (a.outputs().size() != b.outputs().size()) return fmt::format("{} results and {}", a.outputs().size(), b.outputs().size());
    for (size_t i = 0; i < a.args().size(); ++i) {
      Arg& x = a.mutable_args()[i];
      const Arg& y = b.args()[i];
      if (x.is_value() != y.is_value()) return fmt::format("argument {}: a value and a literal", i);
      std::string why;
      if (x.is_value()) why = same_value(x.value, y.value) ? "" : "another value";
      else why = literal(x.literal, y.literal, !a.is_constant());  // a constant's index is no size
      if (!why.empty()) return fmt::format("argument {}: {}", i, why);
    }
    for (size_t i = 0; i < a.outputs().size(); ++i) {
      std::string why = value(a.outputs()[i], b.outputs()[i]);
      if (!why.empty()) return fmt::format("result {}: {}", i, why);
    }
    return "";
  }

  OnInt on_int_;
  Contiguous contiguous_;
  std::unordered_map<const Value*, const Value*> values_;  // a's values to b's
};

// Whether a concrete type has exactly the contiguous strides of its sizes (size-1 dims' too: eager's results
// keep those as the layout gives them, and outputs are compared with their strides).
bool concrete_contiguous(const TensorType& t) {
  return !t.is_symbolic() && t.strides.hints() == contiguous_strides(t.sizes).hints();
}

}  // namespace

std::unique_ptr<Graph> generalize(const Graph& first, const Graph& second, const std::map<int64_t, int64_t>& extents,
                                  std::string* why) {
  if (!first.symbols().empty() || !second.symbols().empty()) {
    *why = "a graph already has symbolic sizes";
    return nullptr;
  }
  std::vector<Candidate> monos;
  std::vector<std::string> names;
  for (const auto& [e, to] : extents) {
    if (e < 2 || to < 2 || e == to) continue;
    names.push_back(fmt::format("s{}", names.size()));
    monos.push_back({SymInt::symbol(names.back(), e), e, to});
  }
  const size_t n = monos.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i; j < n; ++j) monos.push_back({monos[i].e * monos[j].e, monos[i].a * monos[j].a, monos[i].b * monos[j].b});
  const size_t linear_and_square = monos.size();
  for (size_t i = 0; i < n && n <= 32; ++i)
    for (size_t j = i; j < n; ++j)
      for (size_t k = j; k < n; ++k)
        monos.push_back({monos[i].e * monos[j].e * monos[k].e, monos[i].a * monos[j].a * monos[k].a,
                         monos[i].b * monos[j].b * monos[k].b});
  std::map<std::pair<int64_t, int64_t>, SymInt> fitted;
  std::set<std::string> used;
  auto on_int = [&](SymInt& a, const SymInt& b) -> std::string {
    const int64_t va = a.hint(), vb = b.hint();
    if (va == vb) return "";
    if (va < 0 || vb < 0) return fmt::format("a number that is not a size differs: {} and {}", va, vb);
    auto it = fitted.find({va, vb});
    if (it == fitted.end()) {
      std::optional<SymInt> e = fit(monos, linear_and_square, va, vb);
      if (!e || !e->is_symbolic())
        return fmt::format("{} at the first size and {} at the second fit no expression over the extents", va, vb);
      for (const std::string& name : e->expr()->symbols()) used.insert(name);
      it = fitted.emplace(std::make_pair(va, vb), *e).first;
    }
    a = it->second;
    return "";
  };
  auto out = first.clone();
  *why = Walk(on_int, [](const TensorType& a, const TensorType& b) {
           return concrete_contiguous(a) && concrete_contiguous(b);
         }).run(*out, second);
  if (!why->empty()) {
    *why = "the graphs differ beyond their sizes: " + *why;
    return nullptr;
  }
  if (used.empty()) {
    *why = "no size differs between the two graphs";
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i)
    if (used.count(names[i])) out->set_symbol(names[i], monos[i].a);
  return out;
}

bool is_instance(const Graph& cls, const SymBindings& at, const Graph& g, std::string* why) {
  std::string ignored;
  if (!why) why = &ignored;
  if (!g.symbols().empty()) {
    *why = "the capture has symbolic sizes";
    return false;
  }
  auto on_int = [&](SymInt& a, const SymInt& b) -> std::string {
    const int64_t va = a.evaluate(at);
    return va == b.hint() ? "" : fmt::format("{} is {} there, not {}", a.str(), va, b.hint());
  };
  // The class's contiguous strides are those of its sizes (generalize() made them so).
  auto contiguous = [](const TensorType& a, const TensorType& b) {
    return a.strides.same(contiguous_strides(a.sizes)) && concrete_contiguous(b);
  };
  // The walk writes nothing here: on_int does not, and the class's contiguous strides are already its sizes'.
  *why = Walk(on_int, contiguous).run(cls, g);
  return why->empty();
}

bool same_program(const Graph& a, const Graph& b) {
  auto any_int = [](SymInt&, const SymInt&) { return std::string(); };
  return Walk(any_int, [](const TensorType&, const TensorType&) { return false; }).run(a, b).empty();
}

size_t structure_hash(const Graph& g) {
  size_t h = 0;
  auto mix = [&](size_t x) { h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  std::unordered_map<const Value*, size_t> ids;
  auto value = [&](const Value* v) {
    ids.emplace(v, ids.size());
    const ValueType& t = v->type();
    if (!t.is_tensor()) return mix(std::hash<std::string>()(t.other));
    const TensorType& tt = *t.tensor;
    mix(static_cast<size_t>(tt.dtype) * 131 + static_cast<size_t>(tt.device) * 17 + tt.device_index);
    mix(tt.sizes.size());
  };
  for (const Value* v : g.inputs()) value(v);
  for (const Node* n : g.nodes()) {
    mix(std::hash<std::string>()(n->schema()));
    for (const Arg& a : n->args()) {
      if (a.is_value()) {
        auto it = ids.find(a.value);
        mix(it == ids.end() ? ~size_t{0} : it->second);
      } else {
        mix(1000 + a.literal.index());  // numbers and lists of them may differ within a class
        if (!std::holds_alternative<SymInt>(a.literal) && !std::holds_alternative<SymSizes>(a.literal))
          mix(std::hash<std::string>()(literal_str(a.literal)));
      }
    }
    for (const Value* o : n->outputs()) value(o);
  }
  for (const Value* o : g.outputs()) mix(ids.count(o) ? ids.at(o) : ~size_t{0});
  return h;
}

}  // namespace fusion_jit
