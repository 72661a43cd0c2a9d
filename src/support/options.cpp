#include "support/options.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>
#include <vector>

#include "support/error.h"
#include "support/parse.h"

extern char** environ;

namespace fusion_jit {
namespace {

std::set<std::string> split_list(const std::string& v) {
  std::set<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(',', start);
    if (end == std::string::npos) end = v.size();
    std::string item = v.substr(start, end - start);
    if (!item.empty()) out.insert(item);
    start = end + 1;
  }
  return out;
}

bool parse_bool(const std::string& name, const std::string& v) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no" || v.empty()) return false;
  FJ_CHECK(false, "{}={}: expected 0 or 1", name, v);
  return false;
}

// An integer from lo to hi; a value out of that range (or out of int64_t's) is an error naming it.
int64_t parse_int(const std::string& name, const std::string& v, int64_t lo,
                  int64_t hi = std::numeric_limits<int64_t>::max(), const char* unit = "") {
  int64_t x = 0;
  ParseStatus st = parse_int64(v, &x);
  FJ_CHECK(st != ParseStatus::kMalformed, "{}={}: expected an integer >= {}", name, v, lo);
  FJ_CHECK(st == ParseStatus::kOk && x <= hi, "{}={}: too large (at most {}{})", name, v, hi, unit);
  FJ_CHECK(x >= lo, "{}={}: expected an integer >= {}", name, v, lo);
  return x;
}

// Megabyte counts are used as bytes (MB << 20), which must fit int64_t.
constexpr int64_t kMaxMegabytes = std::numeric_limits<int64_t>::max() >> 20;

void check_members(const std::string& name, const std::set<std::string>& got,
                   const std::set<std::string>& allowed) {
  for (const auto& g : got) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    FJ_CHECK(allowed.count(g), "{}: unknown item '{}' (known: {})", name, g, list);
  }
}

// The names FUSION_JIT_DISABLE accepts besides its own; filled by register_disable_names.
std::set<std::string>& registered_disable_names() {
  static std::set<std::string> names;
  return names;
}
// The names FUSION_JIT_ENABLE accepts; filled by register_enable_names.
std::set<std::string>& registered_enable_names() {
  static std::set<std::string> names;
  return names;
}

}  // namespace

DynamicSizes parse_dynamic_sizes(const std::string& what, const std::string& value) {
  if (value == "auto") return DynamicSizes::kAuto;
  if (value == "on") return DynamicSizes::kOn;
  if (value == "off") return DynamicSizes::kOff;
  FJ_CHECK(false, "{}={}: expected auto, on or off", what, value);
  return DynamicSizes::kAuto;
}

GemmChoice parse_gemm_choice(const std::string& what, const std::string& value) {
  if (value == "measure") return GemmChoice::kMeasure;
  if (value == "aten") return GemmChoice::kAten;
  if (value == "onednn") return GemmChoice::kOneDnn;
  FJ_CHECK(false, "{}={}: expected measure, aten or onednn", what, value);
  return GemmChoice::kMeasure;
}

