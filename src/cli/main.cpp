// fusion-jit: run, check, time, explain and compile TorchScript models through fusion_jit; manage the
// kernel cache; run the differential fuzzer. The subcommands and their options are declared here with
// CLI11 (`fusion-jit SUBCOMMAND --help`); each subcommand's work is in its own file (cli.h).
//
//   fusion-jit run MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu|cuda[:N]] [--seed N] [--check]
//                  [--bench N] [--profile N] [--json] [--save-outputs FILE]
//   fusion-jit explain MODEL.pt (--input SPEC ... | --inputs FILE) [--device cpu|cuda[:N]] [--dump-source] [--json]
//                      [--measure-decisions [--calls N]]
//   fusion-jit compile MODEL.pt (--input SPEC ... | --inputs FILE) --device cuda [--arch sm_90] --out DIR
//   fusion-jit package MODEL.pt (--input SPEC ... | --inputs FILE) [--signature "SPEC ..."]...
//                      [--device cpu|cuda] [--arch sm_80,sm_90] [--cpu-variants LIST] --out FILE
//   fusion-jit load PACKAGE [--input SPEC ... | --inputs FILE] [--bench N] [--save-outputs FILE] [--explain]
//   fusion-jit fuzz [--graphs N] [--minutes M] [--seed S] [--batch B] [--out DIR] [--device cpu|cuda]
//                   [--nvrtc ARCH] [--graph-seeds S1,S2,...] [--second-size]
//   fusion-jit cache stats | ls | verify | clear | prune [--max-size SIZE]
//
// Values are taken as text by CLI11 and checked by the subcommands, so that every rejected input gets one
// line naming it and exit code 2 (cli.h).
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli/cli.h"
#include "fusion_jit/error.h"
#include "support/parse.h"

