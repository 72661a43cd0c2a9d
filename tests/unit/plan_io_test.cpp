// The plan's JSON form (driver/plan_io.h): a plan written and read back over the same graph is the same
// plan, and text that does not fit the graph is refused. Plans are built with sources only (no compiler).
#include <gtest/gtest.h>

#include <map>

#include "driver/build_plan.h"
#include "driver/plan_io.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

// An elementwise chain, an ATen step (mm is not in the op table), a softmax (a reduction kernel with
// three passes) and a value that dies in the middle.
const char* kPlanGraph = R"(graph(%0 : f32[8,16], %1 : f32[16,16], %2 : f32[16]):
  %3 : f32[8,16] = aten::add.Tensor(%0, %2, 1)
  %4 : f32[8,16] = aten::tanh(%3)
  %5 : f32[8,16] = aten::mm(%4, %1)
  %6 : f32[8,1] = aten::amax(%5, [1], True)
  %7 : f32[8,16] = aten::sub.Tensor(%5, %6, 1)
  %8 : f32[8,16] = aten::exp(%7)
  %9 : f32[8,1] = aten::sum.dim_IntList(%8, [1], True, None)
  %10 : f32[8,16] = aten::div.Tensor(%8, %9)
  return (%10)
)";

// A cat stored by its item's kernel (Note [Concatenation in kernels]): two output buffers of one tensor,
// the second at an offset.
const char* kCatGraph = R"(graph(%0 : f32[4,8]):
  %1 : f32[4,8] = aten::exp(%0)
  %2 : Tensor[] = prim::ListConstruct(%1, %0)
  %3 : f32[4,16] = aten::cat(%2, 1)
  return (%3)
)";

// An embedding read inside its consumer's kernel (Note [Gathered loads]): the table's buffer gathered by
// the indices' buffer.
const char* kGatherGraph = R"(graph(%0 : f32[10,8], %1 : i64[3,4], %2 : f32[3,4,8]):
  %3 : f32[3,4,8] = aten::embedding(%0, %1, -1, False, False)
  %4 : f32[3,4,8] = aten::mul.Tensor(%3, %2)
  return (%4)
)";

// A cat of unequal items (Note [Cats of unequal items]): one kernel over the result in two pieces, the
// first reading the input, the second the exp of the other.
const char* kPiecesGraph = R"(graph(%0 : f32[2,3,8], %1 : f32[2,2,8]):
  %2 : f32[2,2,8] = aten::exp(%1)
  %3 : Tensor[] = prim::ListConstruct(%0, %2)
  %4 : f32[2,5,8] = aten::cat(%3, 1)
  return (%4)
)";

// aten::gather along dim 0 read inside its consumer's kernel: the table gathered with its dim kept.
const char* kGatherDimGraph = R"(graph(%0 : f32[10,8], %1 : i64[3,8], %2 : f32[3,8]):
  %3 : f32[3,8] = aten::gather(%0, 0, %1, False)
  %4 : f32[3,8] = aten::mul.Tensor(%3, %2)
  return (%4)
)";

// kPlanGraph with its rows a symbol: a shape class's graph (Note [Symbolic sizes]).
std::string class_graph(int64_t hint) {
  std::string g = std::string("graph[s0=") + std::to_string(hint) + "]" + std::string(kPlanGraph).substr(5);
  for (size_t p = g.find("[8,"); p != std::string::npos; p = g.find("[8,", p)) g.replace(p + 1, 1, "s0");
  return g;
}

std::unique_ptr<ExecutablePlan> sources_only_plan(bool cuda, const char* graph = kPlanGraph, bool size_args = false) {
  auto g = parse_graph(graph);
  if (cuda) set_device(*g, Device::kCUDA, 0);
  PlanTarget target;
  target.compile = false;
  target.size_args = size_args;
  return build_plan(std::move(g), target);
}

// The plan read back from `text` over a fresh copy of the graph it was built from.
std::unique_ptr<ExecutablePlan> read_back(const std::string& text, bool cuda, bool* ok,
                                          const char* graph = kPlanGraph) {
  auto p = std::make_unique<ExecutablePlan>();
  p->graph = parse_graph(graph);
  if (cuda) set_device(*p->graph, Device::kCUDA, 0);
  *ok = deserialize_plan(text, p.get());
  return p;
}

