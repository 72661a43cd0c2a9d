// Note [Rewrite engine]
//
// Patterns are trees: the root is an op pattern for the node to replace, its argument patterns describe
// the node's arguments, and an op pattern among them describes the node producing that argument, and so
// on. Matching is one recursive walk from the root, following arguments to their producers; there are no
// alternatives to try, so no backtracking: a pattern matches or not, in time linear in its size. A name
// bound twice compares what it saw the second time with the first (a value by identity, a literal by
// equality). Use conditions read the graph's users, computed once per sweep and again after each
// application.
//
// The rules of a set are indexed by the schemas their roots name (rules that name none are tried
// everywhere). A sweep walks the nodes in order and tries, at each node, its rules in the set's order; the
// first rule that matches and does not decline replaces the node: its outputs' uses move to the
// replacement values, and the sweep goes on with the next node. Nodes the replacement inserted (before
// the replaced node) are not visited in that sweep; the next sweep sees them. After a sweep that applied a
// rule, DCE removes the replaced nodes and the intermediates nobody uses any more, and another sweep runs;
// the set is done after a sweep that applies nothing (the fixed point). A rule must make progress (its
// replacement may match rules again, but not forever): kMaxSweeps sweeps that keep rewriting mean two
// rules undo each other, which is our bug.
//
// This is the form of tinygrad's PatternMatcher (patterns as data with named captures and a callback that
// may decline), TVM's dataflow patterns (is_op, wildcard, type predicates) and Inductor's pattern matcher
// (single-use conditions on intermediates), kept to what the graph IR needs: schemas, literals, types and
// uses. Alternatives are written as several rules, or as several schemas at one op pattern.
#include "passes/rewrite.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <unordered_set>

#include "ir/op_table.h"
#include "passes/passes.h"
#include "support/error.h"

