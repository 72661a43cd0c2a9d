#include "ir/graph.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {

SymInt TensorType::sym_numel() const {
  SymInt n = 1;
  for (const SymInt& s : sizes) n *= s;
  return n;
}

bool TensorType::is_contiguous() const {
  SymInt expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

SymInt TensorType::sym_extent() const {
  SymInt hi = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    hi += (sizes[d] - 1) * sym_abs(strides[d]);
  }
  return hi + 1;
}

SymSizes channels_last_strides(const SymSizes& sz) {
  return {sz[1] * sz[2] * sz[3], 1, sz[3] * sz[1], sz[1]};
}

bool contiguous_in_some_format(const TensorType& t) {
  // Dims from the fastest-varying: the innermost first, or the channel dim (1) first.
  auto dense = [&](const std::vector<int64_t>& order) {
    SymInt expected = 1;
    for (int64_t d : order) {
      if (t.sizes[d] == 1) continue;
      if (t.strides[d] != expected) return false;
      expected *= t.sizes[d];
    }
    return true;
  };
  if (t.is_contiguous()) return true;
  if (t.dim() == 4) return dense({1, 3, 2, 0});
  if (t.dim() == 5) return dense({1, 4, 3, 2, 0});
  return false;
}

bool broadcasts_to(const SymSizes& from, const SymSizes& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const SymInt& f = from[from.size() - 1 - i];
    const SymInt& t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

bool same_strides(const TensorType& t, const SymSizes& strides) {
  for (size_t d = 0; d < t.sizes.size(); ++d)
    if (t.sizes[d] != 1 && t.strides[d] != strides[d]) return false;
  return true;
}

SymSizes contiguous_strides(const SymSizes& sizes) {
  SymSizes st(sizes.size());
  SymInt acc = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= sym_max(sizes[d], 1);
  }
  return st;
}

namespace {
std::string shape_str(const SymSizes& s) { return "[" + s.str() + "]"; }
}  // namespace

