#include "support/error.h"

namespace fusion_jit::detail {

void throw_error(const std::string& msg) { throw Error(msg); }
void throw_type_error(const std::string& msg) { throw TypeError(msg); }
void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format("fusion_jit internal error at {}:{}: {} failed{}{}", file, line, cond,
                                  msg.empty() ? "" : ": ", msg));
}

}  // namespace fusion_jit::detail
