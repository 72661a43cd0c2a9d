// rewrite: named rewrite rules over the graph IR, patterns as data, run to a fixed point.
//
// A Rule is a name, a Pattern rooted at one node, and a rewrite function. The pattern says as data what
// the node must be: its schema (one of a few), what each argument must be (anything, a literal equal to a
// given one, a tensor whose type passes predicates, the output of a node matching a sub-pattern), names
// bound to parts (a name bound twice must see the same value or an equal literal), and use conditions (an
// intermediate used by one node only; an output nobody uses). The rewrite function reads the bindings
// (Match), builds the replacement with a Builder, which inserts nodes before the matched node, and returns
// the values replacing the node's outputs, or nothing to decline (checks easier as code than as data).
// Rules are grouped into RuleSets; the pass pipeline runs each set as one pass (passes/pipeline.cpp).
//
// Contract of run_rules:
// - A node with side effects is never matched, neither at the root nor inside a pattern. Nodes whose
//   outputs nobody uses are not matched at the root (DCE removes them).
// - Each replacement value has the dtype and sizes of the output it replaces (checked: our bug if not);
//   the values the rule created take that output's strides, the layout eager gives it (contiguous ones
//   where those overlap, as an expand's: a computed value is stored densely, and the rule declines where a
//   view, or an op the table does not know, reads that output: its type was made for the old strides),
//   and an existing value with other strides makes the rule decline. A rule that declines leaves the
//   graph as it was: the nodes its Builder made are erased.
// - Replaced nodes, and matched intermediates left without users, are removed by DCE after each sweep.
// - Rules named in `disabled` (by "set.rule" or by the set's name) do not run.
// - Every application is recorded: the rule's full name ("decompose.softmax") and the node it replaced.
// - A set that still changes the graph after kMaxSweeps sweeps is our bug (InternalError naming the set).
// - Nodes are visited in graph order and, at each, the set's rules in their order: where a larger pattern
//   (relu(add(conv, y))) contains a smaller one rooted earlier (add(conv, y)), the smaller one's rewrite
//   declines when the larger one applies (Builder::users).
//
// Example (x * 1.0 -> x; where x's strides differ from the product's, the engine declines it):
//   Rule{"mul_one", Pattern::op({"aten::mul.Scalar"}, {Pattern::tensor().bind("x"), Pattern::literal(1.0)}),
//        [](const Match& m, Builder&) { return Replacement{m.value("x")}; }}
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fusion_jit {

// What an argument, or a node, must be. Built by the factories below and refined by the methods, each of
// which returns a refined copy: Pattern::tensor().where(is_floating_tensor).bind("x").
class Pattern {
 public:
  using TypePredicate = std::function<bool(const TensorType&)>;

  // Anything: a value, a literal, or an argument absent from the node (its schema default applies).
  static Pattern any();
  // A value (computed at run time), of any kind.
  static Pattern value();
  // A tensor value.
  static Pattern tensor();
  // A literal; with an argument, a literal equal to it (1 and 1.0 differ).
  static Pattern literal();
  static Pattern literal(Literal equal_to);
  // A node whose schema is one of `schemas` (empty: any), whose first args.size() arguments match `args`
  // (an absent argument matches only `any()`); later arguments are free. Used as an argument pattern, it
  // matches output `output` of such a node (see output()).
  static Pattern op(std::vector<std::string> schemas, std::vector<Pattern> args = {});

  // The matched value, literal or node output is bound to `name` (see Match).
  Pattern bind(std::string name) const;
  // The value is a tensor whose type passes `pred`. Several predicates must all pass.
  Pattern where(TypePredicate pred) const;
  // The value has exactly one user (the node matched around it) and is not a graph output.
  Pattern single_use() const;
  // For op patterns: which output of the node an argument must be (default 0).
  Pattern output(int index) const;
  // For op patterns: the node has `n` outputs.
  Pattern outputs(size_t n) const;
  // For op patterns: output `index` of the node has no user and is not a graph output.
  Pattern unused(int index) const;
  // For op patterns: the first two argument patterns match the node's first two arguments in either
  // order (add, mul); the order given is tried first.
  Pattern commutative() const;

  bool is_op() const { return kind_ == Kind::kOp; }
  const std::vector<std::string>& schemas() const { return schemas_; }

 private:
  friend class Matcher;
  enum class Kind { kAny, kValue, kTensor, kLiteral, kOp };
  explicit Pattern(Kind k) : kind_(k) {}
  Kind kind_;
  std::optional<Literal> equal_to_;
  std::vector<std::string> schemas_;
  std::vector<Pattern> args_;
  std::string name_;
  std::vector<TypePredicate> preds_;
  bool single_use_ = false;
  int output_ = 0;
  std::optional<size_t> num_outputs_;
  std::vector<int> unused_;
  bool commutative_ = false;
};

// Type predicates for Pattern::where.
bool is_floating_tensor(const TensorType& t);
Pattern::TypePredicate has_dtype(DType d);
Pattern::TypePredicate has_rank(int64_t rank);

// The result of matching a rule's pattern at a node.
class Match {
 public:
  Node* root = nullptr;
  std::vector<Node*> nodes;  // every matched node, the root first

  // What `name` is bound to: nullptr when the argument is absent from the node (the schema's default
  // applies); asserts the name was bound.
  const Arg* arg(const std::string& name) const;
  // The value bound to `name` (asserts it is a value).
  Value* value(const std::string& name) const;

 private:
  friend class Matcher;
  std::map<std::string, const Arg*> bound_;
  std::deque<Arg> own_;  // the root's output as an argument (a deque: pointers to it stay valid)
};

// The values replacing the root's outputs, in order (nullptr: an output nobody uses, left without a
// replacement); empty: the rule declines.
using Replacement = std::vector<Value*>;

// Builds a replacement: each node is inserted before the matched node, with one contiguous tensor output
// on the device of its first tensor argument.
class Builder {
 public:
  Builder(Graph& g, Node* before) : g_(g), before_(before) {}
  Value* op(const std::string& schema, std::vector<Arg> args, DType dtype, const SymSizes& sizes);
  // A node whose output types are given (several outputs, non-tensor outputs).
  Node* node(const std::string& schema, std::vector<Arg> args, std::vector<ValueType> output_types);
  Value* unary(const std::string& schema, Value* x);
  // a OP b with torch's promotion and broadcasting; `alpha` appends add/sub's alpha = 1.
  Value* binary(const std::string& schema, Value* a, Value* b, bool alpha = false);
  Value* add(Value* a, Value* b);
  Value* sub(Value* a, Value* b);
  Value* mul(Value* a, Value* b);
  Value* div(Value* a, Value* b);
  Value* add_scalar(Value* a, double s);
  // x itself when it already has dtype `to`.
  Value* cast(Value* x, DType to);
  // A reduction (sum.dim_IntList, mean.dim, amax, amin, var.correction) of x over normalized `dims`.
  Value* reduce(const std::string& schema, Value* x, const std::vector<int64_t>& dims, bool keepdim,
                std::optional<double> correction = std::nullopt);
  Value* reshape(Value* x, const SymSizes& to);

  // The nodes that use `v` (a graph output is not a node).
  std::vector<Node*> users(const Value* v) const { return g_.users_of(v); }
  // Whether a node with side effects runs after `first` and before `last` (both in the graph).
  bool side_effects_between(const Node* first, const Node* last) const;
  // Whether `v` is one of the graph's outputs.
  bool returned(const Value* v) const {
    for (const Value* o : g_.outputs())
      if (o == v) return true;
    return false;
  }

  // Declines with the reason `explain` reports ("the mask's dtype f16 is not the scores' f32"): for a
  // match that is the rule's pattern in all but a condition a user would want named. A rule declines
  // silently (an empty Replacement) where the match is not what the rule is about.
  Replacement decline(std::string why) {
    declined_ = std::move(why);
    return {};
  }
  const std::string& declined() const { return declined_; }

  static DType dt(const Value* v) { return v->tensor_type().dtype; }
  static const SymSizes& sizes(const Value* v) { return v->tensor_type().sizes; }
  const std::vector<Node*>& created() const { return created_; }

 private:
  Graph& g_;
  Node* before_;
  std::vector<Node*> created_;
  std::string declined_;
};

// Reading a matched argument in a rewrite function:
// a literal argument, or `dflt` when the argument is absent (its schema default); nullopt for a value.
std::optional<Literal> literal_arg(const Arg* a, Literal dflt = None{});
// A literal as a number (an integer converted) or as an integer; nullopt for absent or another kind.
std::optional<double> as_double(const std::optional<Literal>& l);
std::optional<int64_t> as_int(const std::optional<Literal>& l);
// An integer literal as it is: symbolic in a class's graph (Note [Symbolic sizes]).
std::optional<SymInt> as_sym(const std::optional<Literal>& l);

using RewriteFn = std::function<Replacement(const Match&, Builder&)>;

struct Rule {
  std::string name;  // unique in its set: lower case, digits and '_'
  Pattern pattern;   // an op pattern: the node to replace
  RewriteFn rewrite;
};

struct RuleSet {
  std::string name;  // also its pass's name in the pipeline
  std::vector<Rule> rules;
  // "set.rule" for each rule.
  std::vector<std::string> rule_names() const;
};

struct RuleApplication {
  std::string rule;      // "decompose.softmax"
  std::string replaced;  // the node, as "%4 = aten::softmax.int" with its value names at the time
  std::string declined;  // empty: the rule replaced the node; else why it left the node (Builder::decline)
};

constexpr int kMaxSweeps = 32;

// Applies `rules` to `g` until none applies (Note [Rewrite engine]); returns whether the graph changed.
// `log` gets each application in order, then the declines with a reason seen in the last sweep (the
// nodes the rules left as they are).
bool run_rules(Graph& g, const RuleSet& rules, const std::set<std::string>& disabled = {},
               std::vector<RuleApplication>* log = nullptr);

// "decompose.softmax x2, decompose.layer_norm x1" (in order of first application; declines are not
// counted); "" when none applied.
std::string summarize(const std::vector<RuleApplication>& log);

}  // namespace fusion_jit