// `text` with its first `from` replaced by `to` is refused over `graph`, without throwing.
void expect_refused(const std::string& text, const std::string& from, const std::string& to, const char* what,
                    bool cuda = false, const char* graph = kPlanGraph) {
  std::string t = text;
  ASSERT_NE(t.find(from), std::string::npos) << text;
  t.replace(t.find(from), from.size(), to);
  bool ok = true;
  EXPECT_NO_THROW(read_back(t, cuda, &ok, graph)) << what;
  EXPECT_FALSE(ok) << what;
}

void expect_same_plan(const ExecutablePlan& a, const ExecutablePlan& b) {
  ASSERT_EQ(a.code.size(), b.code.size());
  for (size_t i = 0; i < a.code.size(); ++i) {
    EXPECT_EQ(a.code[i].target, b.code[i].target);
    EXPECT_EQ(a.code[i].arch, b.code[i].arch);
    EXPECT_EQ(a.code[i].source, b.code[i].source);
    EXPECT_EQ(a.code[i].kernels, b.code[i].kernels);
  }
  EXPECT_EQ(a.fusion_text, b.fusion_text);
  EXPECT_EQ(a.num_groups, b.num_groups);
  EXPECT_EQ(a.group_ops, b.group_ops);
  EXPECT_EQ(a.fused_ops, b.fused_ops);
  EXPECT_EQ(a.aten_ops, b.aten_ops);
  ASSERT_EQ(a.kernels.size(), b.kernels.size());
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    const KernelLaunch& x = a.kernels[i];
    const KernelLaunch& y = b.kernels[i];
    EXPECT_EQ(x.spec.name, y.spec.name);
    EXPECT_EQ(x.spec.group, y.spec.group);
    EXPECT_EQ(x.spec.device, y.spec.device);
    EXPECT_EQ(x.spec.sizes, y.spec.sizes);
    EXPECT_EQ(x.spec.numel, y.spec.numel);
    EXPECT_EQ(x.spec.index32, y.spec.index32);
    EXPECT_EQ(x.spec.args, y.spec.args);
    EXPECT_EQ(x.code, y.code);
    EXPECT_EQ(x.slot, y.slot);
    EXPECT_EQ(x.spec.is_reduction(), y.spec.is_reduction());
    EXPECT_EQ(x.spec.rows, y.spec.rows);
    EXPECT_EQ(x.spec.row_len, y.spec.row_len);
    EXPECT_EQ(x.spec.passes.size(), y.spec.passes.size());
    EXPECT_EQ(x.spec.scratch.size(), y.spec.scratch.size());
    // What the time model reads of the code, which a plan read back has no IR for (KernelCalls).
    EXPECT_EQ(x.calls.per_element, y.calls.per_element);
    EXPECT_EQ(x.calls.per_row, y.calls.per_row);
    EXPECT_EQ(x.calls.pass_loads, y.calls.pass_loads);
    ASSERT_EQ(x.spec.buffers.size(), y.spec.buffers.size());
    for (size_t j = 0; j < x.spec.buffers.size(); ++j) {
      EXPECT_EQ(x.spec.buffers[j].value->id(), y.spec.buffers[j].value->id());
      EXPECT_EQ(x.spec.buffers[j].dtype, y.spec.buffers[j].dtype);
      EXPECT_EQ(x.spec.buffers[j].is_output, y.spec.buffers[j].is_output);
      EXPECT_EQ(x.spec.buffers[j].strides, y.spec.buffers[j].strides);
      EXPECT_EQ(x.spec.buffers[j].extent, y.spec.buffers[j].extent);
      EXPECT_EQ(x.spec.buffers[j].offset, y.spec.buffers[j].offset);
      EXPECT_EQ(x.spec.buffers[j].gather, y.spec.buffers[j].gather);
      EXPECT_EQ(x.spec.buffers[j].gather_stride, y.spec.buffers[j].gather_stride);
      EXPECT_EQ(x.spec.buffers[j].gather_dim, y.spec.buffers[j].gather_dim);
      EXPECT_EQ(x.spec.buffers[j].piece, y.spec.buffers[j].piece);
      EXPECT_EQ(x.spec.buffers[j].gather_rows, y.spec.buffers[j].gather_rows);
    }
  }
  ASSERT_EQ(a.steps.size(), b.steps.size());
  auto position = [](const ExecutablePlan& p, const Node* n) {
    if (!n) return -1;
    const std::vector<Node*> nodes = p.graph->nodes();
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i] == n) return static_cast<int>(i);
    return -2;
  };
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].kernel, b.steps[i].kernel) << "step " << i;
    EXPECT_EQ(position(a, a.steps[i].node), position(b, b.steps[i].node)) << "step " << i;
    EXPECT_EQ(a.steps[i].release, b.steps[i].release) << "step " << i;
  }
}