namespace fusion_jit::cli {

void usage_error(const std::string& msg) { throw UsageError(msg); }

void make_output_dir(const std::string& flag, const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    usage_error(flag + " " + dir + ": cannot create (" + std::strerror(errno) + ")");
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) usage_error(flag + " " + dir + ": not a directory");
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  int64_t x = 0;
  ParseStatus st = parse_int64(v, &x);
  if (st == ParseStatus::kMalformed || (st == ParseStatus::kOk && x < lo))
    usage_error(flag + " expects an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  if (st == ParseStatus::kOutOfRange || x > hi)
    usage_error(flag + " " + v + ": too large (at most " + std::to_string(hi) + ")");
  return x;
}

std::string first_line(std::string s) {
  s.erase(0, s.find_first_not_of("\n \t"));
  auto p = s.find('\n');
  return p == std::string::npos ? s : s.substr(0, p);
}

namespace {

const char* kSpecHelp =
    "SPEC: DTYPE[SIZES] with optional {STRIDES}, e.g. f32[64,1024], bf16[8,3,32,32], i64[16], b8[4,4],\n"
    "      f32[1024,64]{1,1024}. DTYPE: f32 f64 f16 bf16 i8 i16 i32 i64 u8 b8. Inputs are random (--seed).\n"
    "FILE: a tensor or a list of tensors written by torch.save.\n"
    "Exit codes: 0 success, 1 a --check mismatch, 2 a rejected input (one line on stderr).";

const char* kCommands = "run, explain, compile, package, load, fuzz, cache or calibrate";
const char* kCacheCommands = "stats, ls, verify, clear, prune, push or pull";

// What CLI11 leaves over (extras are allowed, to be reported in our words): an unknown option or an
// argument too many.
void reject_extras(const CLI::App& sub, const std::string& name) {
  for (const std::string& r : sub.remaining()) {
    if (r.rfind("-", 0) == 0 && r.size() > 1) usage_error("unknown option " + r + " for " + name);
    usage_error("unexpected argument '" + r + "'");
  }
}

// The options run, explain and compile share.
void add_model_options(CLI::App* sub, ModelArgs& a) {
  sub->add_option("MODEL", a.model, "the TorchScript model (torch.jit.save)");
  sub->add_option("--input", a.specs, "the inputs, one SPEC each, in order")->type_name("SPEC");
  sub->add_option("--inputs", a.inputs_file, "the inputs, from a file written by torch.save")->type_name("FILE");
  sub->add_option("--seed", a.seed, "seed of the random inputs (default 0)")->type_name("N");
  sub->footer(kSpecHelp);
  sub->allow_extras();
}

int dispatch(int argc, char** argv) {
  ModelArgs model;
  FuzzArgs fuzz;
  std::string cache_max_size;

  CLI::App app("fusion-jit: run, explain and compile TorchScript models with fusion_jit, manage its kernel "
               "cache, fuzz it against eager PyTorch",
               "fusion-jit");
  app.require_subcommand(1);
  app.footer("`fusion-jit SUBCOMMAND --help` describes each subcommand.");

  CLI::App* run = app.add_subcommand("run", "run a model fused; optionally check it against eager and time both");
  add_model_options(run, model);
  run->add_option("--device", model.device, "cpu (default), cuda or cuda:N")->type_name("DEVICE");
  run->add_flag("--check", model.check, "compare every output (and input) with eager's, by the tolerance rule");
  run->add_option("--bench", model.bench, "time N calls of each, eager and fused in turn (medians)")->type_name("N");
  run->add_flag("--json", model.json, "print one JSON object instead of text");
  run->add_option("--profile", model.profile,
                  "time each step of the plan over N more calls: its median beside the time model's prediction "
                  "(the names of explain --json), and the prediction errors (CPU)")
      ->type_name("N");
  run->add_option("--save-outputs", model.save_outputs, "write the fused outputs with torch.save's format")
      ->type_name("FILE");

  CLI::App* explain = app.add_subcommand("explain", "print the plan: groups, ops and the reason of every fusion decision");
  add_model_options(explain, model);
  explain->add_option("--device", model.device, "cpu (default), cuda or cuda:N")->type_name("DEVICE");
  explain->add_flag("--dump-source", model.dump_source, "print the generated source too");
  explain->add_flag("--json", model.json,
                    "print one JSON object instead: each step that runs (kernels and ATen steps, by name) with its "
                    "predicted time");
  explain->add_flag("--measure-decisions", model.measure_decisions,
                    "build each fusion the fuser accepted the other way too, time both, and report per decision "
                    "the predicted and measured times of both and how many agree (CPU)");
  explain->add_option("--calls", model.calls, "with --measure-decisions: calls of each plan timed (default 20)")
      ->type_name("N");

  CLI::App* compile = app.add_subcommand(
      "compile", "compile a model's CUDA kernels ahead of time with NVRTC (no GPU needed): writes DIR/plan.cu, "
                 "DIR/plan.cubin (or plan.ptx for compute_XY), DIR/kernels.json, DIR/explain.txt");
  add_model_options(compile, model);
  compile->add_option("--device", model.device, "cuda (required)")->type_name("DEVICE");
  compile->add_option("--arch", model.arch, "the GPU architecture: sm_XY or compute_XY (default sm_90)")
      ->type_name("ARCH");
  compile->add_option("--out", model.out_dir, "the output directory (created if missing)")->type_name("DIR");

  PackageArgs pkg;
  CLI::App* package = app.add_subcommand(
      "package", "build an ahead-of-time package: the plans of the given signatures, their compiled code and the "
                 "weights in one file that `load` (or fusion_jit::load_package) runs with no compiler");
  package->add_option("MODEL", pkg.path, "the TorchScript model (torch.jit.save)");
  package->add_option("--input", pkg.specs, "one signature's inputs, one SPEC each, in order")->type_name("SPEC");
  package->add_option("--inputs", pkg.inputs_file, "one signature's inputs, from a file written by torch.save")
      ->type_name("FILE");
  package->add_option("--signature", pkg.signatures, "one more signature: its SPECs in one argument, space-separated")
      ->type_name("\"SPEC ...\"");
  package->add_option("--cpu-variants", pkg.cpu_variants,
                      "the CPU code's compiled variants, most specific first (default native,x86-64-v2; each "
                      "native or an x86-64 level: x86-64, x86-64-v2, x86-64-v3, x86-64-v4)")
      ->type_name("LIST");
  package->add_option("--device", pkg.device,
                      "where the plans run: cpu (default) or cuda (cuda:0; built here from the CPU inputs, no GPU "
                      "needed)")
      ->type_name("DEVICE");
  package->add_option("--arch", pkg.arch,
                      "for --device cuda: the GPU architectures to compile CUBINs for (default sm_80,sm_90); PTX "
                      "for the newest is added unless a compute_XY is listed")
      ->type_name("LIST");
  package->add_option("--out", pkg.out, "the package file to write")->type_name("FILE");
  package->add_option("--seed", pkg.seed, "seed of the random inputs (default 0)")->type_name("N");
  package->footer(kSpecHelp);
  package->allow_extras();

  CLI::App* load = app.add_subcommand("load", "load a package (no capture, no compiler) and run it on the inputs");
  load->add_option("PACKAGE", pkg.path, "the package (fusion-jit package)");
  load->add_option("--input", pkg.specs, "the inputs, one SPEC each, in order")->type_name("SPEC");
  load->add_option("--inputs", pkg.inputs_file, "the inputs, from a file written by torch.save")->type_name("FILE");
  load->add_option("--seed", pkg.seed, "seed of the random inputs (default 0)")->type_name("N");
  load->add_option("--bench", pkg.bench, "time N more calls (median)")->type_name("N");
  load->add_option("--save-outputs", pkg.save_outputs, "write the outputs with torch.save's format")->type_name("FILE");
  load->add_flag("--explain", pkg.explain, "print the manifest, the code variants loaded and each signature's plan");
  load->footer(kSpecHelp);
  load->allow_extras();

  CLI::App* fz = app.add_subcommand("fuzz", "a differential fuzzing campaign: random graphs, fused vs eager");
  fz->add_option("--graphs", fuzz.graphs, "graphs to check (default 2000, or no limit with --minutes)")->type_name("N");
  fz->add_option("--minutes", fuzz.minutes, "stop after M minutes")->type_name("M");
  fz->add_option("--seed", fuzz.seed, "the campaign's seed (default 1)")->type_name("S");
  fz->add_option("--batch", fuzz.batch, "graphs checked together in one plan (default 16)")->type_name("B");
  fz->add_option("--out", fuzz.out, "where repros of failures go (default fuzz-repros)")->type_name("DIR");
  fz->add_option("--device", fuzz.device, "cpu (default) or cuda")->type_name("DEVICE");
  fz->add_option("--nvrtc", fuzz.nvrtc, "also compile each batch's CUDA kernels with NVRTC for ARCH")
      ->type_name("ARCH");
  fz->add_option("--graph-seeds", fuzz.graph_seeds, "check only these graphs (as failures name them)")
      ->type_name("S1,S2,...");
  fz->add_flag("--second-size", fuzz.second_size,
               "also run each batch at other extents, through one plan of its shape class built once and "
               "instantiated at both sizes (graphs it does not cover: with a plan of their own)");
  fz->allow_extras();

  CLI::App* cache = app.add_subcommand("cache", "the on-disk cache of compiled kernels and plans");
  cache->require_subcommand(1);
  cache->add_subcommand("stats", "the directory, its entries and size, and whether it is used")->allow_extras();
  cache->add_subcommand("ls", "each entry: key, bytes, age")->allow_extras();
  cache->add_subcommand("verify", "read and check every entry; exit 1 when one is bad")->allow_extras();
  cache->add_subcommand("clear", "remove every entry")->allow_extras();
  cache->add_subcommand("push", "upload every entry to the remote tier (FUSION_JIT_REMOTE_CACHE): a fleet's cache "
                                "warmed from a build machine")->allow_extras();
  CLI::App* pull = cache->add_subcommand(
      "pull", "fetch what one model needs for these inputs (its plan and kernels) from the remote tier into the "
              "local cache; compiles nothing");
  add_model_options(pull, model);
  CLI::App* prune = cache->add_subcommand("prune", "remove the least recently used entries down to a size");
  prune->add_option("--max-size", cache_max_size, "the size to keep, such as 512M or 2G (default: the cap)")
      ->type_name("SIZE");
  prune->allow_extras();

  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "measure this machine's constants for the cost model (memory bandwidth by working set, kernel "
                   "and ATen step dispatch, op classes; about 5 to 15 s) and keep them in the cache, where every "
                   "process on this machine uses them; `cache stats` shows them");