namespace {

// One variable: `set` parses its value into Options (an error names the variable), `show` writes the
// field back as text (Options::value). `show` is null for the variables the library only accepts: those
// read before it loads (./run's, FUSION_JIT_LIBRARY).
struct Entry {
  const char* name;
  std::function<void(Options&, const std::string&)> set;
  std::function<std::string(const Options&)> show;
};

std::string show_list(const std::set<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

std::string show_bool(bool b) { return b ? "1" : "0"; }

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {"FUSION_JIT_LOG_LEVEL",
       [](Options& o, const std::string& v) {
         if (v == "error") o.log_level = LogLevel::kError;
         else if (v == "warn") o.log_level = LogLevel::kWarn;
         else if (v == "info") o.log_level = LogLevel::kInfo;
         else if (v == "debug") o.log_level = LogLevel::kDebug;
         else FJ_CHECK(false, "FUSION_JIT_LOG_LEVEL={}: expected error, warn, info or debug", v);
       },
       [](const Options& o) -> std::string {
         static const char* const names[] = {"error", "warn", "info", "debug"};
         return names[static_cast<int>(o.log_level)];
       }},
      {"FUSION_JIT_DUMP",
       [](Options& o, const std::string& v) {
         o.dump = split_list(v);
         check_members("FUSION_JIT_DUMP", o.dump, {"ir", "plan", "source", "log", "all"});
       },
       [](const Options& o) { return show_list(o.dump); }},
      {"FUSION_JIT_DISABLE",
       [](Options& o, const std::string& v) {
         o.disabled = split_list(v);
         check_members("FUSION_JIT_DISABLE", o.disabled, Options::disable_names());
       },
       [](const Options& o) { return show_list(o.disabled); }},
      {"FUSION_JIT_ENABLE",
       [](Options& o, const std::string& v) {
         o.enabled = split_list(v);
         check_members("FUSION_JIT_ENABLE", o.enabled, Options::enable_names());
       },
       [](const Options& o) { return show_list(o.enabled); }},
      {"FUSION_JIT_SPECIALIZATION_LIMIT",
       [](Options& o, const std::string& v) {
         o.specialization_limit = static_cast<int>(
             parse_int("FUSION_JIT_SPECIALIZATION_LIMIT", v, 0, std::numeric_limits<int>::max()));
       },
       [](const Options& o) { return std::to_string(o.specialization_limit); }},
      {"FUSION_JIT_SHARED_PLANS",
       [](Options& o, const std::string& v) {
         o.shared_plans = static_cast<int>(parse_int("FUSION_JIT_SHARED_PLANS", v, 1, std::numeric_limits<int>::max()));
       },
       [](const Options& o) { return std::to_string(o.shared_plans); }},
      {"FUSION_JIT_DYNAMIC",
       [](Options& o, const std::string& v) { o.dynamic = parse_dynamic_sizes("FUSION_JIT_DYNAMIC", v); },
       [](const Options& o) -> std::string {
         return o.dynamic == DynamicSizes::kOn ? "on" : o.dynamic == DynamicSizes::kOff ? "off" : "auto";
       }},
      {"FUSION_JIT_GEMM", [](Options& o, const std::string& v) { o.gemm = parse_gemm_choice("FUSION_JIT_GEMM", v); },
       [](const Options& o) -> std::string {
         return o.gemm == GemmChoice::kAten ? "aten" : o.gemm == GemmChoice::kOneDnn ? "onednn" : "measure";
       }},
      {"FUSION_JIT_CACHE_DIR", [](Options& o, const std::string& v) { o.cache_dir = v; },
       [](const Options& o) { return o.cache_dir; }},
      {"FUSION_JIT_CACHE_MAX_MB",
       [](Options& o, const std::string& v) {
         o.cache_max_mb = parse_int("FUSION_JIT_CACHE_MAX_MB", v, 1, kMaxMegabytes, " MB");
       },
       [](const Options& o) { return std::to_string(o.cache_max_mb); }},
      {"FUSION_JIT_REMOTE_CACHE",
       [](Options& o, const std::string& v) { o.remote_cache = parse_remote_cache_url("FUSION_JIT_REMOTE_CACHE", v); },
       [](const Options& o) { return o.remote_cache.text; }},
      {"FUSION_JIT_REMOTE_CACHE_KEY_FILE", [](Options& o, const std::string& v) { o.remote_cache_key_file = v; },
       [](const Options& o) { return o.remote_cache_key_file; }},
      {"FUSION_JIT_REMOTE_CACHE_TTL",
       [](Options& o, const std::string& v) {
         o.remote_cache_ttl = parse_int("FUSION_JIT_REMOTE_CACHE_TTL", v, 0, std::numeric_limits<int32_t>::max(), " s");
       },
       [](const Options& o) { return std::to_string(o.remote_cache_ttl); }},
      {"FUSION_JIT_REMOTE_CACHE_TIMEOUT_MS",
       [](Options& o, const std::string& v) {
         o.remote_cache_timeout_ms = static_cast<int>(parse_int("FUSION_JIT_REMOTE_CACHE_TIMEOUT_MS", v, 1, 600000, " ms"));
       },
       [](const Options& o) { return std::to_string(o.remote_cache_timeout_ms); }},
      {"FUSION_JIT_REMOTE_CACHE_MAX_MB",
       [](Options& o, const std::string& v) {
         o.remote_cache_max_mb = parse_int("FUSION_JIT_REMOTE_CACHE_MAX_MB", v, 1, 512, " MB");
       },
       [](const Options& o) { return std::to_string(o.remote_cache_max_mb); }},
      {"FUSION_JIT_PACKAGE_KEY", [](Options& o, const std::string& v) { o.package_key_file = v; },
       [](const Options& o) { return o.package_key_file; }},
      {"FUSION_JIT_CXX", [](Options& o, const std::string& v) { o.cxx = v; }, [](const Options& o) { return o.cxx; }},
      {"FUSION_JIT_COMPILE_JOBS",
       [](Options& o, const std::string& v) {
         o.compile_jobs = static_cast<int>(parse_int("FUSION_JIT_COMPILE_JOBS", v, 0, 256));
       },
       [](const Options& o) { return std::to_string(o.compile_jobs); }},
      {"FUSION_JIT_ASSERT_NO_COMPILE",
       [](Options& o, const std::string& v) {
         o.assert_no_compile = parse_bool("FUSION_JIT_ASSERT_NO_COMPILE", v);
       },
       [](const Options& o) { return show_bool(o.assert_no_compile); }},
      {"FUSION_JIT_CUDA_HOME", [](Options& o, const std::string& v) { o.cuda_home = v; },
       [](const Options& o) { return o.cuda_home; }},
      {"FUSION_JIT_CUDA_GRAPHS",
       [](Options& o, const std::string& v) { o.cuda_graphs = parse_bool("FUSION_JIT_CUDA_GRAPHS", v); },
       [](const Options& o) { return show_bool(o.cuda_graphs); }},
      {"FUSION_JIT_CPU_GRAIN",
       [](Options& o, const std::string& v) { o.cpu_grain = parse_int("FUSION_JIT_CPU_GRAIN", v, 1); },
       [](const Options& o) { return std::to_string(o.cpu_grain); }},
      {"FUSION_JIT_CPU_POOL_MB",
       [](Options& o, const std::string& v) {
         o.cpu_pool_mb = parse_int("FUSION_JIT_CPU_POOL_MB", v, 0, kMaxMegabytes, " MB");
       },
       [](const Options& o) { return std::to_string(o.cpu_pool_mb); }},
      // Read by the Python package (python/fusion_jit) through Options::value.
      {"FUSION_JIT_STRICT", [](Options& o, const std::string& v) { o.strict = parse_bool("FUSION_JIT_STRICT", v); },
       [](const Options& o) { return show_bool(o.strict); }},
      {"FUSION_JIT_FREEZING",
       [](Options& o, const std::string& v) { o.freezing = parse_bool("FUSION_JIT_FREEZING", v); },
       [](const Options& o) { return show_bool(o.freezing); }},
      // Read by the Python package before it loads the library (python/fusion_jit/_native.py).
      {"FUSION_JIT_LIBRARY", [](Options&, const std::string&) {}, nullptr},
      // Read by ./run, not by the library; listed so that they are not rejected as unknown.
      {"FUSION_JIT_VENV", [](Options&, const std::string&) {}, nullptr},
      {"FUSION_JIT_BUILD_JOBS", [](Options&, const std::string&) {}, nullptr},
      {"FUSION_JIT_TEST_JOBS", [](Options&, const std::string&) {}, nullptr},
  };
  return t;
}

