// The textual IR. Example:
//
//   graph(%0 : f32[4,8], %1 : f32[8]{2}):
//     %2 : f32[8] = fj::constant(0)
//     %3 : f32[4,8] = aten::add.Tensor(%0, %1, 1)
//     %4 : f32[4,8] = aten::gelu(%3, "tanh")
//     %5 : Tensor = !aten::relu_(%4)          <- '!' marks a node with side effects
//     return (%4)
//
// A graph of a shape class names its symbols' hints, "graph[s0=37,s1=5](...)", and its sizes and strides
// may be expressions over them, "f32[2,s0,64]{64*s0,1,s0}" (Note [Symbolic sizes], ir/sym.h).
// Types: DTYPE[SIZES]{STRIDES}@cuda:N for tensors (strides and device only when not the default), else
// a kind name (int, float, bool, str, None, int[], Tensor[]). Literals: None, True, False, integers,
// floats (always with '.', 'e', or nan/inf), "strings", [lists]; an integer may be an expression over the
// graph's symbols, as sizes may ("[2,s0,4,16]").
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <unordered_map>

#include "ir/graph.h"
#include "support/error.h"

namespace fusion_jit {

std::string print_graph(const Graph& g) {
  std::string s = "graph";
  if (!g.symbols().empty()) {
    s += "[";
    for (const auto& [name, hint] : g.symbols()) s += (s.size() > 6 ? "," : "") + name + "=" + std::to_string(hint);
    s += "]";
  }
  s += "(";
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Value* v = g.inputs()[i];
    s += (i ? ", " : "") + v->name() + " : " + v->type().str();
  }
  s += "):\n";
  for (const Node* n : g.nodes()) {
    s += "  ";
    for (size_t i = 0; i < n->outputs().size(); ++i)
      s += (i ? ", " : "") + n->output(i)->name() + " : " + n->output(i)->type().str();
    s += " = ";
    if (n->side_effects()) s += "!";
    s += n->schema() + "(";
    for (size_t i = 0; i < n->args().size(); ++i) {
      const Arg& a = n->args()[i];
      s += (i ? ", " : "") + (a.is_value() ? a.value->name() : literal_str(a.literal));
    }
    s += ")\n";
  }
  s += "  return (";
  for (size_t i = 0; i < g.outputs().size(); ++i) s += (i ? ", " : "") + g.outputs()[i]->name();
  s += ")\n";
  return s;
}

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(text) {}

  std::unique_ptr<Graph> parse() {
    auto g = std::make_unique<Graph>();
    expect_word("graph");
    if (try_consume('[')) {  // the symbols' hints
      do {
        skip_ws();
        const size_t start = pos_;
        while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) ++pos_;
        const std::string name = t_.substr(start, pos_ - start);
        expect('=');
        const int64_t hint = integer();
        try {
          (void)SymInt::symbol(name, hint);
        } catch (const Error& e) {
          FJ_CHECK(false, "IR text, line {}: {}", line(), e.what());
        }
        FJ_CHECK(!hints_.count(name), "IR text, line {}: the symbol {} is given twice", line(), name);
        hints_[name] = hint;
        g->set_symbol(name, hint);
      } while (try_consume(','));
      expect(']');
    }
    expect('(');
    if (!try_consume(')')) {
      do {
        std::string name = value_name();
        expect(':');
        define(name, g->add_input(type()));
      } while (try_consume(','));
      expect(')');
    }
    expect(':');
    while (true) {
      skip_ws();
      if (peek_word("return")) break;
      parse_node(*g);
    }
    expect_word("return");
    expect('(');
    if (!try_consume(')')) {
      do g->add_output(use(value_name()));
      while (try_consume(','));
      expect(')');
    }
    skip_ws();
    FJ_CHECK(pos_ == t_.size(), "IR text, line {}: unexpected text after return", line());
    return g;
  }

 private:
  void parse_node(Graph& g) {
    std::vector<std::string> names;
    std::vector<ValueType> types;
    do {
      names.push_back(value_name());
      expect(':');
      types.push_back(type());
    } while (try_consume(','));
    expect('=');
    skip_ws();
    bool side = try_consume('!');
    std::string schema = ident();
    expect('(');
    std::vector<Arg> args;
    if (!try_consume(')')) {
      do {
        skip_ws();
        if (peek() == '%') args.push_back(Arg::of(use(value_name())));
        else args.push_back(Arg::lit(literal()));
      } while (try_consume(','));
      expect(')');
    }
    Node* n = g.append(schema, std::move(args), std::move(types));
    n->set_side_effects(side);
    for (size_t i = 0; i < names.size(); ++i) define(names[i], n->output(i));
  }

  ValueType type() {
    skip_ws();
    std::string word = ident();
    ValueType vt;
    if (peek() == '[' && word != "int" && word != "float" && word != "Tensor" && word != "bool") {
      auto dt = dtype_from_name(word);
      FJ_CHECK(dt.has_value(), "IR text, line {}: unknown dtype '{}'", line(), word);
      TensorType tt;
      tt.dtype = *dt;
      tt.sizes = sym_list('[', ']');
      tt.strides = peek() == '{' ? sym_list('{', '}') : contiguous_strides(tt.sizes);
      FJ_CHECK(tt.strides.size() == tt.sizes.size(), "IR text, line {}: {} strides for {} sizes", line(),
               tt.strides.size(), tt.sizes.size());
      if (try_consume('@')) {
        std::string dev;  // letters only: ident() would take the ':' and index with them
        while (pos_ < t_.size() && std::isalpha(static_cast<unsigned char>(t_[pos_]))) dev += t_[pos_++];
        FJ_CHECK(dev == "cuda", "IR text, line {}: unknown device '{}'", line(), dev);
        expect(':');
        tt.device = Device::kCUDA;
        tt.device_index = static_cast<int>(integer());
      }
      vt.tensor = tt;
    } else {
      if (try_consume('?')) word += "?";  // Tensor?[]: a list of optional tensors (index's indices)
      if (peek() == '[') {
        expect('[');
        expect(']');
        word += "[]";
      }
      vt.other = word;
    }
    return vt;
  }

  // Sizes or strides: numbers, or expressions over the graph's symbols.
  SymSizes sym_list(char open, char close) {
    expect(open);
    SymSizes v;
    if (try_consume(close)) return v;
    do {
      skip_ws();
      try {
        v.push_back(parse_sym(t_, pos_, hints_));
      } catch (const Error& e) {
        FJ_CHECK(false, "IR text, line {}: {}", line(), e.what());
      }
    } while (try_consume(','));
    expect(close);
    return v;
  }

  Literal literal() {
    skip_ws();
    char c = peek();
    if (c == '"') {
      ++pos_;
      size_t end = t_.find('"', pos_);
      FJ_CHECK(end != std::string::npos, "IR text, line {}: unterminated string", line());
      std::string s = t_.substr(pos_, end - pos_);
      pos_ = end + 1;
      return s;
    }
    if (c == '[') {
      ++pos_;
      std::vector<Literal> items;
      if (!try_consume(']')) {
        do items.push_back(literal());
        while (try_consume(','));
        expect(']');
      }
      bool any_double = false;
      for (auto& it : items) any_double |= std::holds_alternative<double>(it);
      if (any_double) {
        std::vector<double> v;
        for (auto& it : items) {
          FJ_CHECK(std::holds_alternative<double>(it) ||
                       (std::holds_alternative<SymInt>(it) && !std::get<SymInt>(it).is_symbolic()),
                   "IR text, line {}: bad item in a list of floats", line());
          v.push_back(std::holds_alternative<double>(it) ? std::get<double>(it)
                                                         : static_cast<double>(std::get<SymInt>(it).hint()));
        }
        return v;
      }
      SymSizes v;
      for (auto& it : items) {
        FJ_CHECK(std::holds_alternative<SymInt>(it), "IR text, line {}: bad list item", line());
        v.push_back(std::get<SymInt>(it));
      }
      return v;
    }
    const size_t start = pos_;
    std::string w = token();
    if (w == "None") return None{};
    if (w == "True") return true;
    if (w == "False") return false;
    if (w == "nan") return std::nan("");
    if (w == "inf") return HUGE_VAL;
    if (w == "-inf") return -HUGE_VAL;
    char* end = nullptr;
    const bool number = !w.empty() && (std::isdigit(static_cast<unsigned char>(w[0])) || w[0] == '-');
    if (number && w.find_first_of(".eE") != std::string::npos) {
      double d = std::strtod(w.c_str(), &end);
      FJ_CHECK(*end == '\0', "IR text, line {}: bad literal '{}'", line(), w);
      return d;
    }
    // An integer, or an expression over the graph's symbols.
    pos_ = start;
    FJ_CHECK(peek() != ',' && peek() != ')' && peek() != ']', "IR text, line {}: expected a literal", line());
    try {
      return parse_sym(t_, pos_, hints_);
    } catch (const Error& e) {
      FJ_CHECK(false, "IR text, line {}: bad literal '{}': {}", line(), w, e.what());
    }
    return None{};
  }

  int64_t integer() {
    std::string w = token();
    char* end = nullptr;
    long long i = std::strtoll(w.c_str(), &end, 10);
    FJ_CHECK(!w.empty() && *end == '\0', "IR text, line {}: expected an integer, got '{}'", line(), w);
    return i;
  }

  // A run of characters that may form a number or a word.
  std::string token() {
    skip_ws();
    size_t start = pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '.' ||
                                t_[pos_] == '-' || t_[pos_] == '+' || t_[pos_] == '_'))
      ++pos_;
    return t_.substr(start, pos_ - start);
  }

  std::string ident() {
    skip_ws();
    size_t start = pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_' ||
                                t_[pos_] == ':' || t_[pos_] == '.'))
      ++pos_;
    // A trailing ':' belongs to the syntax, not the name ("graph(...):").
    while (pos_ > start && t_[pos_ - 1] == ':' && (pos_ - start < 2 || t_[pos_ - 2] != ':')) --pos_;
    FJ_CHECK(pos_ > start, "IR text, line {}: expected a name", line());
    return t_.substr(start, pos_ - start);
  }

  std::string value_name() {
    skip_ws();
    expect('%');
    size_t start = pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) ++pos_;
    FJ_CHECK(pos_ > start, "IR text, line {}: expected a value name after '%'", line());
    return t_.substr(start, pos_ - start);
  }

  void define(const std::string& name, Value* v) {
    FJ_CHECK(!values_.count(name), "IR text, line {}: %{} is defined twice", line(), name);
    values_[name] = v;
  }
  Value* use(const std::string& name) {
    auto it = values_.find(name);
    FJ_CHECK(it != values_.end(), "IR text, line {}: %{} is used before it is defined", line(), name);
    return it->second;
  }

  void skip_ws() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  char peek() {
    skip_ws();
    return pos_ < t_.size() ? t_[pos_] : '\0';
  }
  bool peek_word(const char* w) { return t_.compare(pos_, std::strlen(w), w) == 0; }
  bool try_consume(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    FJ_CHECK(try_consume(c), "IR text, line {}: expected '{}'", line(), c);
  }
  void expect_word(const char* w) {
    skip_ws();
    FJ_CHECK(peek_word(w), "IR text, line {}: expected '{}'", line(), w);
    pos_ += std::strlen(w);
  }
  size_t line() const {
    size_t l = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) l += t_[i] == '\n';
    return l;
  }

  const std::string& t_;
  size_t pos_ = 0;
  std::unordered_map<std::string, Value*> values_;
  SymBindings hints_;
};

}  // namespace

std::unique_ptr<Graph> parse_graph(const std::string& text) { return Parser(text).parse(); }

}  // namespace fusion_jit
