// ATen steps' own measured times (Note [Measured step times]): what `fusion-jit run --profile` measured of
// each ATen step, kept in the kernel cache per machine, and read back by the time model in place of its
// estimate for a step it has seen.
//
// Note [Measured step times]
// The time model cannot know what a library call costs beyond its flops and bytes (the algorithm oneDNN
// picks, whether the op wakes the thread pool: bench/RESULTS.md, "Kernel times"). A step measured once is
// known: `run --profile` stores each ATen step's median under its signature (the schema and the types
// of its arguments, literals as printed: nothing of value names or of the plan it ran in), and
// predict_plan prices a step with a stored time by it ("measured" in explain --json). The record is one
// per machine (the calibration's machine), at most kMaxStepTimes signatures, merged on each store (a
// later measurement replaces an earlier one), read as hostile input, and left out with the calibration
// (FUSION_JIT_DISABLE=calibration). Kernels are always the model's: their code changes with every
// decision, which is what the model is for.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace fusion_jit {

inline constexpr size_t kMaxStepTimes = 4096;

// The kernel cache's key of this machine's record.
std::string step_times_key();

// "aten::mm(f32[8,16], f32[16,32])": the schema and its arguments' types or literals.
std::string aten_step_signature(const Node& n);

// The stored medians (microseconds) by signature: empty where there is none, the cache is off, the
// calibration is disabled, or the record fails its checks (then one warning naming why).
std::map<std::string, double> stored_step_times();
// Merges `medians` into the stored record (and into this process's view of it).
void store_step_times(const std::map<std::string, double>& medians);
// Forgets this process's view of the record: the next read loads it again (after the cache moved).
void forget_step_times();

// The record as JSON and back (each signature at most 1,000 characters, each time finite in (0, 1e7) us,
// at most kMaxStepTimes); nullopt with `why` set otherwise.
std::string step_times_to_json(const std::map<std::string, double>& times);
std::optional<std::map<std::string, double>> step_times_from_json(const std::string& text, std::string* why);

}  // namespace fusion_jit