// The entry of `name`; an unknown name is an error that lists the known ones.
const Entry& entry(const std::string& name) {
  for (const auto& e : table())
    if (name == e.name) return e;
  std::string names;
  for (const auto& e : table()) names += (names.empty() ? "" : ", ") + std::string(e.name);
  FJ_CHECK(false, "unknown environment variable {} (known: {})", name, names);
  return table().front();
}

// The FUSION_JIT_* variables of `envp` in order, as (name, value); "NAME" alone has the value "".
template <typename F>
void each_variable(const char* const* envp, F&& f) {
  for (; envp && *envp; ++envp) {
    std::string_view kv(*envp);
    if (kv.rfind("FUSION_JIT_", 0) != 0) continue;
    size_t eq = kv.find('=');
    f(std::string(kv.substr(0, eq)), std::string(eq == std::string_view::npos ? "" : kv.substr(eq + 1)));
  }
}

// The defaults that come from outside the table: the host compiler is $CXX unless FUSION_JIT_CXX names
// one, and g++ where neither gives one.
Options initial_options() {
  Options o;
  if (const char* cxx = std::getenv("CXX")) o.cxx = cxx;
  return o;
}
void finish_options(Options& o) {
  if (o.cxx.empty()) o.cxx = "g++";
}

}  // namespace