namespace fusion_jit {

Pattern Pattern::any() { return Pattern(Kind::kAny); }
Pattern Pattern::value() { return Pattern(Kind::kValue); }
Pattern Pattern::tensor() { return Pattern(Kind::kTensor); }
Pattern Pattern::literal() { return Pattern(Kind::kLiteral); }
Pattern Pattern::literal(Literal equal_to) {
  Pattern p(Kind::kLiteral);
  p.equal_to_ = std::move(equal_to);
  return p;
}
Pattern Pattern::op(std::vector<std::string> schemas, std::vector<Pattern> args) {
  Pattern p(Kind::kOp);
  p.schemas_ = std::move(schemas);
  p.args_ = std::move(args);
  return p;
}
Pattern Pattern::bind(std::string name) const {
  Pattern p = *this;
  p.name_ = std::move(name);
  return p;
}
Pattern Pattern::where(TypePredicate pred) const {
  Pattern p = *this;
  p.preds_.push_back(std::move(pred));
  return p;
}
Pattern Pattern::single_use() const {
  Pattern p = *this;
  p.single_use_ = true;
  return p;
}
Pattern Pattern::output(int index) const {
  Pattern p = *this;
  p.output_ = index;
  return p;
}
Pattern Pattern::outputs(size_t n) const {
  Pattern p = *this;
  p.num_outputs_ = n;
  return p;
}
Pattern Pattern::unused(int index) const {
  Pattern p = *this;
  p.unused_.push_back(index);
  return p;
}
Pattern Pattern::commutative() const {
  Pattern p = *this;
  p.commutative_ = true;
  return p;
}

bool is_floating_tensor(const TensorType& t) { return is_floating(t.dtype); }
Pattern::TypePredicate has_dtype(DType d) {
  return [d](const TensorType& t) { return t.dtype == d; };
}
Pattern::TypePredicate has_rank(int64_t rank) {
  return [rank](const TensorType& t) { return t.dim() == rank; };
}

const Arg* Match::arg(const std::string& name) const {
  auto it = bound_.find(name);
  FJ_INTERNAL_ASSERT(it != bound_.end(), "the pattern binds no '{}'", name);
  return it->second;
}

Value* Match::value(const std::string& name) const {
  const Arg* a = arg(name);
  FJ_INTERNAL_ASSERT(a && a->is_value(), "'{}' is bound to a literal or to an absent argument", name);
  return a->value;
}

// Matches patterns against one graph, with its users (recomputed after each change).
class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g) {}
  void invalidate() { users_.clear(); }

  bool match(const Pattern& p, Node* root, Match& m) {
    m.root = root;
    m.own_.emplace_back(Arg::of(root->output()));
    return match_node(p, root, &m.own_.back(), m);
  }
  bool dead(const Node* n) {
    if (n->side_effects()) return false;
    for (const Value* o : n->outputs())
      if (uses(o)) return false;
    return true;
  }

 private:
  // Users of v, counting a graph output as one.
  size_t uses(const Value* v) {
    if (users_.empty()) {
      users_ = g_.users();
      outputs_.clear();
      for (const Value* o : g_.outputs()) outputs_.insert(o);
    }
    return users_[v->id()].size() + outputs_.count(v);
  }

  bool match_node(const Pattern& p, Node* n, const Arg* as, Match& m) {
    if (n->side_effects()) return false;
    if (!p.schemas_.empty() && std::find(p.schemas_.begin(), p.schemas_.end(), n->schema()) == p.schemas_.end())
      return false;
    if (p.num_outputs_ && n->outputs().size() != *p.num_outputs_) return false;
    for (int i : p.unused_)
      if (i >= static_cast<int>(n->outputs().size()) || uses(n->output(i))) return false;
    const size_t nodes = m.nodes.size();
    const auto bound = m.bound_;
    for (bool swap : {false, true}) {
      if (swap && !p.commutative_) break;
      m.nodes.resize(nodes);  // what the first order bound is forgotten
      m.bound_ = bound;
      m.nodes.push_back(n);
      bool ok = true;
      for (size_t i = 0; ok && i < p.args_.size(); ++i) {
        const size_t j = swap && i < 2 ? 1 - i : i;
        ok = match_arg(p.args_[i], j < n->args().size() ? &n->args()[j] : nullptr, m);
      }
      if (ok && check(p, as, m)) return true;
    }
    return false;
  }

  bool match_arg(const Pattern& p, const Arg* a, Match& m) {
    switch (p.kind_) {
      case Pattern::Kind::kAny: break;
      case Pattern::Kind::kValue:
        if (!a || !a->is_value()) return false;
        break;
      case Pattern::Kind::kTensor:
        if (!a || !a->is_value() || !a->value->is_tensor()) return false;
        break;
      case Pattern::Kind::kLiteral:
        if (!a || a->is_value() || (p.equal_to_ && !(*p.equal_to_ == a->literal))) return false;
        break;
      case Pattern::Kind::kOp: {
        if (!a || !a->is_value() || !a->value->producer()) return false;
        Node* n = a->value->producer();
        if (p.output_ >= static_cast<int>(n->outputs().size()) || n->output(p.output_) != a->value) return false;
        return match_node(p, n, a, m);
      }
    }
    return check(p, a, m);
  }

  // The conditions every kind shares: type predicates, single use, the name.
  bool check(const Pattern& p, const Arg* a, Match& m) {
    if (!p.preds_.empty() || p.single_use_) {
      if (!a || !a->is_value()) return false;
      for (const auto& pred : p.preds_)
        if (!a->value->is_tensor() || !pred(a->value->tensor_type())) return false;
      if (p.single_use_ && uses(a->value) != 1) return false;
    }
    if (p.name_.empty()) return true;
    auto [it, inserted] = m.bound_.emplace(p.name_, a);
    if (inserted) return true;
    const Arg* b = it->second;
    if (!a || !b) return a == b;
    if (a->is_value() || b->is_value()) return a->value == b->value;
    return a->literal == b->literal;
  }

  const Graph& g_;
  std::vector<std::vector<Node*>> users_;
  std::unordered_set<const Value*> outputs_;
};

Node* Builder::node(const std::string& schema, std::vector<Arg> args, std::vector<ValueType> output_types) {
  Node* n = g_.insert(before_, schema, std::move(args), std::move(output_types));
  created_.push_back(n);
  return n;
}

Value* Builder::op(const std::string& schema, std::vector<Arg> args, DType dtype, const SymSizes& sizes) {
  const TensorType* like = nullptr;
  for (const Arg& a : args)
    if (!like && a.is_value() && a.value->is_tensor()) like = &a.value->tensor_type();
  FJ_INTERNAL_ASSERT(like, "a rewrite builds {} without a tensor argument", schema);
  ValueType vt;
  vt.tensor = TensorType{dtype, sizes, contiguous_strides(sizes), like->device, like->device_index};
  return node(schema, std::move(args), {vt})->output();
}

bool Builder::side_effects_between(const Node* first, const Node* last) const {
  bool inside = false;
  for (const Node* n : g_.nodes()) {
    if (n == last) return false;
    if (inside && n->side_effects()) return true;
    if (n == first) inside = true;
  }
  return false;
}

Value* Builder::unary(const std::string& schema, Value* x) { return op(schema, {Arg::of(x)}, dt(x), sizes(x)); }

Value* Builder::binary(const std::string& schema, Value* a, Value* b, bool alpha) {
  const SymSizes out = broadcast_shapes(sizes(a), sizes(b));
  std::vector<Arg> args = {Arg::of(a), Arg::of(b)};
  if (alpha) args.push_back(Arg::lit(int64_t{1}));
  return op(schema, std::move(args), promote_types(dt(a), dt(b)), out);
}

