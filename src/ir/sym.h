// Symbolic sizes: the numbers of a shape class (Note [Symbolic sizes]).
//
// Note [Symbolic sizes]
// A graph of a shape class has sizes that are expressions over symbols (s0, s1, ...), one per dynamic
// dimension. A SymInt is a number with, where it is not a literal, its expression; it always carries its
// hint, the value at the example the graph was captured at. Arithmetic on SymInts (+, -, *, floor_div,
// mod, sym_min, sym_max) stays symbolic. Every other use of one is a decision taken at the hint, and a
// decision is only sound for the sizes where it comes out the same: so each records a guard, the
// condition under which it holds, into the thread's current ShapeGuards (GuardScope):
// - comparing (==, !=, <, <=, >, >=) records the comparison's outcome ("s0 != 64") unless the symbols'
//   ranges decide it (every symbol is at least 2: sizes 0 and 1 are classes of their own, since a size 1
//   broadcasts; so "s0 == 1" is false with no guard);
// - reading one as an int64_t (an implicit conversion, so code written for numbers compiles and stays
//   correct) specializes: it records "expr == hint".
// A plan built from a symbolic graph is then valid for exactly the sizes where its guards hold, by
// construction: code that never learnt about symbols specializes, code that did keeps the class wide.
// Reading a symbolic number where no GuardScope is open throws an InternalError: nothing decides on a
// symbol unseen. hint() reads the hint with no guard, for what cannot change a result (a cost model's
// estimate, a printed name).
//
// Expressions are interned and never freed (a process sees few: the sizes of its graphs' classes), so a
// SymInt is two words, copied freely, and two expressions are equal when their pointers are. An expression
// is a polynomial with integer coefficients over atoms; an atom is a symbol, or a floor division, modulo,
// min or max of two expressions that does not simplify to a polynomial. Its text is canonical (terms and
// factors in the order of their text): "64*s0+1", "(s0//8)*s1", "max(s0,s1)".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace fusion_jit {

class SymExpr;
using SymRef = const SymExpr*;

// A symbol's value at one call: symbol name -> value.
using SymBindings = std::map<std::string, int64_t>;

class SymExpr {
 public:
  enum class Kind : uint8_t { kPoly, kSymbol, kFloorDiv, kMod, kMin, kMax };
  struct Term {
    int64_t coeff = 0;
    std::vector<SymRef> atoms;  // sorted by text, with repeats; empty for the constant term
  };
  Kind kind() const { return kind_; }
  const std::vector<Term>& terms() const { return terms_; }  // kPoly
  const std::string& name() const { return name_; }          // kSymbol
  SymRef lhs() const { return lhs_; }                        // the binary atoms' operands (polynomials)
  SymRef rhs() const { return rhs_; }
  const std::string& str() const { return text_; }
  // The value with the symbols bound; throws Error naming a symbol that `b` lacks.
  int64_t evaluate(const SymBindings& b) const;
  // The symbols it reads, sorted.
  std::vector<std::string> symbols() const;

 private:
  friend struct SymInterner;
  Kind kind_ = Kind::kPoly;
  std::vector<Term> terms_;
  std::string name_;
  SymRef lhs_ = nullptr, rhs_ = nullptr;
  std::string text_;
};

class SymInt {
 public:
  SymInt() = default;
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  SymInt(T v) : hint_(static_cast<int64_t>(v)) {}  // NOLINT: a literal
  // The symbol `name` (at least 2) at hint `hint`.
  static SymInt symbol(const std::string& name, int64_t hint);

  bool is_symbolic() const { return expr_ != nullptr; }
  SymRef expr() const { return expr_; }  // null for a literal
  // The value at the example, with no guard: only for what cannot change a result (Note [Symbolic sizes]).
  int64_t hint() const { return hint_; }
  // Read as a number: specializes a symbolic value (records "expr == hint").
  operator int64_t() const {  // NOLINT: code written for numbers reads sizes as numbers
    if (expr_) specialize();
    return hint_;
  }
  // The value with the symbols bound (the literal for a literal).
  int64_t evaluate(const SymBindings& b) const { return expr_ ? expr_->evaluate(b) : hint_; }
  // "s0+1" or "7": no guard.
  std::string str() const;
  // The same number: the same expression, or the same literal. No guard.
  bool same(const SymInt& o) const { return expr_ == o.expr_ && (expr_ || hint_ == o.hint_); }

  SymInt& operator+=(const SymInt& o);
  SymInt& operator-=(const SymInt& o);
  SymInt& operator*=(const SymInt& o);

 private:
  friend struct SymOps;
  SymInt(int64_t hint, SymRef expr) : hint_(hint), expr_(expr) {}
  void specialize() const;
  int64_t hint_ = 0;
  SymRef expr_ = nullptr;
};

