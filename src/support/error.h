// Errors of fusion_jit.
//
// FJ_CHECK(cond, fmt, args...)         the user's mistake: throws fusion_jit::Error (ValueError in Python)
// FJ_TYPE_CHECK(cond, fmt, args...)    a wrong type or dtype from the user: fusion_jit::TypeError
// FJ_INTERNAL_ASSERT(cond, fmt, ...)   our bug: throws fusion_jit::InternalError
// Every message names what it is about: the op, the input index, the shape, the file.
#pragma once

#include <fmt/format.h>

#include <string>

#include "fusion_jit/error.h"  // Error, TypeError, InternalError: part of the public API

namespace fusion_jit {

namespace detail {
[[noreturn]] void throw_error(const std::string& msg);
[[noreturn]] void throw_type_error(const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace fusion_jit

#define FJ_CHECK(cond, ...)                                                  \
  do {                                                                       \
    if (!(cond)) ::fusion_jit::detail::throw_error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define FJ_TYPE_CHECK(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) ::fusion_jit::detail::throw_type_error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define FJ_INTERNAL_ASSERT(cond, ...)                                                              \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::fusion_jit::detail::throw_internal(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)