Value* Builder::add(Value* a, Value* b) { return binary("aten::add.Tensor", a, b, true); }
Value* Builder::sub(Value* a, Value* b) { return binary("aten::sub.Tensor", a, b, true); }
Value* Builder::mul(Value* a, Value* b) { return binary("aten::mul.Tensor", a, b); }
Value* Builder::div(Value* a, Value* b) { return binary("aten::div.Tensor", a, b); }

Value* Builder::add_scalar(Value* a, double s) {
  return op("aten::add.Scalar", {Arg::of(a), Arg::lit(s), Arg::lit(int64_t{1})}, dt(a), sizes(a));
}

Value* Builder::cast(Value* x, DType to) {
  if (dt(x) == to) return x;
  return op("aten::to.dtype",
            {Arg::of(x), Arg::lit(int64_t{dtype_to_torch_code(to)}), Arg::lit(false), Arg::lit(false), Arg::lit(None{})},
            to, sizes(x));
}

Value* Builder::reduce(const std::string& schema, Value* x, const std::vector<int64_t>& dims, bool keepdim,
                       std::optional<double> correction) {
  const SymSizes out = reduced_shape(sizes(x), dims, keepdim);
  std::vector<Arg> args = {Arg::of(x), Arg::lit(dims)};
  if (schema == "aten::var.correction") {
    args.push_back(Arg::lit(correction.value_or(1.0)));
    args.push_back(Arg::lit(keepdim));
  } else {
    args.push_back(Arg::lit(keepdim));
    if (schema != "aten::amax" && schema != "aten::amin") args.push_back(Arg::lit(None{}));
  }
  return op(schema, std::move(args), dt(x), out);
}

Value* Builder::reshape(Value* x, const SymSizes& to) {
  return op("aten::reshape", {Arg::of(x), Arg::lit(to)}, dt(x), to);
}

std::vector<std::string> RuleSet::rule_names() const {
  std::vector<std::string> out;
  for (const Rule& r : rules) out.push_back(name + "." + r.name);
  return out;
}

namespace {

std::string describe(const Node& n) {
  std::string s;
  for (const Value* o : n.outputs()) s += (s.empty() ? "" : ", ") + o->name();
  return s + " = " + n.schema();
}

// Whether two indices of `t` reach one element (a dim of size > 1 with stride 0, as an expand makes, or
// strides that interleave).
bool overlaps(const TensorType& t) {
  // A dense layout's strides, expression for expression: no overlap at any size, and no guard.
  if (t.strides.same(contiguous_strides(t.sizes)) ||
      (t.dim() == 4 && t.strides.same(channels_last_strides(t.sizes))))
    return false;
  std::vector<std::pair<SymInt, SymInt>> dims;  // (stride, size) of the dims of size > 1
  for (size_t i = 0; i < t.sizes.size(); ++i)
    if (t.sizes[i] > 1) dims.emplace_back(t.strides[i], t.sizes[i]);
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  SymInt reach = 1;  // elements spanned by the dims so far
  for (const auto& [stride, size] : dims) {
    if (stride < reach) return true;
    reach = stride * size;
  }
  return false;
}

// Whether the rule's replacement can stand for n's outputs (see the contract in rewrite.h): a dtype or
// size that differs is the rule's bug; an existing value with another layout than the output's makes the
// rule decline, as the output's layout is eager's.
bool fits(const Node* n, const Replacement& r, const Builder& b, const std::string& rule) {
  FJ_INTERNAL_ASSERT(r.size() == n->outputs().size(), "rule {} gives {} values for the {} outputs of {}", rule,
                     r.size(), n->outputs().size(), n->schema());
  const auto& created = b.created();
  for (size_t i = 0; i < r.size(); ++i) {
    const Value* o = n->output(i);
    if (!r[i]) continue;  // an output nobody uses (the pattern said so)
    FJ_INTERNAL_ASSERT(o->is_tensor() && r[i]->is_tensor() && r[i]->tensor_type().sizes == o->tensor_type().sizes &&
                           r[i]->tensor_type().dtype == o->tensor_type().dtype,
                       "rule {} replaces {} of {} by {}", rule, o->type().str(), n->schema(), r[i]->type().str());
    bool is_new = std::find(created.begin(), created.end(), r[i]->producer()) != created.end();
    if (!is_new && r[i]->tensor_type() != o->tensor_type()) return false;
    // A new value stored densely where the output's strides overlap has other strides: a view of it
    // (or an op the table does not know, which may be one) would keep a type made for the old strides
    // (fuzz seed 3383459620477658245: reshape of an expand, typed [0,2,1], read a dense [3,16]).
    if (is_new && overlaps(o->tensor_type()))
      for (const Node* u : b.users(o))
        if (!u->op() || u->op()->category == OpCategory::kView) return false;
  }
  return true;
}

// Moves the uses of n's outputs to the replacement; new values take the outputs' strides (contiguous
// ones where those overlap).
void replace(Graph& g, Node* n, const Replacement& r, const Builder& b) {
  const auto& created = b.created();
  for (size_t i = 0; i < r.size(); ++i) {
    if (!r[i]) continue;
    if (std::find(created.begin(), created.end(), r[i]->producer()) != created.end()) {
      const TensorType& o = n->output(i)->tensor_type();
      r[i]->mutable_type().tensor->strides = overlaps(o) ? contiguous_strides(o.sizes) : o.strides;
    }
    g.replace_all_uses(n->output(i), r[i]);
  }
}

}  // namespace

