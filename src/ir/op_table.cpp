#include "ir/op_table.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "support/error.h"

namespace fusion_jit {
namespace {

using OC = OpCategory;
using DR = DTypeRule;
constexpr OC kElementwise = OC::kElementwise, kView = OC::kView, kReduction = OC::kReduction, kGather = OC::kGather;
constexpr DR kPromote = DR::kPromote, kFloat = DR::kFloat, kBool = DR::kBool, kSame = DR::kSame,
             kCastArg = DR::kCastArg, kCastLike = DR::kCastLike, kDivMode = DR::kDivMode, kReduce = DR::kReduce,
             kNone = DR::kNone;
constexpr uint32_t flag(OpFlag f) { return static_cast<uint32_t>(f); }
constexpr uint32_t kExpensive = flag(OpFlag::kExpensive), kNonNegative = flag(OpFlag::kNonNegative),
                   kIntegerDivision = flag(OpFlag::kIntegerDivision), kIntegerRaises = flag(OpFlag::kIntegerRaises),
                   kDiscontinuous = flag(OpFlag::kDiscontinuous), kIntegral = flag(OpFlag::kIntegral),
                   kExact = flag(OpFlag::kExact), kReturnsAlias = flag(OpFlag::kReturnsAlias),
                   kKeepsValue = flag(OpFlag::kKeepsValue);

Literal parse_default(const std::string& s) {
  if (s == "None") return None{};
  if (s == "[]") return std::vector<int64_t>{};
  if (s == "False") return false;
  if (s == "True") return true;
  if (s == "none" || s == "tanh") return s;
  if (s.find_first_of(".e") != std::string::npos) return std::strtod(s.c_str(), nullptr);
  return static_cast<int64_t>(std::strtoll(s.c_str(), nullptr, 10));
}

std::vector<ArgSpec> parse_args(const std::string& spec) {
  std::vector<ArgSpec> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    ArgSpec a;
    a.kind = static_cast<ArgKind>(item[0]);
    if (item.size() > 2 && item[1] == '=') {
      a.has_default = true;
      a.default_value = parse_default(item.substr(2));
    }
    out.push_back(std::move(a));
    pos = end + 1;
  }
  return out;
}

std::vector<OpInfo> build_table() {
  std::vector<OpInfo> t;
#define FJ_OP(schema, cat, rule, args, fn, flags) \
  t.push_back(OpInfo{schema, cat, rule, parse_args(args), fn, static_cast<uint32_t>(flags)});
#include "ir/ops.def"
#undef FJ_OP
  return t;
}

bool is_zero_dim(const Value* v) { return v->is_tensor() && v->tensor_type().dim() == 0; }

// The promotion operands of an op's arguments.
std::vector<PromotionOperand> promotion_operands(const OpInfo& op, const std::vector<Arg>& args) {
  std::vector<PromotionOperand> ops;
  for (size_t i = 0; i < op.args.size() && i < args.size(); ++i) {
    ArgKind k = op.args[i].kind;
    const Arg& a = args[i];
    if (k == ArgKind::kTensor) {
      if (a.is_value() && a.value->is_tensor()) {
        ops.push_back({a.value->tensor_type().dtype,
                       is_zero_dim(a.value) ? OperandRank::kZeroDim : OperandRank::kTensor});
      }
    } else if (k == ArgKind::kScalar || k == ArgKind::kOptScalar) {
      if (a.is_value()) continue;
      if (std::holds_alternative<double>(a.literal))
        ops.push_back({DType::kFloat64, OperandRank::kWrappedNumber});
      else if (std::holds_alternative<SymInt>(a.literal))
        ops.push_back({DType::kInt64, OperandRank::kWrappedNumber});
      else if (std::holds_alternative<bool>(a.literal))
        ops.push_back({DType::kBool, OperandRank::kWrappedNumber});
    }
  }
  return ops;
}

}  // namespace

const char* category_name(OpCategory c) {
  static const char* names[] = {"elementwise", "broadcast", "reduction", "gather", "view", "opaque"};
  return names[static_cast<int>(c)];
}

const char* flag_name(OpFlag f) {
  switch (f) {
    case OpFlag::kExpensive: return "expensive";
    case OpFlag::kNonNegative: return "non-negative";
    case OpFlag::kIntegerDivision: return "integer division";
    case OpFlag::kIntegerRaises: return "raises on integers";
    case OpFlag::kDiscontinuous: return "discontinuous";
    case OpFlag::kIntegral: return "integral";
    case OpFlag::kExact: return "exact";
    case OpFlag::kReturnsAlias: return "returns an alias";
    case OpFlag::kKeepsValue: return "keeps a value";
  }
  return "?";
}

const std::vector<OpFlag>& all_op_flags() {
  static const std::vector<OpFlag> flags = {OpFlag::kExpensive,     OpFlag::kNonNegative,    OpFlag::kIntegerDivision,
                                            OpFlag::kIntegerRaises, OpFlag::kDiscontinuous, OpFlag::kIntegral,
                                            OpFlag::kExact,         OpFlag::kReturnsAlias,   OpFlag::kKeepsValue};
  return flags;
}

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> t = build_table();
  return t;
}

const OpInfo* find_op(const std::string& schema) {
  static const std::unordered_map<std::string, const OpInfo*> index = [] {
    std::unordered_map<std::string, const OpInfo*> m;
    for (const auto& op : all_ops()) m[op.schema] = &op;
    return m;
  }();
  auto it = index.find(schema);
  return it == index.end() ? nullptr : it->second;
}

