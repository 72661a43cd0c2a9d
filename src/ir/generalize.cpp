// generalize(): the graph of a shape class from two prints of one graph (Note [Graphs of two sizes]).
#include <fmt/format.h>

#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string>
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

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '%' || c == '.'; }

}  // namespace

std::string generalize(const std::string& first, const std::string& second, const std::map<int64_t, int64_t>& extents,
                       std::string* why) {
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
  std::map<std::pair<int64_t, int64_t>, std::string> fitted;
  std::set<std::string> used;
  std::string out;
  size_t p = 0, q = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (p < first.size() && q < second.size()) {
    if (!digit(first[p]) || !digit(second[q])) {
      if (first[p] != second[q]) {
        *why = fmt::format("the graphs differ beyond their numbers: '{}' and '{}'", first.substr(p, 40), second.substr(q, 40));
        return "";
      }
      out += first[p++];
      ++q;
      continue;
    }
    size_t p1 = p, q1 = q;
    while (p1 < first.size() && digit(first[p1])) ++p1;
    while (q1 < second.size() && digit(second[q1])) ++q1;
    const std::string na = first.substr(p, p1 - p), nb = second.substr(q, q1 - q);
    const char before = p ? first[p - 1] : ' ';
    const char after_a = p1 < first.size() ? first[p1] : ' ', after_b = q1 < second.size() ? second[q1] : ' ';
    p = p1, q = q1;
    if (na == nb) {
      out += na;
      continue;
    }
    // Only whole integers change with the sizes: not a name's digits, a float's, or a negative number.
    if (word_char(before) || before == '-' || after_a == '.' || after_b == '.' || after_a == 'e' || after_b == 'e' ||
        na.size() > 17 || nb.size() > 17) {
      *why = fmt::format("a number that is not a size differs: '{}{}' and '{}{}'", before, na, before, nb);
      return "";
    }
    const int64_t va = std::stoll(na), vb = std::stoll(nb);
    auto [it, added] = fitted.emplace(std::make_pair(va, vb), "");
    if (added) {
      std::optional<SymInt> e = fit(monos, linear_and_square, va, vb);
      if (!e || !e->is_symbolic()) {
        fitted.erase(it);
        *why = fmt::format("{} at the first size and {} at the second fit no expression over the extents", na, nb);
        return "";
      }
      it->second = e->str();
      for (const std::string& name : e->expr()->symbols()) used.insert(name);
    }
    out += it->second;
  }
  if (p != first.size() || q != second.size()) {
    *why = "the graphs differ in length beyond their numbers";
    return "";
  }
  if (used.empty()) {
    *why = "no size differs between the two graphs";
    return "";
  }
  if (out.rfind("graph(", 0) != 0) {
    *why = "not a graph's text";
    return "";
  }
  std::string hints;
  for (size_t i = 0; i < n; ++i)
    if (used.count(names[i])) hints += fmt::format("{}{}={}", hints.empty() ? "" : ",", names[i], monos[i].a);
  return "graph[" + hints + "](" + out.substr(6);
}

}  // namespace fusion_jit
