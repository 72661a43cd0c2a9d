#include "ir/dtype.h"

#include "support/error.h"

namespace fusion_jit {
namespace {
struct Info {
  const char* name;
  const char* ctype;
  size_t size;
  int torch_code;
};
const Info kInfo[] = {
    {"b8", "bool", 1, 11},        {"u8", "uint8_t", 1, 0},      {"i8", "int8_t", 1, 1},
    {"i16", "int16_t", 2, 2},     {"i32", "int32_t", 4, 3},     {"i64", "int64_t", 8, 4},
    {"f16", "uint16_t", 2, 5},    {"bf16", "uint16_t", 2, 15},  {"f32", "float", 4, 6},
    {"f64", "double", 8, 7},      {"other", "void", 0, -1},
};
}  // namespace

const char* dtype_name(DType t) { return kInfo[static_cast<int>(t)].name; }
const char* dtype_c_type(DType t) { return kInfo[static_cast<int>(t)].ctype; }
int64_t wrap_integer(int64_t v, DType t) {
  switch (t) {
    case DType::kBool: return v != 0;
    case DType::kUInt8: return static_cast<uint8_t>(v);
    case DType::kInt8: return static_cast<int8_t>(v);
    case DType::kInt16: return static_cast<int16_t>(v);
    case DType::kInt32: return static_cast<int32_t>(v);
    default: return v;
  }
}
size_t dtype_size(DType t) { return kInfo[static_cast<int>(t)].size; }
int dtype_to_torch_code(DType t) { return kInfo[static_cast<int>(t)].torch_code; }

std::optional<DType> dtype_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(DType::kOther); ++i)
    if (name == kInfo[i].name) return static_cast<DType>(i);
  if (name == "bool") return DType::kBool;
  return std::nullopt;
}

DType dtype_from_torch_code(int code) {
  for (int i = 0; i < static_cast<int>(DType::kOther); ++i)
    if (kInfo[i].torch_code == code) return static_cast<DType>(i);
  return DType::kOther;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kOther || b == DType::kOther) return DType::kOther;
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    // f16 with bf16 gives f32; otherwise the wider one.
    if (is_reduced_float(a) && is_reduced_float(b)) return DType::kFloat32;
    return static_cast<int>(a) > static_cast<int>(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integral. uint8 with a signed type: int16 with int8, else the signed one.
  if (a == DType::kUInt8 || b == DType::kUInt8) {
    DType other = a == DType::kUInt8 ? b : a;
    return other == DType::kInt8 ? DType::kInt16 : other;
  }
  return static_cast<int>(a) > static_cast<int>(b) ? a : b;
}

namespace {
int category(DType t) { return t == DType::kBool ? 0 : is_floating(t) ? 2 : 1; }
}  // namespace

DType result_type(const std::vector<PromotionOperand>& operands) {
  FJ_INTERNAL_ASSERT(!operands.empty());
  // Per rank, the promoted dtype of operands of that rank.
  std::optional<DType> per_rank[3];
  for (const auto& op : operands) {
    auto& slot = per_rank[static_cast<int>(op.rank)];
    DType d = op.dtype;
    if (op.rank == OperandRank::kWrappedNumber) {
      // Python scalars: bool, int64 or the default float dtype.
      d = is_floating(d) ? DType::kFloat32 : is_integral(d, false) ? DType::kInt64 : DType::kBool;
    }
    slot = slot ? promote_types(*slot, d) : d;
  }
  std::optional<DType> result;
  for (int r = 2; r >= 0; --r) {
    if (!per_rank[r]) continue;
    if (!result) {
      result = per_rank[r];
    } else if (category(*per_rank[r]) > category(*result)) {
      result = per_rank[r];
    }
  }
  return *result;
}

}  // namespace fusion_jit
