// The plan's JSON form, as the plan cache stores it: everything an ExecutablePlan holds besides its graph
// and its compiled binaries. Kernels are written as what launching and `explain` need of their specs
// (iteration space, buffers as value ids, pass and scratch counts; their code is in the sources), steps as a
// kernel index or a node's position in the graph, and what `explain` shows (the fusion text, group and op
// counts). Reading it back needs the same graph (same value ids, same node order); the generated sources
// come back, the binaries are loaded from them separately.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/plan.h"

namespace fusion_jit {

// How a plan's generated sources are written: inline (null; packages, which are self-contained), or as
// the reference `keep` returns for each, after keeping it elsewhere (the plan cache keeps each source once,
// under its content's key, however many plans share it: Note [Plan sources stored once], plan_cache.cpp).
using KeepSource = std::function<std::string(const std::string& source)>;
// The source a reference names, or nothing (the plan is then refused).
using FindSource = std::function<std::optional<std::string>(const std::string& ref)>;

// The plan as JSON text (one line). Its `format` field changes whenever the layout does.
std::string serialize_plan(const ExecutablePlan& p, const KeepSource& keep = nullptr);
// Fills `p`, whose graph is set, from serialize_plan's text; false when the text is not a plan of this
// format or does not fit the graph (a buffer names a value that is missing, not a tensor, or of another
// dtype or extent; a step names a node or kernel out of range), or names a source by reference that `find`
// (null: none allowed) does not give.
bool deserialize_plan(const std::string& text, ExecutablePlan* p, const FindSource& find = nullptr);

}  // namespace fusion_jit