SymInt operator+(const SymInt& a, const SymInt& b);
SymInt operator-(const SymInt& a, const SymInt& b);
SymInt operator*(const SymInt& a, const SymInt& b);
SymInt operator-(const SymInt& a);
// Python's // and % (the divisor's sign): Error when b is 0.
SymInt floor_div(const SymInt& a, const SymInt& b);
SymInt mod(const SymInt& a, const SymInt& b);
SymInt sym_min(const SymInt& a, const SymInt& b);
SymInt sym_max(const SymInt& a, const SymInt& b);

// Comparisons decide at the hint and record the outcome as a guard (Note [Symbolic sizes]).
// |a|: a guard on its sign only where the symbols' ranges leave it open.
SymInt sym_abs(const SymInt& a);
enum class SymRel : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
bool sym_compare(const SymInt& a, SymRel rel, const SymInt& b);
inline bool operator==(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kEq, b); }
inline bool operator!=(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kNe, b); }
inline bool operator<(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kLt, b); }
inline bool operator<=(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kLe, b); }
inline bool operator>(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kGt, b); }
inline bool operator>=(const SymInt& a, const SymInt& b) { return sym_compare(a, SymRel::kGe, b); }

// Mixed with plain integers: templates, so that `size * 2` or `size == 1` pick these over the built-in
// operators on the converted (specialized) number.
#define FJ_SYM_MIXED(op)                                                                            \
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0> \
  inline auto operator op(const SymInt& a, T b) { return a op SymInt(b); }                          \
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0> \
  inline auto operator op(T a, const SymInt& b) { return SymInt(a) op b; }
FJ_SYM_MIXED(+)
FJ_SYM_MIXED(-)
FJ_SYM_MIXED(*)
FJ_SYM_MIXED(==)
FJ_SYM_MIXED(!=)
FJ_SYM_MIXED(<)
FJ_SYM_MIXED(<=)
FJ_SYM_MIXED(>)
FJ_SYM_MIXED(>=)
#undef FJ_SYM_MIXED

// One recorded condition: expr REL 0.
struct SymGuard {
  SymRef expr = nullptr;
  SymRel rel = SymRel::kEq;
  std::string phase;  // what was running when it was first recorded (ShapeGuards::set_phase)
  bool holds(const SymBindings& b) const;
  std::string str() const;  // "s0 == 37", "2*s0 < 4096"
  bool same(const SymGuard& o) const { return expr == o.expr && rel == o.rel; }
};

// The guards of one build: the conditions on the symbols under which its decisions hold.
class ShapeGuards {
 public:
  // Records g, unless a guard recorded before implies it (s0 > 2 implies s0 != 2; of two bounds on one
  // expression the tighter); guards g implies go. So a plan's guards are few comparisons.
  void add(SymGuard g);
  const std::vector<SymGuard>& guards() const { return guards_; }
  // Names what records the guards from now on ("pass cse"), so that explain can say why a size was fixed.
  void set_phase(std::string phase) { phase_ = std::move(phase); }
  bool holds(const SymBindings& b) const;
  // Whether some guard fixes `symbol` to one value.
  bool specializes(const std::string& symbol) const;

 private:
  std::vector<SymGuard> guards_;
  std::string phase_;
};

// The thread's recorder, or nullptr when no GuardScope is open.
ShapeGuards* current_guards();

// Makes `guards` the thread's recorder while it lives (scopes nest; the innermost records).
class GuardScope {
 public:
  explicit GuardScope(ShapeGuards& guards);
  ~GuardScope();
  GuardScope(const GuardScope&) = delete;
  GuardScope& operator=(const GuardScope&) = delete;

 private:
  ShapeGuards* previous_;
};

// Sizes or strides of a tensor: a vector of SymInts. Read as a std::vector<int64_t> (an implicit
// conversion, for code written for numbers), each element specializes; == and != compare element by
// element as SymInts do. A vector of numbers converts to one implicitly.
class SymSizes : public std::vector<SymInt> {
 public:
  using std::vector<SymInt>::vector;
  SymSizes() = default;
  SymSizes(const std::vector<int64_t>& v) : std::vector<SymInt>(v.begin(), v.end()) {}  // NOLINT
  operator std::vector<int64_t>() const {  // NOLINT: see above
    return std::vector<int64_t>(begin(), end());
  }
  bool is_symbolic() const;
  // The hints, with no guard (Note [Symbolic sizes]).
  std::vector<int64_t> hints() const;
  // The same numbers (SymInt::same), with no guard.
  bool same(const SymSizes& o) const;
  std::string str() const;  // "2,s0,64"
};
bool operator==(const SymSizes& a, const SymSizes& b);
inline bool operator!=(const SymSizes& a, const SymSizes& b) { return !(a == b); }

// Parses an expression ("64*s0+1", "(s0//2)", "min(s0,s1)", "-3") at `pos` of `text`, advancing `pos`;
// symbols' hints from `hints`. Throws Error naming the position and what was expected, or a symbol with
// no hint.
SymInt parse_sym(const std::string& text, size_t& pos, const SymBindings& hints);

}  // namespace fusion_jit