RemoteCacheUrl parse_remote_cache_url(const std::string& what, const std::string& value) {
  RemoteCacheUrl u;
  u.text = value;
  if (value.empty()) return u;
  // The value as shown in errors, its secrets hidden. Whatever precedes the last '@' may be a password
  // (redis://PASSWORD@host as well as redis://user:PASSWORD@host, and any misspelling of either:
  // "redis:/pw@h", "http://pw@h"), so all of it after the scheme is hidden but a user name (what precedes
  // a ':'); so is a password=... parameter (redis-py's unix://...?db=0&password=pw). Those secrets are
  // hidden wherever else they appear, in the value and in the parts of it an error quotes (a port, a
  // database number): a mistake may put them anywhere.
  std::vector<std::string> secrets;
  std::string shown = value;
  const size_t at = value.rfind('@');
  if (at != std::string::npos) {
    const size_t scheme_end = value.find("://");
    const size_t from = scheme_end != std::string::npos && scheme_end < at ? scheme_end + 3 : 0;
    const size_t colon = value.find(':', from);
    const size_t keep = colon != std::string::npos && colon < at ? colon + 1 : from;
    secrets.push_back(value.substr(keep, at - keep));
    shown = value.substr(0, keep) + "***" + value.substr(at);
  }
  for (size_t p = shown.find("password="); p != std::string::npos; p = shown.find("password=", p + 1)) {
    const size_t from = p + 9, end = std::min(shown.find('&', from), shown.size());
    secrets.push_back(shown.substr(from, end - from));
    shown.replace(from, end - from, "***");
  }
  auto hide = [&](std::string text) {
    for (const std::string& s : secrets)
      for (size_t p = s.empty() ? std::string::npos : text.find(s); p != std::string::npos; p = text.find(s, p + 3))
        text.replace(p, s.size(), "***");
    return text;
  };
  shown = hide(shown);  // the password typed again where the host or port goes
  auto bad = [&](const std::string& why) {
    FJ_CHECK(false, "{}={}: {} (expected redis://[user:password@]host[:port][/db] or unix:///path/to.sock[?db=N])",
             what, shown, hide(why));
  };
  auto parse_db = [&](const std::string& d) {
    int64_t db = -1;
    if (d.empty() || parse_int64(d, &db) != ParseStatus::kOk || db < 0 || db > 1000000) bad("bad database number '" + d + "'");
    u.db = static_cast<int>(db);
  };
  if (value.rfind("unix://", 0) == 0) {
    u.unix_socket = true;
    std::string rest = value.substr(7);
    const size_t q = rest.find('?');
    if (q != std::string::npos) {
      if (rest.compare(q + 1, 3, "db=") != 0) bad("unknown parameter '" + rest.substr(q + 1) + "'");
      parse_db(rest.substr(q + 4));
      rest = rest.substr(0, q);
    }
    if (rest.empty() || rest[0] != '/') bad("the socket path must be absolute");
    u.host = rest;
    return u;
  }
  if (value.rfind("redis://", 0) != 0) bad("unknown scheme");
  std::string rest = value.substr(8);
  const size_t cred = rest.rfind('@');
  if (cred != std::string::npos) {
    const std::string userinfo = rest.substr(0, cred);
    rest = rest.substr(cred + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string::npos) {
      u.password = userinfo;  // redis://password@host, as redis-cli -u takes it
    } else {
      u.user = userinfo.substr(0, colon);
      u.password = userinfo.substr(colon + 1);
    }
  }
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    parse_db(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
  }
  if (!rest.empty() && rest[0] == '[') bad("IPv6 addresses are not supported; use a host name");
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    int64_t port = -1;
    const std::string p = rest.substr(colon + 1);
    if (parse_int64(p, &port) != ParseStatus::kOk || port < 1 || port > 65535) bad("bad port '" + p + "'");
    u.port = static_cast<int>(port);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) bad("no host");
  u.host = rest;
  return u;
}

Options Options::parse(const char* const* envp) {
  Options o = initial_options();
  each_variable(envp, [&](const std::string& name, const std::string& value) { entry(name).set(o, value); });
  finish_options(o);
  return o;
}

std::string Options::value(const std::string& name, const char* const* envp) {
  const Entry& e = entry(name);
  FJ_CHECK(e.show != nullptr, "{} is read before the library loads (by ./run or the Python package), not "
           "through the option table", name);
  Options o = initial_options();
  each_variable(envp, [&](const std::string& n, const std::string& v) {
    if (n == name) e.set(o, v);
  });
  finish_options(o);
  return e.show(o);
}

void Options::register_disable_names(const std::vector<std::string>& names) {
  registered_disable_names().insert(names.begin(), names.end());
}

std::set<std::string> Options::disable_names() {
  std::set<std::string> names = registered_disable_names();
  names.insert({"fusion", "horizontal", "cat", "gather", "arena", "in_place", "cache", "calibration"});
  return names;
}

void Options::register_enable_names(const std::vector<std::string>& names) {
  registered_enable_names().insert(names.begin(), names.end());
}

std::set<std::string> Options::enable_names() { return registered_enable_names(); }

const Options& Options::get() {
  static const Options o = parse(environ);
  return o;
}

}  // namespace fusion_jit