TEST(PlanIo, ACpuPlanWrittenAndReadBackIsTheSamePlan) {
  auto plan = sources_only_plan(/*cuda=*/false);
  ASSERT_EQ(plan->kernels.size(), 2u) << plan->explain();
  ASSERT_EQ(plan->aten_ops.count("aten::mm"), 1u) << plan->explain();
  ASSERT_TRUE(plan->kernels[1].spec.is_reduction()) << plan->explain();
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/false, &ok);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  EXPECT_EQ(serialize_plan(*back), text) << "written again, the text is the same";
}

TEST(PlanIo, ACudaPlanWrittenAndReadBackIsTheSamePlan) {
  auto plan = sources_only_plan(/*cuda=*/true);
  ASSERT_FALSE(plan->kernels.empty()) << plan->explain();
  EXPECT_EQ(plan->code_for(Device::kCPU), nullptr);
  ASSERT_NE(plan->code_for(Device::kCUDA), nullptr);
  EXPECT_FALSE(plan->code_for(Device::kCUDA)->source.empty());
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/true, &ok);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  EXPECT_EQ(serialize_plan(*back), text);
}

// Sources kept elsewhere (the plan cache's form): the text names each by the reference `keep` gave, and
// reads back only through a `find` that gives it.
TEST(PlanIo, SourcesKeptByReferenceReadBackThroughFind) {
  auto plan = sources_only_plan(/*cuda=*/false);
  const std::string source = plan->code.at(0).source;
  std::map<std::string, std::string> kept;
  const std::string text = serialize_plan(*plan, [&](const std::string& s) {
    kept["ref" + std::to_string(kept.size())] = s;
    return "ref" + std::to_string(kept.size() - 1);
  });
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept.begin()->second, source);
  EXPECT_EQ(text.find("source\":"), std::string::npos) << "no copy of the source in the plan: " << text;
  EXPECT_LT(text.size(), source.size());
  auto read = [&](const FindSource& find) {
    auto p = std::make_unique<ExecutablePlan>();
    p->graph = parse_graph(kPlanGraph);
    bool ok = deserialize_plan(text, p.get(), find);
    return ok ? std::move(p) : nullptr;
  };
  auto back = read([&](const std::string& ref) -> std::optional<std::string> {
    auto it = kept.find(ref);
    if (it == kept.end()) return std::nullopt;
    return it->second;
  });
  ASSERT_NE(back, nullptr);
  expect_same_plan(*plan, *back);
  EXPECT_EQ(read(nullptr), nullptr) << "a reference with nothing to resolve it";
  EXPECT_EQ(read([](const std::string&) { return std::nullopt; }), nullptr) << "a source that is gone";
}