bool run_rules(Graph& g, const RuleSet& set, const std::set<std::string>& disabled, std::vector<RuleApplication>* log) {
  if (disabled.count(set.name)) return false;
  std::vector<const Rule*> enabled;
  std::set<std::string> names;
  for (const Rule& r : set.rules) {
    FJ_INTERNAL_ASSERT(r.pattern.is_op() && names.insert(r.name).second && !r.name.empty() &&
                           r.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos,
                       "rule set {}: rule '{}' is not an op pattern with a unique lower-case name", set.name, r.name);
    if (!disabled.count(set.name + "." + r.name)) enabled.push_back(&r);
  }
  // The rules to try at a schema, in the set's order; filled at the first node of each schema.
  std::map<std::string, std::vector<const Rule*>> by_schema;
  auto rules_for = [&](const std::string& schema) -> const std::vector<const Rule*>& {
    auto [it, inserted] = by_schema.try_emplace(schema);
    if (inserted)
      for (const Rule* r : enabled) {
        const auto& s = r->pattern.schemas();
        if (s.empty() || std::find(s.begin(), s.end(), schema) != s.end()) it->second.push_back(r);
      }
    return it->second;
  };
  bool changed = false;
  for (int sweep = 0;; ++sweep) {
    FJ_INTERNAL_ASSERT(sweep < kMaxSweeps, "rule set {} still rewrites after {} sweeps: two rules undo each other",
                       set.name, kMaxSweeps);
    Matcher matcher(g);
    bool applied = false;
    std::vector<RuleApplication> declines;  // this sweep's: the last sweep's are the final word
    for (Node* n : g.nodes()) {
      const auto& rules = rules_for(n->schema());
      if (rules.empty() || n->side_effects() || matcher.dead(n)) continue;
      for (const Rule* rule : rules) {
        Match m;
        if (!matcher.match(rule->pattern, n, m)) continue;
        Builder b(g, n);
        const std::string name = set.name + "." + rule->name;
        // A shape class's guards name the rule that took them (Note [Symbolic sizes]).
        if (ShapeGuards* guards = current_guards()) guards->set_phase("rule " + name);
        Replacement r = rule->rewrite(m, b);
        if (r.empty() || !fits(n, r, b, name)) {  // declined: nothing it built stays
          for (auto it = b.created().rbegin(); it != b.created().rend(); ++it) g.erase(*it);
          if (!b.declined().empty()) declines.push_back({name, describe(*n), b.declined()});
          continue;
        }
        if (log) log->push_back({name, describe(*n), ""});
        replace(g, n, r, b);
        matcher.invalidate();
        applied = true;
        break;
      }
    }
    if (!applied) {
      if (log) log->insert(log->end(), declines.begin(), declines.end());
      return changed;
    }
    changed = true;
    dce(g);
  }
}

std::optional<Literal> literal_arg(const Arg* a, Literal dflt) {
  if (!a) return dflt;
  if (a->is_value()) return std::nullopt;
  return a->literal;
}

std::optional<double> as_double(const std::optional<Literal>& l) {
  if (!l) return std::nullopt;
  if (std::holds_alternative<double>(*l)) return std::get<double>(*l);
  if (std::holds_alternative<SymInt>(*l)) return static_cast<double>(std::get<SymInt>(*l));
  return std::nullopt;
}

std::optional<int64_t> as_int(const std::optional<Literal>& l) {
  if (!l || !std::holds_alternative<SymInt>(*l)) return std::nullopt;
  return std::get<SymInt>(*l);
}

std::optional<SymInt> as_sym(const std::optional<Literal>& l) {
  if (!l || !std::holds_alternative<SymInt>(*l)) return std::nullopt;
  return std::get<SymInt>(*l);
}

std::string summarize(const std::vector<RuleApplication>& log) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& a : log) {
    if (!a.declined.empty()) continue;
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == a.rule; });
    if (it == counts.end()) counts.emplace_back(a.rule, 1);
    else ++it->second;
  }
  std::string s;
  for (const auto& [rule, n] : counts) s += fmt::format("{}{} x{}", s.empty() ? "" : ", ", rule, n);
  return s;
}

}  // namespace fusion_jit
