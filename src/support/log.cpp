#include "support/log.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace fusion_jit {

void log_message(LogLevel level, const std::string& msg) {
  if (Options::get().log_level < level) return;
  static const char* names[] = {"error", "warning", "info", "debug"};
  std::fprintf(stderr, "fusion_jit %s: %s\n", names[static_cast<int>(level)], msg.c_str());
}

bool warn_once(const std::string& key, const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> g(mu);
    if (!seen.insert(key).second) return false;
  }
  log_message(LogLevel::kWarn, msg);
  return true;
}

}  // namespace fusion_jit
