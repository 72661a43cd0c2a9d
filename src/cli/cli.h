// fusion-jit, the command line tool: what its subcommands share. main.cpp declares every subcommand and
// option (CLI11: `fusion-jit SUBCOMMAND --help` shows them); each subcommand lives in its own file.
//
// Exit codes: 0 success, 1 a --check mismatch or a bad cache entry, 2 bad input (one line on stderr, no
// stack trace), 3 an internal error.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

namespace fusion_jit {
struct ExecutablePlan;
class CompiledModule;
}
namespace torch::jit {
struct Module;
}

namespace fusion_jit::cli {

// A rejected input: main prints "fusion-jit: MESSAGE" and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void usage_error(const std::string& msg);

// `v` as an integer in [lo, hi]; a usage error naming `flag` and the value otherwise.
int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo,
                  int64_t hi = std::numeric_limits<int64_t>::max());
std::string first_line(std::string s);
// Makes the directory `dir` for `flag`'s output where it is missing; one that appears meanwhile (another
// process making the same directory: two fuzz runs started at once) is taken. A usage error naming the
// flag, the path and why where it cannot be made or is not a directory.
void make_output_dir(const std::string& flag, const std::string& dir);

// run, explain and compile (model.cpp).
struct ModelArgs {
  std::string command;  // "run", "explain" or "compile"
  std::string model;
  std::vector<std::string> specs;
  std::string inputs_file, save_outputs, device = "cpu", arch = "sm_90", out_dir;
  std::string seed = "0", bench, profile, calls;  // checked by run_model
  bool check = false, json = false, dump_source = false, measure_decisions = false;
};
int run_model(const ModelArgs& a);

// explain --json and run --profile (profile.cpp). The plan's steps with their predicted times as one JSON
// object (`fallback`: why the inputs run eagerly, where `plan` is null).
std::string explain_json(const std::string& model, const fusion_jit::ExecutablePlan* plan, const std::string& fallback);
// Runs `call` `calls` times with step recording on, and reports each step of `plan` (the plan `call`
// runs): its prediction beside its median, and the errors; a JSON object's text, or a table.
std::string profile_report(const fusion_jit::ExecutablePlan& plan, int calls, const std::function<void()>& call,
                           bool json);

// explain --measure-decisions (profile.cpp): each fusion the fuser accepted for `fused`'s plan of `inputs`,
// built the other way (CompileOptions::refuse_fusion_decision) and both timed over `calls` interleaved
// calls, with the time model's predictions of both; a table and a summary line, or one JSON object.
int measure_decisions(const std::string& model, const torch::jit::Module& module, fusion_jit::CompiledModule& fused,
                      const std::vector<c10::IValue>& inputs, int calls, bool json);

// What model.cpp's commands and package.cpp's share. An input SPEC as a tensor (input `index`, for errors);
// the inputs of a file torch.save wrote; tensors written with torch.save's format, whole or not at all;
// the tensors of a result (a tensor, tuple or list, nested).
at::Tensor make_input(const std::string& spec, size_t index);
std::vector<c10::IValue> load_inputs(const std::string& path);
void save_tensors(const std::string& what, const std::string& path, const std::vector<at::Tensor>& tensors);
std::vector<at::Tensor> flatten_tensors(const c10::IValue& v);

// package and load (package.cpp).
struct PackageArgs {
  std::string command;  // "package" or "load"
  std::string path;     // MODEL.pt (package) or the package (load)
  std::vector<std::string> specs, signatures;
  std::string inputs_file, out, cpu_variants, seed = "0", save_outputs, bench, device = "cpu", arch;
  bool explain = false;
};
int run_package(const PackageArgs& a);

// cache stats | ls | verify | clear | prune (cache.cpp).
int run_cache(const std::string& command, const std::string& max_size);
// fusion-jit calibrate: progress on stderr, the table on stdout (cache.cpp).
int run_calibrate();

// fuzz (fuzz.cpp): the options as given, checked there.
struct FuzzArgs {
  std::string program;  // argv[0], for the repro files' command lines
  std::string graphs, minutes, seed, batch, out, nvrtc, graph_seeds, device;
  bool second_size = false;
};
int run_fuzz(const FuzzArgs& a);

}  // namespace fusion_jit::cli