SymSizes broadcast_shapes(const SymSizes& a, const SymSizes& b) {
  SymSizes out(std::max(a.size(), b.size()), SymInt(1));
  for (size_t i = 0; i < out.size(); ++i) {
    const SymInt x = i < a.size() ? a[a.size() - 1 - i] : SymInt(1);
    const SymInt y = i < b.size() ? b[b.size() - 1 - i] : SymInt(1);
    SymInt& o = out[out.size() - 1 - i];
    if (x == 1) o = y;
    else if (y == 1 || x.same(y)) o = x;
    else {
      FJ_CHECK(x == y, "shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
      o = x;
    }
  }
  return out;
}

SymSizes reduced_shape(const SymSizes& sizes, const std::vector<int64_t>& dims, bool keepdim) {
  for (int64_t d : dims)
    FJ_CHECK(d >= 0 && d < static_cast<int64_t>(sizes.size()), "reducing dim {} of shape {}", d, shape_str(sizes));
  SymSizes out;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out.push_back(sizes[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

SymSizes view_shape(const SymSizes& from, const SymSizes& to) {
  SymInt numel = 1, known = 1;
  for (const SymInt& s : from) numel *= s;
  int infer = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (!to[i].is_symbolic() && to[i].hint() == -1) {
      FJ_CHECK(infer < 0, "a view to {} infers more than one dim", shape_str(to));
      infer = static_cast<int>(i);
    } else {
      FJ_CHECK(to[i].hint() >= 0, "a view to {} has a negative size", shape_str(to));
      known *= to[i];
    }
  }
  SymSizes out = to;
  if (infer >= 0) {
    FJ_CHECK(known.hint() != 0, "a view of {} to {}: the -1 cannot be inferred next to a 0", shape_str(from),
             shape_str(to));
    out[static_cast<size_t>(infer)] = floor_div(numel, known);
    known *= out[static_cast<size_t>(infer)];
  }
  FJ_CHECK(numel.same(known) || numel == known, "a view of {} ({} elements) to {}: the element counts differ",
           shape_str(from), numel.str(), shape_str(to));
  return out;
}

SymSizes cat_shape(const std::vector<SymSizes>& items, int64_t dim) {
  FJ_CHECK(!items.empty(), "cat of no tensors");
  SymSizes out = items[0];
  FJ_CHECK(dim >= 0 && dim < static_cast<int64_t>(out.size()), "cat along dim {} of {}", dim, shape_str(out));
  for (size_t k = 1; k < items.size(); ++k) {
    const SymSizes& it = items[k];
    FJ_CHECK(it.size() == out.size(), "cat of {} and {}: ranks differ", shape_str(items[0]), shape_str(it));
    for (size_t d = 0; d < out.size(); ++d) {
      if (static_cast<int64_t>(d) == dim) out[d] += it[d];
      else
        FJ_CHECK(it[d].same(out[d]) || it[d] == out[d], "cat along dim {} of {} and {}: dim {} differs", dim,
                 shape_str(items[0]), shape_str(it), d);
    }
  }
  return out;
}

std::string TensorType::str() const {
  std::string s = std::string(dtype_name(dtype)) + "[" + sizes.str() + "]";
  if (!strides.same(contiguous_strides(sizes))) s += "{" + strides.str() + "}";
  if (device == Device::kCUDA) s += "@cuda:" + std::to_string(device_index);
  return s;
}

std::string literal_str(const Literal& l) {
  struct V {
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(const SymInt& i) const { return i.str(); }
    std::string operator()(double d) const {
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      // Shortest text that reads back to the same double, always with a '.' or exponent.
      std::string s = fmt::format("{}", d);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& s) const { return "\"" + s + "\""; }
    std::string operator()(const SymSizes& v) const { return "[" + v.str() + "]"; }
    std::string operator()(const std::vector<double>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + (*this)(v[i]);
      return s + "]";
    }
  };
  return std::visit(V{}, l);
}

const TensorType& Value::tensor_type() const {
  FJ_INTERNAL_ASSERT(type_.tensor.has_value(), "{} is not a tensor", name());
  return *type_.tensor;
}

std::vector<Value*> Node::value_inputs() const {
  std::vector<Value*> out;
  for (const auto& a : args_)
    if (a.is_value()) out.push_back(a.value);
  return out;
}

int64_t Node::constant_index() const {
  FJ_INTERNAL_ASSERT(is_constant() && args_.size() == 1 && std::holds_alternative<SymInt>(args_[0].literal));
  return std::get<SymInt>(args_[0].literal);
}

Value* Graph::new_value(ValueType type, Node* producer) {
  auto v = std::make_unique<Value>();
  v->id_ = next_id_++;
  v->type_ = std::move(type);
  v->producer_ = producer;
  values_.push_back(std::move(v));
  return values_.back().get();
}

Value* Graph::add_input(ValueType type) {
  Value* v = new_value(std::move(type), nullptr);
  inputs_.push_back(v);
  return v;
}

Node* Graph::append(const std::string& schema, std::vector<Arg> args, std::vector<ValueType> output_types) {
  return insert(nullptr, schema, std::move(args), std::move(output_types));
}

Node* Graph::insert(Node* before, const std::string& schema, std::vector<Arg> args,
                    std::vector<ValueType> output_types) {
  auto n = std::make_unique<Node>();
  n->schema_ = schema;
  n->op_ = find_op(schema);
  n->args_ = std::move(args);
  for (auto& t : output_types) n->outputs_.push_back(new_value(std::move(t), n.get()));
  Node* raw = n.get();
  auto pos = nodes_.end();
  if (before) {
    pos = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.get() == before; });
    FJ_INTERNAL_ASSERT(pos != nodes_.end());
  }
  nodes_.insert(pos, std::move(n));
  return raw;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

void Graph::replace_all_uses(Value* from, Value* to) {
  for (auto& n : nodes_)
    for (auto& a : n->args_)
      if (a.value == from) a.value = to;
  for (auto& o : outputs_)
    if (o == from) o = to;
}

std::vector<std::vector<Node*>> Graph::users() const {
  std::vector<std::vector<Node*>> u(next_id_);
  for (const auto& n : nodes_) {
    for (const auto& a : n->args_) {
      if (!a.is_value()) continue;
      auto& list = u[a.value->id()];
      if (list.empty() || list.back() != n.get()) list.push_back(n.get());
    }
  }
  return u;
}

std::vector<Node*> Graph::users_of(const Value* v) const {
  std::vector<Node*> u;
  for (const auto& n : nodes_)
    for (const auto& a : n->args_)
      if (a.value == v) {
        u.push_back(n.get());
        break;
      }
  return u;
}

void Graph::erase(Node* n) {
  auto pos = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.get() == n; });
  FJ_INTERNAL_ASSERT(pos != nodes_.end());
  nodes_.erase(pos);
}

