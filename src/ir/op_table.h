// The op table (ir/ops.def) as data: category, dtype rule, argument kinds and flags of every known op.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fusion_jit {

// A lattice, lowest first: fusion legality is decided by category.
enum class OpCategory { kElementwise, kBroadcast, kReduction, kGather, kView, kOpaque };
const char* category_name(OpCategory c);

enum class DTypeRule { kPromote, kFloat, kBool, kSame, kCastArg, kCastLike, kDivMode, kReduce, kNone };

enum class ArgKind : char {
  kTensor = 'T', kTensorNoPromote = 't', kScalar = 'S', kScalarNoPromote = 's', kOptScalar = 'O',
  kChannel = 'C', kMode = 'm', kDTypeArg = 'd', kBoolArg = 'b', kIgnored = 'x', kDims = 'D',
  kCorrection = 'c', kUnbiased = 'u'
};

struct ArgSpec {
  ArgKind kind;
  bool has_default = false;
  Literal default_value;
  bool is_tensor() const {
    return kind == ArgKind::kTensor || kind == ArgKind::kTensorNoPromote || kind == ArgKind::kChannel;
  }
};

// Properties of an op, one bit each (the flags column of ops.def, which says what each means). Passes,
// fusion, cost, codegen and the fuzzer ask the table (`op.has(OpFlag::kExpensive)`), never a list of names.
enum class OpFlag : uint32_t {
  kExpensive = 1u << 0,
  kNonNegative = 1u << 1,
  kIntegerDivision = 1u << 2,
  kIntegerRaises = 1u << 3,
  kDiscontinuous = 1u << 4,
  kIntegral = 1u << 5,
  kExact = 1u << 6,
  kReturnsAlias = 1u << 7,
  kKeepsValue = 1u << 8,
};
const char* flag_name(OpFlag f);
// Every flag, in bit order.
const std::vector<OpFlag>& all_op_flags();

struct OpInfo {
  std::string schema;  // "aten::add.Tensor"
  OpCategory category;
  DTypeRule rule;
  std::vector<ArgSpec> args;
  std::string kernel_fn;  // "add": fj_add in the preludes
  uint32_t flags = 0;     // OpFlag bits
  bool has(OpFlag f) const { return (flags & static_cast<uint32_t>(f)) != 0; }
};

// nullptr when the schema is not in the table.
const OpInfo* find_op(const std::string& schema);
const std::vector<OpInfo>& all_ops();

// The output dtype the op's rule gives for these arguments (Values and literals); nullopt when the rule
// cannot tell (kNone, or a literal where a tensor is expected).
std::optional<DType> infer_dtype(const OpInfo& op, const std::vector<Arg>& args);
// The dtype the op's operands are promoted to (before f16/bf16 are widened for arithmetic): for ops with
// a bool result the promoted type of the inputs, else the output dtype.
DType op_promoted_dtype(const OpInfo& op, const std::vector<Arg>& args, DType out);
// The type arithmetic of this op runs in (before rounding to the output dtype): the promoted type of its
// promoting arguments, with f16/bf16 computed in f32.
DType op_compute_dtype(const OpInfo& op, const std::vector<Arg>& args, DType out);
// What a reduction node computes (category kReduction): the kind of accumulator ("sum", "mean", "prod",
// "max", "min", "var"), the reduced dims of its input (normalized: non-negative, sorted, unique; every dim
// when the schema has none or gets None or []), whether they are kept as size 1, and var's correction.
struct ReductionInfo {
  std::string kind;
  std::vector<int64_t> dims;
  bool keepdim = false;
  double correction = 1;
};
// nullopt when `n` is not a reduction of the table or its dims literal is malformed.
std::optional<ReductionInfo> reduction_info(const Node& n);

// The argument at position i, or the schema default; asserts that one exists.
Literal literal_arg(const Node& n, size_t i);

}  // namespace fusion_jit
