// Symbolic sizes (Note [Symbolic sizes]): canonical expressions, ranges, guards, the text form.
#include <gtest/gtest.h>

#include "ir/sym.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

std::vector<std::string> texts(const ShapeGuards& g) {
  std::vector<std::string> out;
  for (const SymGuard& x : g.guards()) out.push_back(x.str());
  return out;
}

TEST(Sym, ArithmeticIsCanonicalAndCarriesHints) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  const SymInt a = s0 * 64 + 1, b = 1 + 64 * s0;
  EXPECT_EQ(a.str(), "64*s0+1");
  EXPECT_EQ(a.expr(), b.expr());  // interned: one pointer per expression
  EXPECT_EQ(a.hint(), 37 * 64 + 1);
  EXPECT_EQ(((s0 + 1) * (s0 - 1)).str(), "s0*s0-1");
  EXPECT_EQ((s1 * s0 * 2 - s0 * s1).str(), "s0*s1");
  const SymInt zero = s0 - s0;
  EXPECT_FALSE(zero.is_symbolic());
  EXPECT_EQ(zero.hint(), 0);
  EXPECT_EQ((s0 * 64 + 1).evaluate({{"s0", 3}}), 193);
  EXPECT_EQ((-s0).str(), "-s0");
  EXPECT_THROW((void)(s0 * s1).evaluate({{"s0", 3}}), Error);  // s1 has no value
}

TEST(Sym, DivisionModMinMaxSimplifyWhereExact) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  EXPECT_EQ(floor_div(4 * s0 + 8, 4).str(), "s0+2");
  const SymInt h = floor_div(s0, 8);
  EXPECT_EQ(h.str(), "(s0//8)");
  EXPECT_EQ(h.hint(), 4);
  EXPECT_EQ(h.evaluate({{"s0", 17}}), 2);
  EXPECT_FALSE(mod(8 * s0, 4).is_symbolic());
  EXPECT_EQ(mod(s0, 8).str(), "(s0%8)");
  EXPECT_EQ(mod(s0, 8).hint(), 5);
  EXPECT_EQ(floor_div(-s0, 8).evaluate({{"s0", 17}}), -3);  // Python's floor
  EXPECT_EQ(floor_div(s0 * s1, s0 * s1).str(), "1");
  // Ranges decide: a symbol is at least 2.
  EXPECT_EQ(sym_max(s0, 1).str(), "s0");
  EXPECT_EQ(sym_min(s0 + 1, s0).str(), "s0");
  const SymInt m = sym_max(s0, s1);
  EXPECT_EQ(m.str(), "max(s0,s1)");
  EXPECT_EQ(m.hint(), 37);
  EXPECT_EQ(m.evaluate({{"s0", 3}, {"s1", 9}}), 9);
}

TEST(Sym, DecisionsRecordGuardsUnlessRangesDecide) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  ShapeGuards g;
  GuardScope scope(g);
  EXPECT_FALSE(s0 == 1);           // every symbol is at least 2
  EXPECT_TRUE(s0 * s1 > 1);
  EXPECT_TRUE(s0 + 1 != s0);
  EXPECT_TRUE(64 * s0 == s0 * 64);  // the same expression
  EXPECT_TRUE(g.guards().empty());
  EXPECT_TRUE(s0 != 64);
  EXPECT_TRUE(2 * s0 < 4096);
  EXPECT_TRUE(s1 < s0);
  EXPECT_TRUE(37 == s0);
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 != 64", "s0 < 2048", "s0-s1 > 0", "s0 == 37"}));
  EXPECT_TRUE(g.specializes("s0"));
  EXPECT_FALSE(g.specializes("s1"));
  EXPECT_TRUE(g.holds({{"s0", 37}, {"s1", 5}}));
  EXPECT_FALSE(g.holds({{"s0", 38}, {"s1", 5}}));
}

TEST(Sym, ReadingAsANumberSpecializes) {
  const SymInt s0 = SymInt::symbol("s0", 37);
  ShapeGuards g;
  {
    GuardScope scope(g);
    const int64_t n = 2 * s0;  // the implicit conversion of code written for numbers
    EXPECT_EQ(n, 74);
    const int64_t again = 2 * s0;
    EXPECT_EQ(again, 74);
  }
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 == 37"}));
  EXPECT_TRUE(g.holds({{"s0", 37}}));
  EXPECT_FALSE(g.holds({{"s0", 36}}));
  // Scopes nest; the innermost records.
  ShapeGuards outer, inner;
  {
    GuardScope a(outer);
    {
      GuardScope b(inner);
      (void)(s0 != 5);
    }
    (void)(s0 != 6);
  }
  EXPECT_EQ(texts(inner), (std::vector<std::string>{"s0 != 5"}));
  EXPECT_EQ(texts(outer), (std::vector<std::string>{"s0 != 6"}));
}

TEST(Sym, ADecisionWithNoScopeIsAnInternalError) {
  const SymInt s0 = SymInt::symbol("s0", 37);
  EXPECT_THROW((void)static_cast<int64_t>(s0), InternalError);
  EXPECT_THROW((void)(s0 < 40), InternalError);
  EXPECT_NO_THROW((void)(s0 == 1));  // decided by the range: no guard needed
  EXPECT_EQ(s0.hint(), 37);          // the hint itself is no decision
  EXPECT_THROW(SymInt::symbol("s9", 1), Error);  // sizes 0 and 1 are not symbols
}

TEST(Sym, ParsesItsOwnText) {
  const SymBindings hints{{"s0", 37}, {"s1", 5}};
  for (const char* text : {"64*s0+1", "(s0//8)", "(s0%8)*s1", "max(s0,s1)", "-3", "s0*s0-1", "-s0+s1"}) {
    size_t pos = 0;
    const SymInt v = parse_sym(text, pos, hints);
    EXPECT_EQ(v.str(), text);
    EXPECT_EQ(pos, std::string(text).size()) << text;
  }
  size_t pos = 0;
  const SymInt v = parse_sym("2 * (s0 + 3) // 2, rest", pos, hints);
  EXPECT_EQ(v.str(), "s0+3");
  EXPECT_EQ(v.hint(), 40);
  EXPECT_EQ(pos, 17u);
  for (const char* bad : {"s2+1", "2*", "(s0", "min(s0)", "s0//0", "#"}) {
    size_t p = 0;
    EXPECT_THROW(parse_sym(bad, p, hints), Error) << bad;
  }
}

}  // namespace
}  // namespace fusion_jit