TEST(PlanIo, TextThatDoesNotFitTheGraphIsRefused) {
  const std::string text = serialize_plan(*sources_only_plan(/*cuda=*/false));
  bool ok = true;
  read_back("not json", /*cuda=*/false, &ok);
  EXPECT_FALSE(ok) << "not a plan";
  // Another format, hostile or foreign text: each is refused, none throws.
  auto refused = [&](const std::string& from, const std::string& to, const char* what) {
    expect_refused(text, from, to, what);
  };
  refused("\"format\":8", "\"format\":3", "another format");
  // A kernel's calls: hostile counts or loads are refused.
  refused("\"element\":{\"exp\":1.0", "\"element\":{\"exp\":-1.0", "a negative call count");
  refused("\"element\":{\"exp\":1.0", "\"element\":{\"exp\":1e300", "a call count past any kernel's");
  refused("\"passes\":[[0]", "\"passes\":[[7]", "a pass loading a buffer the kernel does not have");
  refused("\"passes\":[[0]", "\"passes\":[[0],[0],[0],[0]", "more passes' loads than passes");
  // A reduction kernel claiming more passes than any kernel has is refused, not allocated.
  refused("\"passes\":3", "\"passes\":1000000000000", "a trillion passes");
  refused("\"target\":\"cpu\"", "\"target\":\"tpu\"", "a target this build does not have");
  refused("\"code\":0", "\"code\":7", "a kernel naming code out of range");
  refused("\"code\":0", "\"code\":-1", "a kernel naming code -1");
  refused("\"numel\":", "\"elements\":", "a kernel without its element count");
  refused("\"numel\":", "\"numel\":\"x\",\"y\":", "an element count that is a string");
  // The same plan over a graph whose tensors have another dtype: its buffers do not fit.
  auto p = std::make_unique<ExecutablePlan>();
  std::string f64 = kPlanGraph;
  for (size_t at = f64.find("f32"); at != std::string::npos; at = f64.find("f32", at)) f64.replace(at, 3, "f64");
  p->graph = parse_graph(f64);
  EXPECT_FALSE(deserialize_plan(text, p.get()));
}

// Note [Sizes as kernel arguments]: a plan whose kernels read their sizes keeps their values; a kernel given
// fewer or more values than its code reads is refused (it would read past them).
TEST(PlanIo, SizeArgumentsAreReadBackAndTheirCountChecked) {
  auto plan = sources_only_plan(/*cuda=*/false, kPlanGraph, /*size_args=*/true);
  ASSERT_EQ(plan->kernels.size(), 2u) << plan->explain();
  EXPECT_EQ(plan->kernels[0].spec.args, std::vector<int64_t>({16, 16, 16})) << plan->code[0].source;
  EXPECT_FALSE(plan->kernels[1].spec.args.empty());
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/false, &ok);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  expect_refused(text, "\"args\":[16,16,16]", "\"args\":[16,16]", "one value fewer than the kernel reads");
  expect_refused(text, "\"args\":[16,16,16]", "\"args\":[16,16,16,16]", "one value more");
  expect_refused(text, "\"args\":[16,16,16]", "\"args\":[16,\"x\",16]", "a value that is not a number");
}

// The same for a CUDA plan (Note [CUDA size arguments]): its kernels read `z_.v[`, counted as the CPU's `z_[`.
TEST(PlanIo, CudaSizeArgumentsAreReadBackAndTheirCountChecked) {
  auto plan = sources_only_plan(/*cuda=*/true, kPlanGraph, /*size_args=*/true);
  ASSERT_FALSE(plan->kernels.empty()) << plan->explain();
  ASSERT_EQ(plan->kernels[0].spec.device, Device::kCUDA);
  const auto& args = plan->kernels[0].spec.args;
  ASSERT_FALSE(args.empty()) << plan->code[0].source;
  EXPECT_NE(plan->code[0].source.find("const fj_sizes<" + std::to_string(args.size()) + "> z_"), std::string::npos)
      << plan->code[0].source;
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/true, &ok);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  auto stored = [](const std::vector<int64_t>& v) {
    std::string s = "\"args\":[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  // Stored as their expressions' values: a divider's magic number and shift as the size they derive from
  // (`arg_of`), computed again when read.
  std::vector<int64_t> values;
  for (const SymInt& e : plan->kernels[0].spec.arg_exprs) values.push_back(e.hint());
  ASSERT_NE(text.find(stored(values)), std::string::npos) << text;
  ASSERT_NE(text.find("\"arg_of\":[0,0,2,1,"), std::string::npos) << text;
  expect_refused(text, stored(values), stored({values.begin(), values.end() - 1}), "one value fewer than the kernel reads",
                 /*cuda=*/true);
  expect_refused(text, "\"arg_of\":[0,0,2,1,", "\"arg_of\":[0,0,7,1,", "an argument of no kind", /*cuda=*/true);
  expect_refused(text, "\"arg_of\":[0,0,", "\"arg_of\":[0,", "a kind for each argument but one", /*cuda=*/true);
  std::vector<int64_t> by_zero = values;
  by_zero[2] = 0;  // the size whose shift the third argument passes
  expect_refused(text, stored(values), stored(by_zero), "a divider of 0", /*cuda=*/true);
}

