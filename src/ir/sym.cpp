// Symbolic sizes (Note [Symbolic sizes], sym.h): interned polynomials over atoms, their ranges, guards.
#include "ir/sym.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "support/error.h"

namespace fusion_jit {

namespace {

// Atoms of a monomial are ordered by their text, so that printing is canonical.
struct AtomLess {
  bool operator()(SymRef a, SymRef b) const { return a->str() < b->str(); }
};
struct MonoLess {
  bool operator()(const std::vector<SymRef>& a, const std::vector<SymRef>& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), AtomLess{});
  }
};
using PolyMap = std::map<std::vector<SymRef>, int64_t, MonoLess>;

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  FJ_CHECK(!__builtin_add_overflow(a, b, &r), "size expression: {} + {} overflows int64", a, b);
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  FJ_CHECK(!__builtin_mul_overflow(a, b, &r), "size expression: {} * {} overflows int64", a, b);
  return r;
}
int64_t py_floor_div(int64_t a, int64_t b) {
  FJ_CHECK(b != 0, "size expression: division of {} by zero", a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) {
  FJ_CHECK(b != 0, "size expression: {} modulo zero", a);
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

std::string term_text(int64_t coeff, const std::vector<SymRef>& atoms, bool first) {
  std::string s;
  const int64_t c = coeff < 0 ? -coeff : coeff;  // coefficients stay far from INT64_MIN: checked ops
  if (coeff < 0) s += "-";
  else if (!first) s += "+";
  if (atoms.empty()) return s + std::to_string(c);
  if (c != 1) s += std::to_string(c) + "*";
  for (size_t i = 0; i < atoms.size(); ++i) s += (i ? "*" : "") + atoms[i]->str();
  return s;
}

}  // namespace

// Owns every expression; one per text.
struct SymInterner {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<SymExpr>> table;

  static SymInterner& get() {
    static SymInterner* s = new SymInterner;  // never destroyed: SymRefs outlive every static
    return *s;
  }

  SymRef intern(const std::string& key, std::unique_ptr<SymExpr> e) {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, added] = table.try_emplace(key, nullptr);
    if (added) it->second = std::move(e);
    return it->second.get();
  }

  static SymRef poly(const PolyMap& p) {
    auto e = std::make_unique<SymExpr>();
    e->kind_ = SymExpr::Kind::kPoly;
    for (const auto& [atoms, c] : p)
      if (c != 0 && !atoms.empty()) e->terms_.push_back({c, atoms});
    for (const auto& [atoms, c] : p)
      if (c != 0 && atoms.empty()) e->terms_.push_back({c, atoms});  // the constant last
    for (size_t i = 0; i < e->terms_.size(); ++i)
      e->text_ += term_text(e->terms_[i].coeff, e->terms_[i].atoms, i == 0);
    if (e->terms_.empty()) e->text_ = "0";
    std::string key = "p" + e->text_;
    return get().intern(key, std::move(e));
  }

  static SymRef symbol(const std::string& name) {
    auto e = std::make_unique<SymExpr>();
    e->kind_ = SymExpr::Kind::kSymbol;
    e->name_ = name;
    e->text_ = name;
    return get().intern("a" + name, std::move(e));
  }

  static SymRef binary(SymExpr::Kind kind, SymRef a, SymRef b) {
    auto e = std::make_unique<SymExpr>();
    e->kind_ = kind;
    e->lhs_ = a;
    e->rhs_ = b;
    // An operand of // or % in parentheses unless it is one factor: "((6*s0+6)//4)", "(s0//8)".
    auto factor = [](SymRef x) {
      const auto& t = x->terms();
      const bool one = t.empty() || (t.size() == 1 && t[0].coeff > 0 && (t[0].atoms.empty() ||
                                                                       (t[0].coeff == 1 && t[0].atoms.size() == 1)));
      return one ? x->str() : "(" + x->str() + ")";
    };
    switch (kind) {
      case SymExpr::Kind::kFloorDiv: e->text_ = "(" + factor(a) + "//" + factor(b) + ")"; break;
      case SymExpr::Kind::kMod: e->text_ = "(" + factor(a) + "%" + factor(b) + ")"; break;
      case SymExpr::Kind::kMin: e->text_ = "min(" + a->str() + "," + b->str() + ")"; break;
      case SymExpr::Kind::kMax: e->text_ = "max(" + a->str() + "," + b->str() + ")"; break;
      default: FJ_INTERNAL_ASSERT(false, "not a binary atom");
    }
    std::string key = "a" + e->text_;
    return get().intern(key, std::move(e));
  }
};