void Graph::make_constant(Node* n, int64_t index) {
  FJ_INTERNAL_ASSERT(n->outputs_.size() == 1);
  n->schema_ = "fj::constant";
  n->op_ = find_op(n->schema_);
  n->args_ = {Arg::lit(index)};
  n->side_effects_ = false;
}

void Graph::renumber() {
  int id = 0;
  for (auto* v : inputs_) v->id_ = id++;
  for (auto& n : nodes_)
    for (auto* v : n->outputs_) v->id_ = id++;
  // Values no longer defined (erased nodes) keep ids beyond the live ones.
  std::vector<std::unique_ptr<Value>> live, dead;
  for (auto& v : values_) {
    bool defined = v->producer_ == nullptr
                       ? std::find(inputs_.begin(), inputs_.end(), v.get()) != inputs_.end()
                       : std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == v->producer_; });
    (defined ? live : dead).push_back(std::move(v));
  }
  values_.clear();
  for (auto& v : live) values_.push_back(std::move(v));
  // Dead values are unreachable; drop them.
  next_id_ = id;
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  std::unordered_map<const Value*, Value*> map;
  for (auto* v : inputs_) map[v] = g->add_input(v->type());
  for (const auto& n : nodes_) {
    std::vector<Arg> args;
    for (const auto& a : n->args_) args.push_back(a.is_value() ? Arg::of(map.at(a.value)) : Arg::lit(a.literal));
    std::vector<ValueType> types;
    for (auto* o : n->outputs_) types.push_back(o->type());
    Node* c = g->append(n->schema_, std::move(args), std::move(types));
    c->side_effects_ = n->side_effects_;
    for (size_t i = 0; i < n->outputs_.size(); ++i) map[n->outputs_[i]] = c->outputs_[i];
  }
  for (auto* o : outputs_) g->add_output(map.at(o));
  g->notes_ = notes_;
  g->symbols_ = symbols_;
  return g;
}

std::unique_ptr<Graph> concretize(const Graph& g, const SymBindings& b) {
  auto out = g.clone();
  out->clear_symbols();
  auto fix = [&](Value* v) {
    if (!v->is_tensor() || !v->tensor_type().is_symbolic()) return;
    TensorType& t = *v->mutable_type().tensor;
    for (SymInt& s : t.sizes) {
      s = SymInt(s.evaluate(b));
      FJ_CHECK(s.hint() >= 0, "{} has a negative size at {}", v->name(), t.str());
    }
    for (SymInt& s : t.strides) s = SymInt(s.evaluate(b));
  };
  for (Value* v : out->inputs()) fix(v);
  for (Node* n : out->nodes()) {
    for (Value* v : n->outputs()) fix(v);
    for (Arg& a : n->mutable_args()) {
      if (a.is_value()) continue;
      if (auto* i = std::get_if<SymInt>(&a.literal); i && i->is_symbolic()) a.literal = SymInt(i->evaluate(b));
      if (auto* l = std::get_if<SymSizes>(&a.literal); l && l->is_symbolic())
        for (SymInt& x : *l) x = SymInt(x.evaluate(b));
    }
  }
  return out;
}

void set_device(Graph& g, Device device, int index) {
  auto move = [&](Value* v) {
    if (!v->is_tensor()) return;
    v->mutable_type().tensor->device = device;
    v->mutable_type().tensor->device_index = device == Device::kCPU ? 0 : index;
  };
  for (Value* v : g.inputs()) move(v);
  for (Node* n : g.nodes())
    for (Value* v : n->outputs()) move(v);
}

}  // namespace fusion_jit