TEST(PlanIo, ACatStoredAtOffsetsIsReadBackAndItsOffsetsChecked) {
  auto plan = sources_only_plan(/*cuda=*/false, kCatGraph);
  ASSERT_EQ(plan->kernels.size(), 1u) << plan->explain();
  const auto& buffers = plan->kernels[0].spec.buffers;
  ASSERT_EQ(buffers.size(), 3u) << plan->explain();
  EXPECT_EQ(buffers[1].offset, 0);
  EXPECT_EQ(buffers[2].offset, 8) << "the second item's slice starts 8 elements into the result";
  EXPECT_TRUE(plan->aten_ops.empty()) << plan->explain();
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/false, &ok, kCatGraph);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  // Offsets and strides that would reach outside the tensor, or a slice with no first buffer, are refused.
  auto refused = [&](const std::string& from, const std::string& to, const char* what) {
    expect_refused(text, from, to, what, /*cuda=*/false, kCatGraph);
  };
  refused("\"offset\":8", "\"offset\":9", "a slice reaching one element past the result");
  refused("\"offset\":8", "\"offset\":-8", "a negative offset");
  refused("\"offset\":0,\"out\":false", "\"offset\":8,\"out\":false", "an offset on an input");
  refused("\"offset\":8", "\"offset\":4611686018427387904", "an offset past any tensor");
}

TEST(PlanIo, PiecesAreReadBackAndTheirRangesChecked) {
  for (bool cuda : {false, true}) {
    auto plan = sources_only_plan(cuda, kPiecesGraph);
    ASSERT_EQ(plan->kernels.size(), 1u) << plan->explain();
    const KernelSpec& k = plan->kernels[0].spec;
    ASSERT_EQ(k.sizes, (std::vector<int64_t>{2, 40})) << "the innermost dim merged into the piece dim";
    ASSERT_EQ(k.pieces.size(), 2u);
    EXPECT_EQ(k.pieces[0].start, 0);
    EXPECT_EQ(k.pieces[1].start, 24);
    EXPECT_EQ(k.pieces[1].end, 40);
    ASSERT_EQ(k.buffers.size(), 3u);
    EXPECT_EQ(k.buffers[0].value->id(), 1) << "the exp's input, loaded first";
    EXPECT_EQ(k.buffers[0].piece, 1);
    EXPECT_EQ(k.piece_shift(k.buffers[0]), 24) << "the exp's input is read from the piece's start";
    EXPECT_EQ(k.buffers[1].piece, 0);
    EXPECT_EQ(k.buffers[2].piece, -1) << "the result";
    EXPECT_TRUE(plan->aten_ops.empty()) << plan->explain();
    const std::string text = serialize_plan(*plan);
    bool ok = false;
    auto back = read_back(text, cuda, &ok, kPiecesGraph);
    ASSERT_TRUE(ok) << text;
    expect_same_plan(*plan, *back);
    ASSERT_EQ(back->kernels[0].spec.pieces.size(), 2u);
    EXPECT_EQ(back->kernels[0].spec.pieces[1].end, 40);
    // Pieces outside the iteration space or their parent, and buffers of no piece or read past their
    // piece, are refused: the kernel would read outside the tensor.
    auto refused = [&](const std::string& from, const std::string& to, const char* what) {
      expect_refused(text, from, to, what, cuda, kPiecesGraph);
    };
    refused("[-1,1,24,40]", "[-1,1,24,41]", "a piece past the dim's end");
    refused("[-1,1,0,24]", "[-1,1,0,25]", "a first piece one element longer than its input");
    refused("[-1,1,24,40]", "[-1,1,24,24]", "an empty piece");
    refused("[-1,1,24,40]", "[0,1,24,40]", "a piece outside its parent along the same dim");
    refused("[-1,1,24,40]", "[5,1,24,40]", "a parent that comes later");
    refused("[-1,1,24,40]", "[-1,2,24,40]", "a dim the kernel does not have");
    refused("[-1,1,24,40]", "[-1,1,24]", "a malformed piece");
    refused("\"piece\":1", "\"piece\":2", "a buffer of no piece");
    refused(",\"piece\":0", "", "a piece's input read over the whole dim");
  }
}