int64_t SymExpr::evaluate(const SymBindings& b) const {
  switch (kind_) {
    case Kind::kPoly: {
      int64_t sum = 0;
      for (const Term& t : terms_) {
        int64_t p = t.coeff;
        for (SymRef a : t.atoms) p = checked_mul(p, a->evaluate(b));
        sum = checked_add(sum, p);
      }
      return sum;
    }
    case Kind::kSymbol: {
      auto it = b.find(name_);
      FJ_CHECK(it != b.end(), "size expression: the symbol {} has no value", name_);
      return it->second;
    }
    case Kind::kFloorDiv: return py_floor_div(lhs_->evaluate(b), rhs_->evaluate(b));
    case Kind::kMod: return py_mod(lhs_->evaluate(b), rhs_->evaluate(b));
    case Kind::kMin: return std::min(lhs_->evaluate(b), rhs_->evaluate(b));
    case Kind::kMax: return std::max(lhs_->evaluate(b), rhs_->evaluate(b));
  }
  return 0;
}

std::vector<std::string> SymExpr::symbols() const {
  std::vector<std::string> out;
  auto walk = [&](auto&& self, SymRef e) -> void {
    if (e->kind() == Kind::kSymbol) out.push_back(e->name());
    for (const Term& t : e->terms())
      for (SymRef a : t.atoms) self(self, a);
    if (e->lhs()) self(self, e->lhs());
    if (e->rhs()) self(self, e->rhs());
  };
  walk(walk, this);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Arithmetic on the polynomial form; hints alongside.
struct SymOps {
  static PolyMap poly_of(const SymInt& x) {
    PolyMap p;
    if (!x.expr_) {
      if (x.hint_ != 0) p[{}] = x.hint_;
      return p;
    }
    for (const SymExpr::Term& t : x.expr_->terms()) p[t.atoms] = t.coeff;
    return p;
  }
  static PolyMap poly_of(SymRef e) {
    PolyMap p;
    for (const SymExpr::Term& t : e->terms()) p[t.atoms] = t.coeff;
    return p;
  }
  static SymInt make(const PolyMap& p, int64_t hint) {
    bool constant = true;
    for (const auto& [atoms, c] : p) constant = constant && (c == 0 || atoms.empty());
    if (constant) {
      auto it = p.find({});
      const int64_t v = it == p.end() ? 0 : it->second;
      FJ_INTERNAL_ASSERT(v == hint, "a constant size expression {} with hint {}", v, hint);
      return SymInt(v);
    }
    return SymInt(hint, SymInterner::poly(p));
  }
  // An operand of a binary atom: the expression, or a constant polynomial.
  static SymRef operand(const SymInt& x) { return x.expr_ ? x.expr_ : SymInterner::poly(poly_of(x)); }
  static SymInt atom(SymExpr::Kind kind, const SymInt& a, const SymInt& b, int64_t hint) {
    PolyMap p;
    p[{SymInterner::binary(kind, operand(a), operand(b))}] = 1;
    return SymInt(hint, SymInterner::poly(p));
  }
  static SymInt add(const SymInt& a, const SymInt& b, int sign) {
    const int64_t hint = checked_add(a.hint_, sign > 0 ? b.hint_ : checked_mul(-1, b.hint_));
    if (!a.expr_ && !b.expr_) return SymInt(hint);
    PolyMap p = poly_of(a);
    for (const auto& [atoms, c] : poly_of(b)) p[atoms] = checked_add(p[atoms], sign > 0 ? c : -c);
    return make(p, hint);
  }
  static SymInt mul(const SymInt& a, const SymInt& b) {
    const int64_t hint = checked_mul(a.hint_, b.hint_);
    if (!a.expr_ && !b.expr_) return SymInt(hint);
    PolyMap p;
    for (const auto& [xa, ca] : poly_of(a))
      for (const auto& [xb, cb] : poly_of(b)) {
        std::vector<SymRef> atoms = xa;
        atoms.insert(atoms.end(), xb.begin(), xb.end());
        std::sort(atoms.begin(), atoms.end(), AtomLess{});
        p[atoms] = checked_add(p[atoms], checked_mul(ca, cb));
      }
    return make(p, hint);
  }
  static SymInt make_symbol(const std::string& name, int64_t hint) {
    PolyMap p;
    p[{SymInterner::symbol(name)}] = 1;
    return SymInt(hint, SymInterner::poly(p));
  }
  static int64_t hint(const SymInt& x) { return x.hint_; }
};

namespace {

// Bounds of an expression's value over every binding of its symbols (each at least 2), for deciding
// comparisons without a guard. Values beyond +-2^62 are clamped: only signs are read.
using Wide = __int128;
constexpr Wide kBig = Wide{1} << 62;
Wide clamp(Wide x) { return x > kBig ? kBig : x < -kBig ? -kBig : x; }
struct Range {
  Wide lo, hi;
};
Range full() { return {-kBig, kBig}; }
Range mul(Range a, Range b) {
  const Wide c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
  return {clamp(*std::min_element(c, c + 4)), clamp(*std::max_element(c, c + 4))};
}
Wide floor_div_wide(Wide a, Wide b) {
  Wide q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Range range_of(SymRef e);

// A lower bound of a polynomial whose negative terms are each covered by positive terms that are
// multiples of them: c*m*x with x >= f >= 1 is at least c*f*m, so it pays up to c*f of a term -k*m
// (m >= 0). So 64*s0*s1 - 64*s0 is seen to be positive, where the termwise bounds give nothing.
// nullopt where the greedy cover fails.
std::optional<Wide> covered_lower_bound(const std::vector<SymExpr::Term>& terms) {
  auto by_text = [](SymRef x, SymRef y) { return x->str() < y->str(); };
  auto lo_of = [](const std::vector<SymRef>& atoms) {
    Wide lo = 1;
    for (SymRef a : atoms) lo = clamp(lo * range_of(a).lo);
    return lo;
  };
  std::vector<Wide> left;  // positive terms' coefficients not yet spent
  for (const auto& t : terms) left.push_back(t.coeff > 0 ? t.coeff : 0);
  std::vector<size_t> negative;
  for (size_t i = 0; i < terms.size(); ++i)
    if (terms[i].coeff < 0) negative.push_back(i);
  // The largest monomials first: they have the fewest multiples.
  std::sort(negative.begin(), negative.end(), [&](size_t x, size_t y) { return terms[x].atoms.size() > terms[y].atoms.size(); });
  for (size_t i : negative) {
    const auto& m = terms[i].atoms;
    for (SymRef a : m)
      if (range_of(a).lo < 0) return std::nullopt;  // m may be negative
    Wide need = -Wide{terms[i].coeff};
    for (size_t j = 0; j < terms.size() && need > 0; ++j) {
      const auto& mj = terms[j].atoms;
      if (left[j] == 0 || !std::includes(mj.begin(), mj.end(), m.begin(), m.end(), by_text)) continue;
      std::vector<SymRef> extra;
      std::set_difference(mj.begin(), mj.end(), m.begin(), m.end(), std::back_inserter(extra), by_text);
      const Wide f = lo_of(extra);
      if (f < 1) continue;
      const Wide use = std::min(need, clamp(left[j] * f));
      left[j] -= (use + f - 1) / f;
      need -= use;
    }
    if (need > 0) return std::nullopt;
  }
  Wide lo = 0;
  for (size_t j = 0; j < terms.size(); ++j) {
    if (left[j] == 0) continue;
    const Wide m = lo_of(terms[j].atoms);
    if (m < 0) return std::nullopt;
    lo = clamp(lo + clamp(left[j] * m));
  }
  return lo;
}

Range range_of(SymRef e) {
  switch (e->kind()) {
    case SymExpr::Kind::kPoly: {
      Range sum{0, 0};
      bool negative = false, positive = false;
      for (const SymExpr::Term& t : e->terms()) {
        Range p{t.coeff, t.coeff};
        for (SymRef a : t.atoms) p = mul(p, range_of(a));
        sum = {clamp(sum.lo + p.lo), clamp(sum.hi + p.hi)};
        negative |= t.coeff < 0;
        positive |= t.coeff > 0;
      }
      if (negative && positive && sum.lo < 0)
        if (auto lo = covered_lower_bound(e->terms())) sum.lo = std::max(sum.lo, *lo);
      if (negative && positive && sum.hi > 0) {  // the upper bound: the lower bound of -e
        std::vector<SymExpr::Term> neg = e->terms();
        for (auto& t : neg) t.coeff = -t.coeff;
        if (auto lo = covered_lower_bound(neg)) sum.hi = std::min(sum.hi, -*lo);
      }
      return sum;
    }
    case SymExpr::Kind::kSymbol: return {2, kBig};
    case SymExpr::Kind::kFloorDiv: {
      const Range a = range_of(e->lhs()), b = range_of(e->rhs());
      if (b.lo <= 0) return full();
      const Wide c[4] = {floor_div_wide(a.lo, b.lo), floor_div_wide(a.lo, b.hi), floor_div_wide(a.hi, b.lo),
                         floor_div_wide(a.hi, b.hi)};
      return {*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
    }
    case SymExpr::Kind::kMod: {
      const Range b = range_of(e->rhs());
      if (b.lo <= 0) return full();
      return {0, b.hi - 1};
    }
    case SymExpr::Kind::kMin: {
      const Range a = range_of(e->lhs()), b = range_of(e->rhs());
      return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
    }
    case SymExpr::Kind::kMax: {
      const Range a = range_of(e->lhs()), b = range_of(e->rhs());
      return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
    }
  }
  return full();
}

bool compare(int64_t x, SymRel rel, int64_t y) {  // no subtraction: INT64_MAX > -1 holds
  switch (rel) {
    case SymRel::kEq: return x == y;
    case SymRel::kNe: return x != y;
    case SymRel::kLt: return x < y;
    case SymRel::kLe: return x <= y;
    case SymRel::kGt: return x > y;
    case SymRel::kGe: return x >= y;
  }
  return false;
}
bool compare(int64_t d, SymRel rel) { return compare(d, rel, 0); }
SymRel negate(SymRel r) {
  switch (r) {
    case SymRel::kEq: return SymRel::kNe;
    case SymRel::kNe: return SymRel::kEq;
    case SymRel::kLt: return SymRel::kGe;
    case SymRel::kLe: return SymRel::kGt;
    case SymRel::kGt: return SymRel::kLe;
    case SymRel::kGe: return SymRel::kLt;
  }
  return r;
}
SymRel flip(SymRel r) {  // the relation of -d to 0
  switch (r) {
    case SymRel::kLt: return SymRel::kGt;
    case SymRel::kLe: return SymRel::kGe;
    case SymRel::kGt: return SymRel::kLt;
    case SymRel::kGe: return SymRel::kLe;
    default: return r;
  }
}
const char* rel_text(SymRel r) {
  switch (r) {
    case SymRel::kEq: return "==";
    case SymRel::kNe: return "!=";
    case SymRel::kLt: return "<";
    case SymRel::kLe: return "<=";
    case SymRel::kGt: return ">";
    case SymRel::kGe: return ">=";
  }
  return "?";
}
// The outcome decided by the range alone, if it does.
std::optional<bool> by_range(const Range& r, SymRel rel) {
  switch (rel) {
    case SymRel::kEq:
    case SymRel::kNe: {
      if (r.lo > 0 || r.hi < 0) return rel == SymRel::kNe;
      if (r.lo == 0 && r.hi == 0) return rel == SymRel::kEq;
      return std::nullopt;
    }
    case SymRel::kLt: return r.hi < 0 ? std::optional<bool>(true) : r.lo >= 0 ? std::optional<bool>(false) : std::nullopt;
    case SymRel::kLe: return r.hi <= 0 ? std::optional<bool>(true) : r.lo > 0 ? std::optional<bool>(false) : std::nullopt;
    case SymRel::kGt: return r.lo > 0 ? std::optional<bool>(true) : r.hi <= 0 ? std::optional<bool>(false) : std::nullopt;
    case SymRel::kGe: return r.lo >= 0 ? std::optional<bool>(true) : r.hi < 0 ? std::optional<bool>(false) : std::nullopt;
  }
  return std::nullopt;
}

thread_local ShapeGuards* g_guards = nullptr;

void record(SymRef expr, SymRel rel, int64_t hint, const SymInt& a, const SymInt& b) {
  FJ_INTERNAL_ASSERT(g_guards != nullptr,
                     "the symbolic size comparison {} {} {} was decided at its hint ({}) where no guards are "
                     "recorded (Note [Symbolic sizes])",
                     a.str(), rel_text(rel), b.str(), hint);
  // One form per condition: the leading coefficient positive, the coefficients without a common factor
  // ("64*s0 == 2368" is "s0 == 37"); a bound divides its variable part by theirs, rounding the bound
  // inwards over the integers ("128*s0 < 2147483647" is "s0 < 16777216").
  int64_t g = 0;
  for (const SymExpr::Term& t : expr->terms()) g = std::gcd(g, t.coeff);
  if (expr->terms().front().coeff < 0) {
    g = -g;
    rel = flip(rel);
  }
  if (g != 1) {
    PolyMap p;
    for (const SymExpr::Term& t : expr->terms()) p[t.atoms] = t.coeff / g;
    expr = SymInterner::poly(p);
  }
  if (rel != SymRel::kEq && rel != SymRel::kNe) {
    Wide c = 0;
    int64_t v = 0;  // the variable part's common factor
    PolyMap p;
    for (const SymExpr::Term& t : expr->terms()) {
      if (t.atoms.empty()) c = t.coeff;
      else v = std::gcd(v, t.coeff), p[t.atoms] = t.coeff;
    }
    if (v > 1) {
      for (auto& [atoms, k] : p) k /= v;
      // p*v + c REL 0: an upper bound p*v <= U or a lower bound p*v >= L, then divided by v.
      const bool upper = rel == SymRel::kLt || rel == SymRel::kLe;
      const Wide bound = upper ? (rel == SymRel::kLt ? -c - 1 : -c) : (rel == SymRel::kGt ? -c + 1 : -c);
      const Wide q = upper ? floor_div_wide(bound, v) : -floor_div_wide(-bound, v);
      p[{}] = static_cast<int64_t>(upper ? -(q + 1) : -(q - 1));  // p < q + 1, or p > q - 1
      expr = SymInterner::poly(p);
      rel = upper ? SymRel::kLt : SymRel::kGt;
    }
  }
  g_guards->add(SymGuard{expr, rel, ""});  // (add names the phase)
}

}  // namespace

SymInt SymInt::symbol(const std::string& name, int64_t hint) {
  FJ_CHECK(!name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
               name != "min" && name != "max",
           "'{}' cannot name a size symbol", name);
  FJ_CHECK(hint >= 2, "the symbol {} has hint {}: a symbol stands for sizes of at least 2", name, hint);
  return SymOps::make_symbol(name, hint);
}

std::string SymInt::str() const { return expr_ ? expr_->str() : std::to_string(hint_); }

void SymInt::specialize() const { (void)sym_compare(*this, SymRel::kEq, SymInt(hint_)); }

SymInt& SymInt::operator+=(const SymInt& o) { return *this = SymOps::add(*this, o, 1); }
SymInt& SymInt::operator-=(const SymInt& o) { return *this = SymOps::add(*this, o, -1); }
SymInt& SymInt::operator*=(const SymInt& o) { return *this = SymOps::mul(*this, o); }
SymInt operator+(const SymInt& a, const SymInt& b) { return SymOps::add(a, b, 1); }
SymInt operator-(const SymInt& a, const SymInt& b) { return SymOps::add(a, b, -1); }
SymInt operator*(const SymInt& a, const SymInt& b) { return SymOps::mul(a, b); }
SymInt operator-(const SymInt& a) { return SymOps::add(SymInt(0), a, -1); }

SymInt floor_div(const SymInt& a, const SymInt& b) {
  const int64_t hint = py_floor_div(a.hint(), b.hint());
  if (!a.is_symbolic() && !b.is_symbolic()) return SymInt(hint);
  if (!b.is_symbolic()) {
    if (b.hint() == 1) return a;
    // Exact when every coefficient divides.
    PolyMap p = SymOps::poly_of(a);
    bool exact = true;
    for (auto& [atoms, c] : p) exact = exact && c % b.hint() == 0;
    if (exact) {
      for (auto& [atoms, c] : p) c /= b.hint();
      return SymOps::make(p, hint);
    }
  } else if (b.expr()->terms().size() == 1 && range_of(b.expr()).lo > 0) {
    // Exact when one nonzero monomial divides every term: (128*s0) // (16*s0) is 8.
    const SymExpr::Term& m = b.expr()->terms()[0];
    PolyMap p;
    bool exact = true;
    for (const auto& [atoms, c] : SymOps::poly_of(a)) {
      std::vector<SymRef> rest = atoms;
      for (SymRef x : m.atoms) {
        auto it = std::find(rest.begin(), rest.end(), x);
        if (it == rest.end()) exact = false;
        else rest.erase(it);
      }
      exact = exact && c % m.coeff == 0;
      if (!exact) break;
      p[rest] = c / m.coeff;
    }
    if (exact) return SymOps::make(p, hint);
  }
  return SymOps::atom(SymExpr::Kind::kFloorDiv, a, b, hint);
}

SymInt mod(const SymInt& a, const SymInt& b) {
  const int64_t hint = py_mod(a.hint(), b.hint());
  if (!a.is_symbolic() && !b.is_symbolic()) return SymInt(hint);
  if (!b.is_symbolic()) {
    if (b.hint() == 1 || b.hint() == -1) return SymInt(0);
    bool divides = true;
    for (const auto& [atoms, c] : SymOps::poly_of(a)) divides = divides && c % b.hint() == 0;
    if (divides) return SymInt(0);
  } else if (a.same(b)) {
    return SymInt(0);
  }
  return SymOps::atom(SymExpr::Kind::kMod, a, b, hint);
}

namespace {
// Whether a <= b at every binding, decided by ranges alone (no guard).
std::optional<bool> le_by_range(const SymInt& a, const SymInt& b) {
  const SymInt d = a - b;
  if (!d.is_symbolic()) return d.hint() <= 0;
  const Range r = range_of(d.expr());
  if (r.hi <= 0) return true;
  if (r.lo > 0) return false;
  return std::nullopt;
}
}  // namespace

SymInt sym_min(const SymInt& a, const SymInt& b) {
  if (auto le = le_by_range(a, b)) return *le ? a : b;
  if (auto ge = le_by_range(b, a)) return *ge ? b : a;
  return SymOps::atom(SymExpr::Kind::kMin, a, b, std::min(a.hint(), b.hint()));
}

SymInt sym_abs(const SymInt& a) { return a < 0 ? -a : a; }

SymInt sym_max(const SymInt& a, const SymInt& b) {
  if (auto le = le_by_range(a, b)) return *le ? b : a;
  if (auto ge = le_by_range(b, a)) return *ge ? a : b;
  return SymOps::atom(SymExpr::Kind::kMax, a, b, std::max(a.hint(), b.hint()));
}

bool sym_compare(const SymInt& a, SymRel rel, const SymInt& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) return compare(a.hint(), rel, b.hint());
  const SymInt d = a - b;
  if (!d.is_symbolic()) return compare(d.hint(), rel);
  if (auto decided = by_range(range_of(d.expr()), rel)) return *decided;
  const bool outcome = compare(d.hint(), rel);
  record(d.expr(), outcome ? rel : negate(rel), d.hint(), a, b);
  return outcome;
}

bool SymGuard::holds(const SymBindings& b) const { return compare(expr->evaluate(b), rel); }

std::string SymGuard::str() const {
  // "expr REL 0" printed as "variable part REL -constant".
  PolyMap p = SymOps::poly_of(expr);
  int64_t c = 0;
  if (auto it = p.find({}); it != p.end()) {
    c = it->second;
    p.erase(it);
  }
  return SymInterner::poly(p)->str() + " " + rel_text(rel) + " " + std::to_string(-c);
}

namespace {

// A guard as a condition on its variable part p (the expression without its constant): p in [lo, hi],
// or p != ne. nullopt for a guard without a variable part.
struct Condition {
  SymRef var = nullptr;
  Wide lo = -kBig * 4, hi = kBig * 4;  // wider than any bound a guard holds
  std::optional<Wide> ne;
};
std::optional<Condition> condition_of(const SymGuard& g) {
  PolyMap p;
  Wide c = 0;
  for (const SymExpr::Term& t : g.expr->terms()) {
    if (t.atoms.empty()) c = t.coeff;
    else p[t.atoms] = t.coeff;
  }
  if (p.empty()) return std::nullopt;
  Condition k;
  k.var = SymInterner::poly(p);
  switch (g.rel) {  // p + c REL 0, over the integers
    case SymRel::kEq: k.lo = k.hi = -c; break;
    case SymRel::kNe: k.ne = -c; break;
    case SymRel::kLt: k.hi = -c - 1; break;
    case SymRel::kLe: k.hi = -c; break;
    case SymRel::kGt: k.lo = -c + 1; break;
    case SymRel::kGe: k.lo = -c; break;
  }
  return k;
}
// Whether guard a holding implies that b holds (over the same variable part).
bool implies(const Condition& a, const Condition& b) {
  if (a.var != b.var) return false;
  if (b.ne) return (a.ne && *a.ne == *b.ne) || (!a.ne && (*b.ne < a.lo || *b.ne > a.hi));
  return !a.ne && a.lo >= b.lo && a.hi <= b.hi;
}

}  // namespace

void ShapeGuards::add(SymGuard g) {
  const auto k = condition_of(g);
  for (const SymGuard& x : guards_) {
    if (x.same(g)) return;
    const auto kx = condition_of(x);
    if (k && kx && implies(*kx, *k)) return;  // s0 > 2 makes s0 != 2 go without saying
  }
  // Those it implies go: of 128*s0 < 2147483647 and 128*s0 < 2147483711 one comparison is left.
  if (k)
    guards_.erase(std::remove_if(guards_.begin(), guards_.end(),
                                 [&](const SymGuard& x) {
                                   const auto kx = condition_of(x);
                                   return kx && implies(*k, *kx);
                                 }),
                  guards_.end());
  g.phase = phase_;
  guards_.push_back(std::move(g));
}

ShapeGuards* current_guards() { return g_guards; }

bool ShapeGuards::holds(const SymBindings& b) const {
  for (const SymGuard& g : guards_)
    if (!g.holds(b)) return false;
  return true;
}

bool ShapeGuards::specializes(const std::string& symbol) const {
  for (const SymGuard& g : guards_) {
    if (g.rel != SymRel::kEq) continue;
    const auto& t = g.expr->terms();
    if ((t.size() == 1 || (t.size() == 2 && t[1].atoms.empty())) && t[0].atoms.size() == 1 &&
        t[0].atoms[0]->kind() == SymExpr::Kind::kSymbol && t[0].atoms[0]->name() == symbol)
      return true;
  }
  return false;
}

bool SymSizes::is_symbolic() const {
  for (const SymInt& x : *this)
    if (x.is_symbolic()) return true;
  return false;
}

std::vector<int64_t> SymSizes::hints() const {
  std::vector<int64_t> out;
  out.reserve(size());
  for (const SymInt& x : *this) out.push_back(x.hint());
  return out;
}

bool SymSizes::same(const SymSizes& o) const {
  if (size() != o.size()) return false;
  for (size_t i = 0; i < size(); ++i)
    if (!(*this)[i].same(o[i])) return false;
  return true;
}

std::string SymSizes::str() const {
  std::string s;
  for (size_t i = 0; i < size(); ++i) s += (i ? "," : "") + (*this)[i].str();
  return s;
}

bool operator==(const SymSizes& a, const SymSizes& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

GuardScope::GuardScope(ShapeGuards& guards) : previous_(g_guards) { g_guards = &guards; }
GuardScope::~GuardScope() { g_guards = previous_; }

namespace {

// expr := term (('+'|'-') term)* ; term := unary ('*' unary | '//' unary | '%' unary)* ;
// unary := '-' unary | primary ; primary := integer | symbol | min(expr,expr) | max(expr,expr) | (expr)
class SymParser {
 public:
  SymParser(const std::string& t, size_t& pos, const SymBindings& hints) : t_(t), pos_(pos), hints_(hints) {}

  SymInt expr() {
    SymInt v = term();
    while (true) {
      ws();
      if (eat('+')) v = v + term();
      else if (eat('-')) v = v - term();
      else return v;
    }
  }

 private:
  SymInt term() {
    SymInt v = unary();
    while (true) {
      ws();
      if (pos_ + 1 < t_.size() && t_[pos_] == '/' && t_[pos_ + 1] == '/') {
        pos_ += 2;
        SymInt d = unary();
        FJ_CHECK(d.hint() != 0, "size expression at offset {}: division by zero", pos_);
        v = floor_div(v, d);
      } else if (eat('*')) {
        v = v * unary();
      } else if (eat('%')) {
        SymInt d = unary();
        FJ_CHECK(d.hint() != 0, "size expression at offset {}: modulo zero", pos_);
        v = mod(v, d);
      } else {
        return v;
      }
    }
  }
  SymInt unary() {
    ws();
    if (pos_ + 1 < t_.size() && t_[pos_] == '-' && std::isdigit(static_cast<unsigned char>(t_[pos_ + 1])))
      return number();  // with its sign, so that INT64_MIN reads
    if (eat('-')) return -unary();
    return primary();
  }
  SymInt number() {
    const size_t start = pos_;
    if (t_[pos_] == '-') ++pos_;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    errno = 0;
    const long long v = std::strtoll(t_.c_str() + start, nullptr, 10);
    FJ_CHECK(errno == 0, "size expression at offset {}: {} is out of int64's range", start,
             t_.substr(start, pos_ - start));
    return SymInt(static_cast<int64_t>(v));
  }
  SymInt primary() {
    ws();
    FJ_CHECK(pos_ < t_.size(), "size expression: ends at offset {} where a number or symbol was expected", pos_);
    const char c = t_[pos_];
    if (eat('(')) {
      SymInt v = expr();
      ws();
      FJ_CHECK(eat(')'), "size expression at offset {}: expected ')'", pos_);
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number();
    FJ_CHECK(std::isalpha(static_cast<unsigned char>(c)) || c == '_',
             "size expression at offset {}: expected a number or a symbol, got '{}'", pos_, c);
    const size_t start = pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) ++pos_;
    const std::string name = t_.substr(start, pos_ - start);
    if (name == "min" || name == "max") {
      ws();
      FJ_CHECK(eat('('), "size expression at offset {}: expected '(' after {}", pos_, name);
      SymInt a = expr();
      ws();
      FJ_CHECK(eat(','), "size expression at offset {}: expected ',' in {}(...)", pos_, name);
      SymInt b = expr();
      ws();
      FJ_CHECK(eat(')'), "size expression at offset {}: expected ')' after {}(...)", pos_, name);
      return name == "min" ? sym_min(a, b) : sym_max(a, b);
    }
    auto it = hints_.find(name);
    FJ_CHECK(it != hints_.end(), "size expression at offset {}: the symbol {} has no hint", start, name);
    return SymInt::symbol(name, it->second);
  }
  void ws() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  const std::string& t_;
  size_t& pos_;
  const SymBindings& hints_;
};

}  // namespace

SymInt parse_sym(const std::string& text, size_t& pos, const SymBindings& hints) {
  return SymParser(text, pos, hints).expr();
}

}  // namespace fusion_jit
