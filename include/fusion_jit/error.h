// The exceptions fusion_jit throws (public; src/support/error.h adds the checking macros).
//
//   fusion_jit::Error           the caller's mistake (a bad input, option, file or argument); the message
//                               names the thing it is about. Python sees it as ValueError.
//   fusion_jit::TypeError       a wrong type or dtype given by the caller (Python: TypeError)
//   fusion_jit::InternalError   a bug of fusion_jit (an assertion that failed)
// Errors raised inside LibTorch (c10::Error) pass through unchanged.
#pragma once

#include <stdexcept>

namespace fusion_jit {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class TypeError : public Error {
 public:
  using Error::Error;
};
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace fusion_jit