TEST(PlanIo, AGatherAlongADimIsReadBackAndItsDimChecked) {
  auto plan = sources_only_plan(/*cuda=*/false, kGatherDimGraph);
  ASSERT_EQ(plan->kernels.size(), 1u) << plan->explain();
  const auto& buffers = plan->kernels[0].spec.buffers;
  ASSERT_GE(buffers.size(), 2u) << plan->explain();
  EXPECT_EQ(buffers[1].gather, 0);
  EXPECT_EQ(buffers[1].gather_dim, 0);
  const std::string text = serialize_plan(*plan);
  bool ok = false;
  auto back = read_back(text, /*cuda=*/false, &ok, kGatherDimGraph);
  ASSERT_TRUE(ok) << text;
  expect_same_plan(*plan, *back);
  auto refused = [&](const std::string& from, const std::string& to, const char* what) {
    expect_refused(text, from, to, what, /*cuda=*/false, kGatherDimGraph);
  };
  refused("\"gather\":[0,8,10,0]", "\"gather\":[0,8,10,1]", "a dim whose stride is not the one given");
  refused("\"gather\":[0,8,10,0]", "\"gather\":[0,8,10,2]", "a dim the table does not have");
  refused("\"gather\":[0,8,10,0]", "\"gather\":[0,8,10,-1]", "a negative dim");
  refused("\"gather\":[0,8,10,0]", "\"gather\":[0,8,10,0,0]", "a malformed gather");
}

TEST(PlanIo, AGatheredTableIsReadBackAndItsRowsChecked) {
  for (bool cuda : {false, true}) {
    auto plan = sources_only_plan(cuda, kGatherGraph);
    ASSERT_EQ(plan->kernels.size(), 1u) << plan->explain();
    const auto& buffers = plan->kernels[0].spec.buffers;
    ASSERT_EQ(buffers.size(), 4u) << plan->explain();
    EXPECT_EQ(buffers[0].value->id(), 1) << "the indices, loaded first";
    EXPECT_EQ(buffers[1].gather, 0);
    EXPECT_EQ(buffers[1].gather_stride, 8);
    EXPECT_EQ(buffers[1].gather_rows, 10);
    EXPECT_TRUE(plan->aten_ops.empty()) << plan->explain();
    EXPECT_NE(plan->code.at(0).source.find("fj_gather_row((long long)("), std::string::npos);
    const std::string text = serialize_plan(*plan);
    bool ok = false;
    auto back = read_back(text, cuda, &ok, kGatherGraph);
    ASSERT_TRUE(ok) << text;
    expect_same_plan(*plan, *back);
    // Rows or a row stride that are not the table's, or an index buffer that is not an earlier integer
    // input, are refused: the kernel would read outside the table.
    auto refused = [&](const std::string& from, const std::string& to, const char* what) {
      expect_refused(text, from, to, what, cuda, kGatherGraph);
    };
    refused("\"gather\":[0,8,10]", "\"gather\":[0,8,11]", "one row more than the table has");
    refused("\"gather\":[0,8,10]", "\"gather\":[0,9,10]", "a row stride that is not the table's");
    refused("\"gather\":[0,8,10]", "\"gather\":[2,8,10]", "indices from a float buffer");
    refused("\"gather\":[0,8,10]", "\"gather\":[7,8,10]", "indices from no buffer");
    refused("\"gather\":[0,8,10]", "\"gather\":[0,-8,10]", "a negative row stride");
    refused("\"gather\":[0,8,10]", "\"gather\":[0,8]", "a malformed gather");
  }
}