Literal literal_arg(const Node& n, size_t i) {
  if (i < n.args().size()) {
    FJ_INTERNAL_ASSERT(!n.args()[i].is_value(), "{}: argument {} is not a literal", n.schema(), i);
    return n.args()[i].literal;
  }
  FJ_INTERNAL_ASSERT(n.op() && i < n.op()->args.size() && n.op()->args[i].has_default,
                     "{}: argument {} is missing", n.schema(), i);
  return n.op()->args[i].default_value;
}

std::optional<DType> infer_dtype(const OpInfo& op, const std::vector<Arg>& args) {
  auto tensor_dtype = [&](size_t i) -> std::optional<DType> {
    if (i < args.size() && args[i].is_value() && args[i].value->is_tensor())
      return args[i].value->tensor_type().dtype;
    return std::nullopt;
  };
  auto promoted = [&]() -> std::optional<DType> {
    auto ops = promotion_operands(op, args);
    if (ops.empty()) return std::nullopt;
    return result_type(ops);
  };
  switch (op.rule) {
    case DR::kPromote:
      return promoted();
    case DR::kFloat: {
      auto p = promoted();
      if (p && !is_floating(*p)) p = DType::kFloat32;
      return p;
    }
    case DR::kDivMode: {
      auto p = promoted();
      bool has_mode = args.size() > 2 && !args[2].is_value() && std::holds_alternative<std::string>(args[2].literal);
      if (p && !has_mode && !is_floating(*p)) p = DType::kFloat32;
      return p;
    }
    case DR::kBool:
      return DType::kBool;
    case DR::kSame:
      return tensor_dtype(0);
    case DR::kCastArg:
      for (size_t i = 0; i < op.args.size() && i < args.size(); ++i)
        if (op.args[i].kind == ArgKind::kDTypeArg && !args[i].is_value() &&
            std::holds_alternative<SymInt>(args[i].literal)) {
          DType d = dtype_from_torch_code(static_cast<int>(std::get<SymInt>(args[i].literal)));
          if (d != DType::kOther) return d;
        }
      return std::nullopt;
    case DR::kCastLike:
      return tensor_dtype(1);
    case DR::kReduce: {
      auto in = tensor_dtype(0);
      for (size_t i = 0; i < op.args.size() && i < args.size(); ++i)
        if (op.args[i].kind == ArgKind::kDTypeArg && !args[i].is_value() &&
            std::holds_alternative<SymInt>(args[i].literal)) {
          DType d = dtype_from_torch_code(static_cast<int>(std::get<SymInt>(args[i].literal)));
          return d == DType::kOther ? std::nullopt : std::optional<DType>(d);
        }
      if (in && (op.kernel_fn == "sum" || op.kernel_fn == "prod") && is_integral(*in, true)) return DType::kInt64;
      return in;
    }
    case DR::kNone:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ReductionInfo> reduction_info(const Node& n) {
  const OpInfo* op = n.op();
  if (!op || op->category != OpCategory::kReduction || n.args().empty() || !n.args()[0].is_value() ||
      !n.args()[0].value->is_tensor())
    return std::nullopt;
  ReductionInfo r;
  r.kind = op->kernel_fn;
  const int64_t rank = n.args()[0].value->tensor_type().dim();
  bool all = true;
  std::vector<int64_t> dims;
  bool unbiased = true;
  std::optional<double> correction;
  for (size_t i = 1; i < op->args.size(); ++i) {
    Literal l = i < n.args().size() ? (n.args()[i].is_value() ? Literal(None{}) : n.args()[i].literal)
                                    : op->args[i].default_value;
    if (i < n.args().size() && n.args()[i].is_value()) return std::nullopt;  // computed at run time
    switch (op->args[i].kind) {
      case ArgKind::kDims:
        if (std::holds_alternative<SymInt>(l)) dims = {std::get<SymInt>(l)};
        else if (std::holds_alternative<SymSizes>(l)) dims = std::get<SymSizes>(l);
        else if (!std::holds_alternative<None>(l)) return std::nullopt;
        all = dims.empty();
        break;
      case ArgKind::kBoolArg:
        if (!std::holds_alternative<bool>(l)) return std::nullopt;
        r.keepdim = std::get<bool>(l);
        break;
      case ArgKind::kUnbiased:
        if (!std::holds_alternative<bool>(l)) return std::nullopt;
        unbiased = std::get<bool>(l);
        break;
      case ArgKind::kCorrection:
        if (std::holds_alternative<SymInt>(l)) correction = static_cast<double>(std::get<SymInt>(l));
        else if (std::holds_alternative<double>(l)) correction = std::get<double>(l);
        else if (!std::holds_alternative<None>(l)) return std::nullopt;
        break;
      default:
        break;
    }
  }
  r.correction = correction ? *correction : (unbiased ? 1.0 : 0.0);
  if (all) {
    for (int64_t d = 0; d < rank; ++d) r.dims.push_back(d);
  } else {
    for (int64_t d : dims) {
      int64_t nd = d < 0 ? d + std::max<int64_t>(rank, 1) : d;
      if (nd < 0 || nd >= std::max<int64_t>(rank, 1)) return std::nullopt;
      if (rank > 0) r.dims.push_back(nd);
    }
    std::sort(r.dims.begin(), r.dims.end());
    r.dims.erase(std::unique(r.dims.begin(), r.dims.end()), r.dims.end());
  }
  return r;
}

DType op_promoted_dtype(const OpInfo& op, const std::vector<Arg>& args, DType out) {
  if (op.rule == DR::kBool) {
    auto ops = promotion_operands(op, args);
    return ops.empty() ? DType::kBool : result_type(ops);
  }
  return out;
}

DType op_compute_dtype(const OpInfo& op, const std::vector<Arg>& args, DType out) {
  return compute_dtype(op_promoted_dtype(op, args, out));
}

}  // namespace fusion_jit
