// The rewrite engine (passes/rewrite.h) and its first users, the decompositions (passes/decompose.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "passes/passes.h"

namespace fusion_jit {
namespace {

// tests/unit/data/decompositions.txt: cases of "=== title", an input graph, "--- decomposed", the expected
// graph after the decompose rule set (renumbered). FJ_UPDATE_GOLDEN=1 writes the expected parts anew.
TEST(Decompositions, GoldenIR) {
  const std::string path = std::string(FJ_TEST_DATA_DIR) + "/decompositions.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string line, header, title, input, expected, out;
  enum { kHeader, kInput, kExpected } part = kHeader;
  int cases = 0;
  auto finish = [&] {
    if (title.empty()) return;
    ++cases;
    auto g = parse_graph(input);
    decompose(*g);
    verify_graph(*g);
    g->renumber();
    std::string got = print_graph(*g);
    EXPECT_EQ(got, expected) << title;
    out += "=== " + title + "\n" + input + "--- decomposed\n" + got;
  };
  while (std::getline(in, line)) {
    if (line.rfind("=== ", 0) == 0) {
      finish();
      title = line.substr(4), input.clear(), expected.clear(), part = kInput;
    } else if (line == "--- decomposed") {
      part = kExpected;
    } else if (part == kHeader) {
      header += line + "\n";
    } else {
      (part == kInput ? input : expected) += line + "\n";
    }
  }
  finish();
  EXPECT_GT(cases, 20);
  if (const char* u = std::getenv("FJ_UPDATE_GOLDEN"); u && std::string(u) == "1") std::ofstream(path) << header + out;
}

}  // namespace
}  // namespace fusion_jit