// Note [Symbolic sizes in the plan cache]: a shape class's plan is written with its numbers as
// expressions and its guards, and read back over the class's graph whatever size that graph's hints are;
// at each size its instance is the instance of the plan it was written from.
TEST(PlanIo, AShapeClassPlanIsWrittenWithItsExpressionsAndGuards) {
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> plan;
  {
    GuardScope scope(guards);
    PlanTarget target;
    target.compile = false;
    plan = build_plan(parse_graph(class_graph(37)), target);
  }
  ASSERT_EQ(plan->kernels.size(), 2u) << plan->explain();
  ASSERT_FALSE(plan->guards.guards().empty()) << plan->explain();  // the int32 offsets' bound
  const std::string text = serialize_plan(*plan);
  EXPECT_NE(text.find("\"sizes\":[\"s0\",16]"), std::string::npos) << text;
  // Read back over the class's graph first seen at another size.
  auto read_at = [](const std::string& t, int64_t hint, bool* ok) {
    auto p = std::make_unique<ExecutablePlan>();
    p->graph = parse_graph(class_graph(hint));
    *ok = deserialize_plan(t, p.get());
    return p;
  };
  bool ok = false;
  auto back = read_at(text, 50, &ok);
  ASSERT_TRUE(ok) << text;
  ASSERT_EQ(back->guards.guards().size(), plan->guards.guards().size());
  for (size_t i = 0; i < plan->guards.guards().size(); ++i) {
    EXPECT_EQ(back->guards.guards()[i].str(), plan->guards.guards()[i].str());
    EXPECT_EQ(back->guards.guards()[i].phase, plan->guards.guards()[i].phase);
  }
  for (int64_t n : {2, 3, 37, 50, 1000}) {
    const SymBindings b{{"s0", n}};
    expect_same_plan(*instantiate_plan(*plan, b), *instantiate_plan(*back, b));
  }
  // A guard that fails at the reading graph's hints: not that graph's plan.
  std::string pinned = text;
  pinned.replace(pinned.find("\"guards\":["), 10, "\"guards\":[[\"s0-37\",0,\"a test\"],");
  read_at(pinned, 50, &ok);
  EXPECT_FALSE(ok);
  read_at(pinned, 37, &ok);
  EXPECT_TRUE(ok);
  // A stride inside the tensor at the hint and outside it at larger sizes: each size's instance of a plan
  // from the plan cache is checked, and the plan read where its hints reach outside is refused.
  std::string reaching = text;
  ASSERT_NE(reaching.find("\"strides\":[16,1]"), std::string::npos) << text;
  reaching.replace(reaching.find("\"strides\":[16,1]"), 16, "\"strides\":[\"16+max(0,s0-37)\",1]");
  auto r = read_at(reaching, 37, &ok);
  ASSERT_TRUE(ok) << reaching;
  r->from_plan_cache = true;
  EXPECT_NO_THROW(instantiate_plan(*r, {{"s0", 37}}));
  EXPECT_THROW(instantiate_plan(*r, {{"s0", 50}}), Error);
  read_at(reaching, 50, &ok);
  EXPECT_FALSE(ok);
  // Expressions that do not parse, or name a symbol the graph lacks: refused, nothing thrown.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"sizes\":[\"s0\"", "\"sizes\":[\"s1\""}, {"\"16*s0\"", "\"16*(s0\""}, {"\"16*s0\"", "\"16*s0 junk\""}}) {
    std::string bad = text;
    bad.replace(bad.find(from), from.size(), to);
    EXPECT_NO_THROW(read_at(bad, 37, &ok)) << to;
    EXPECT_FALSE(ok) << to;
  }
  // A plan of numbers has no guards: one that names some is refused.
  auto numbers = sources_only_plan(/*cuda=*/false);
  std::string guarded = serialize_plan(*numbers);
  guarded.replace(guarded.find("\"steps\":"), 8, "\"guards\":[[\"s0\",0,\"\"]],\"steps\":");
  read_back(guarded, false, &ok);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace fusion_jit
