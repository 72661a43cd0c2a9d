#include "ir/graph.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

bool TensorType::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

int64_t TensorType::extent() const {
  int64_t hi = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    hi += (sizes[d] - 1) * std::abs(strides[d]);
  }
  return hi + 1;
}

std::vector<int64_t> channels_last_strides(const std::vector<int64_t>& sz) {
  return {sz[1] * sz[2] * sz[3], 1, sz[3] * sz[1], sz[1]};
}

bool contiguous_in_some_format(const TensorType& t) {
  // Dims from the fastest-varying: the innermost first, or the channel dim (1) first.
  auto dense = [&](const std::vector<int64_t>& order) {
    int64_t expected = 1;
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

bool broadcasts_to(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

bool same_strides(const TensorType& t, const std::vector<int64_t>& strides) {
  for (size_t d = 0; d < t.sizes.size(); ++d)
    if (t.sizes[d] != 1 && t.strides[d] != strides[d]) return false;
  return true;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

namespace {
std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}
}  // namespace

std::string TensorType::str() const {
  std::string s = std::string(dtype_name(dtype)) + "[" + join(sizes) + "]";
  if (strides != contiguous_strides(sizes)) s += "{" + join(strides) + "}";
  if (device == Device::kCUDA) s += "@cuda:" + std::to_string(device_index);
  return s;
}

std::string literal_str(const Literal& l) {
  struct V {
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      // Shortest text that reads back to the same double, always with a '.' or exponent.
      std::string s = fmt::format("{}", d);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& s) const { return "\"" + s + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const { return "[" + join(v) + "]"; }
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
  FJ_INTERNAL_ASSERT(is_constant() && args_.size() == 1 && std::holds_alternative<int64_t>(args_[0].literal));
  return std::get<int64_t>(args_[0].literal);
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
  return g;
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
