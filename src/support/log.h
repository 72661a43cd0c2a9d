// Logging to stderr, filtered by FUSION_JIT_LOG_LEVEL. Warnings that must appear once use warn_once.
#pragma once

#include <fmt/format.h>

#include <string>

#include "support/options.h"

namespace fusion_jit {

void log_message(LogLevel level, const std::string& msg);
// Prints msg the first time `key` is seen in this process; returns whether it printed.
bool warn_once(const std::string& key, const std::string& msg);

template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_message(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (Options::get().log_level >= LogLevel::kInfo)
    log_message(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fusion_jit
