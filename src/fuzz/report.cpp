// Recipes as text (describe), as TorchScript source, and as repro files that the CLI replays.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "fuzz/fuzz_internal.h"
#include "support/error.h"

namespace fusion_jit::fuzz {

std::string Recipe::describe() const {
  std::string s = fmt::format("seed {}; inputs:", seed);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    s += fmt::format(" x{}={}[", i, dtype_name(dtype_from_torch_code(in.dtype)));
    for (size_t d = 0; d < in.sizes.size(); ++d) s += (d ? "," : "") + std::to_string(in.sizes[d]);
    static const char* layouts[] = {"contiguous", "transposed", "sliced", "expanded", "channels_last", "huge_stride"};
    s += fmt::format("] {}{}", layouts[static_cast<int>(in.layout)], in.specials ? "" : " finite");
  }
  s += "\n";
  for (size_t k = 0; k < ops.size(); ++k) {
    s += fmt::format("  v{} = {}(", inputs.size() + k, ops[k].schema);
    for (size_t i = 0; i < ops[k].args.size(); ++i) {
      const auto& a = ops[k].args[i];
      s += (i ? ", " : "") + (a.value >= 0 ? "v" + std::to_string(a.value) : literal_str(a.literal));
    }
    s += ")\n";
  }
  s += "  outputs:";
  for (int o : outputs) s += " v" + std::to_string(o);
  return s + "\n";
}

std::string torchscript_source(const Recipe& r) {
  auto lit = [](const Literal& l) -> std::string {
    if (std::holds_alternative<double>(l)) {
      double d = std::get<double>(l);
      if (std::isnan(d)) return "float('nan')";
      if (std::isinf(d)) return d > 0 ? "float('inf')" : "-float('inf')";
    }
    if (std::holds_alternative<std::string>(l)) return "'" + std::get<std::string>(l) + "'";
    return literal_str(l);
  };
  std::string s = "def forward(self";
  for (size_t i = 0; i < r.inputs.size(); ++i) s += fmt::format(", v{}", i);
  s += "):\n";
  for (size_t k = 0; k < r.ops.size(); ++k) {
    const auto& op = r.ops[k];
    size_t dot = op.schema.find('.');
    std::string name = op.schema.substr(6, dot == std::string::npos ? std::string::npos : dot - 6);
    std::string overload = dot == std::string::npos ? "" : op.schema.substr(dot + 1);
    auto handle = c10::Dispatcher::singleton().findSchema({"aten::" + name, overload});
    FJ_INTERNAL_ASSERT(handle.has_value(), "{}: no schema", op.schema);
    const auto& sargs = handle->schema().arguments();
    auto arg = [&](size_t i) {
      std::string v = op.args[i].value >= 0 ? "v" + std::to_string(op.args[i].value) : lit(op.args[i].literal);
      return i < sargs.size() && sargs[i].kwarg_only() ? sargs[i].name() + "=" + v : v;
    };
    // Method syntax binds the first argument as `self` (TorchScript resolves x.name(...) to aten::name);
    // ops without a tensor `self` go through torch.name(...).
    bool method = !sargs.empty() && sargs[0].name() == "self" && op.args[0].value >= 0 &&
                  !in_set(name, {"rand_like", "randn_like"});  // not Tensor methods
    if (is_cat_schema(op.schema)) {  // the items as a list
      std::string items;
      for (size_t i = 0; i + 1 < op.args.size(); ++i) items += (i ? ", " : "") + arg(i);
      s += fmt::format("    v{} = torch.{}([{}], {})\n", r.inputs.size() + k, name, items, arg(op.args.size() - 1));
      continue;
    }
    std::string call = method ? fmt::format("v{}.{}(", op.args[0].value, name) : fmt::format("torch.{}(", name);
    for (size_t i = method ? 1 : 0, n = 0; i < op.args.size(); ++i, ++n) call += (n ? ", " : "") + arg(i);
    s += fmt::format("    v{} = {})\n", r.inputs.size() + k, call);
  }
  s += "    return (";
  for (int o : r.outputs) s += fmt::format("v{}, ", o);
  return s + ")\n";
}

std::string write_repro(const Recipe& r, const std::string& message, const std::string& dir, const std::string& cli) {
  std::string base = fmt::format("{}/repro-{}", dir, r.seed);
  torch::jit::Module m("FuzzRepro");
  m.define(torchscript_source(r));
  m.save(base + ".pt");
  std::vector<c10::IValue> items;
  bool huge = false;
  for (auto& t : make_inputs(r)) {
    huge |= t.storage().nbytes() > (size_t{1} << 30);
    items.emplace_back(t.storage().nbytes() > (size_t{1} << 30) ? t.contiguous() : t);
  }
  auto data = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  std::ofstream(base + "-inputs.pt", std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  std::string cmd = fmt::format("{} run {}.pt --inputs {}-inputs.pt --check", cli, base, base);
  std::ofstream txt(base + ".txt");
  txt << message << "\n\n" << r.describe() << "\n" << torchscript_source(r) << "\nreplay: " << cmd << "\n";
  if (huge) txt << "note: an input with a >2^31-element stride was saved contiguous; its layout is in the recipe above\n";
  return cmd;
}

}  // namespace fusion_jit::fuzz