  // Unknown subcommands in our words (CLI11 would call them extra arguments).
  auto known = [](const std::string& s, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (s == n) return true;
    return false;
  };
  if (argc < 2) usage_error(std::string("missing command (") + kCommands + ")");
  const std::string command = argv[1];
  if (command.rfind("-", 0) != 0 && !known(command, {"run", "explain", "compile", "package", "load", "fuzz", "cache", "calibrate"}))
    usage_error("unknown command '" + command + "' (" + kCommands + ")");
  if (command == "cache") {
    if (argc < 3) usage_error(std::string("cache: missing command (") + kCacheCommands + ")");
    const std::string sub = argv[2];
    if (sub.rfind("-", 0) != 0 && !known(sub, {"stats", "ls", "verify", "clear", "prune", "push", "pull"}))
      usage_error("cache: unknown command '" + sub + "' (" + kCacheCommands + ")");
    // pull compiles nothing: set before any option is read (the first use of the cache reads them).
    if (sub == "pull") ::setenv("FUSION_JIT_ASSERT_NO_COMPILE", "1", 1);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    usage_error(first_line(e.what()));
  }

  if (run->parsed() || explain->parsed() || compile->parsed() || pull->parsed()) {
    CLI::App* sub = run->parsed() ? run : explain->parsed() ? explain : compile->parsed() ? compile : pull;
    model.command = sub->get_name();
    reject_extras(*sub, model.command);
    return run_model(model);
  }
  if (package->parsed() || load->parsed()) {
    CLI::App* sub = package->parsed() ? package : load;
    pkg.command = sub->get_name();
    reject_extras(*sub, pkg.command);
    return run_package(pkg);
  }
  if (fz->parsed()) {
    reject_extras(*fz, "fuzz");
    fuzz.program = argv[0];
    return run_fuzz(fuzz);
  }
  if (calibrate->parsed()) {
    reject_extras(*calibrate, "calibrate");
    return run_calibrate();
  }
  for (CLI::App* sub : cache->get_subcommands()) {
    for (const std::string& r : sub->remaining())
      usage_error("cache " + sub->get_name() + ": unexpected argument '" + r + "'");
    return run_cache(sub->get_name(), cache_max_size);
  }
  usage_error(std::string("missing command (") + kCommands + ")");
}

}  // namespace
}  // namespace fusion_jit::cli

int main(int argc, char** argv) {
  namespace cli = fusion_jit::cli;
  try {
    return cli::dispatch(argc, argv);
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "fusion-jit: %s\n", e.what());
    return 2;
  } catch (const fusion_jit::InternalError& e) {
    std::fprintf(stderr, "fusion-jit: internal error: %s\n", cli::first_line(e.what()).c_str());
    return 3;
  } catch (const fusion_jit::Error& e) {
    std::fprintf(stderr, "fusion-jit: %s\n", cli::first_line(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-jit: internal error: %s\n", cli::first_line(e.what()).c_str());
    return 3;
  }
}
