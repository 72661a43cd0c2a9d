// Element types of the IR and torch's type promotion.
//
// Promotion follows torch.result_type: operands are ranked as dimensioned tensors > zero-dim tensors >
// wrapped numbers (Python scalars). A lower-ranked operand changes the result only when its category
// (bool < integer < floating) is higher than every higher-ranked operand's; a wrapped float then gives the
// default dtype (float32), a zero-dim tensor its own dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fusion_jit {

enum class DType : uint8_t { kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64, kOther };

// Short names used by the textual IR and the CLI's SPECs: b8 u8 i8 i16 i32 i64 f16 bf16 f32 f64.
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(const std::string& name);
// torch's ScalarType codes (c10::ScalarType) for the dtypes we know; kOther otherwise.
DType dtype_from_torch_code(int code);
int dtype_to_torch_code(DType t);
// C type in generated code for storage of an element.
const char* dtype_c_type(DType t);
size_t dtype_size(DType t);

inline bool is_floating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
inline bool is_integral(DType t, bool include_bool) {
  return (include_bool && t == DType::kBool) || (t >= DType::kUInt8 && t <= DType::kInt64);
}
inline bool is_signed_integer(DType t) { return t >= DType::kInt8 && t <= DType::kInt64; }
// An integer converted to an integer dtype as C++'s static_cast does (two's complement wrap-around), which is
// how eager converts a Python integer operand to a tensor's integer dtype.
int64_t wrap_integer(int64_t v, DType t);
inline bool is_reduced_float(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
// The type arithmetic runs in: float32 for f16/bf16, the type itself otherwise.
inline DType compute_dtype(DType t) { return is_reduced_float(t) ? DType::kFloat32 : t; }

// Two dtypes promoted as torch.promote_types does.
DType promote_types(DType a, DType b);

// One operand of a promotion.
enum class OperandRank { kTensor = 2, kZeroDim = 1, kWrappedNumber = 0 };
struct PromotionOperand {
  DType dtype;
  OperandRank rank;
};
DType result_type(const std::vector<PromotionOperand>& operands);

}  // namespace fusion_jit
