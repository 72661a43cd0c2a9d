#include "codegen/kernel_ir.h"

#include <fmt/format.h>

#include <cmath>

#include "support/error.h"

namespace fusion_jit {

const char* compute_c_type(DType t) {
  DType c = compute_dtype(t);
  return c == DType::kFloat32 ? "float" : dtype_c_type(c);
}

namespace {
ExprRef make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

ExprRef unary(ExprKind kind, DType type, ExprRef x) {
  Expr e;
  e.kind = kind;
  e.type = type;
  e.args = {std::move(x)};
  return make(std::move(e));
}

// A literal in the compute type `t`, as C text; a symbolic integer printed by `num` where given.
std::string literal_text(const Literal& l, DType t, const NumberFn& num) {
  double d = 0;
  int64_t i = 0;
  bool is_int = false;
  if (const SymInt* v = std::get_if<SymInt>(&l); v && v->is_symbolic() && num) {
    const std::string z = num(*v);
    DType c = compute_dtype(t);
    return c == DType::kBool ? "(" + z + " != 0)" : fmt::format("(({}){})", compute_c_type(t), z);
  }
  if (std::holds_alternative<double>(l)) d = std::get<double>(l);
  else if (std::holds_alternative<SymInt>(l)) i = std::get<SymInt>(l), is_int = true;
  else if (std::holds_alternative<bool>(l)) i = std::get<bool>(l), is_int = true;
  else FJ_INTERNAL_ASSERT(false, "literal {} is not a number", literal_str(l));
  DType c = compute_dtype(t);
  if (c == DType::kFloat32 || c == DType::kFloat64) {
    const char* ty = c == DType::kFloat32 ? "float" : "double";
    if (is_int) return fmt::format("(({}){}LL)", ty, i);
    // FJ_NAN and FJ_INF come from each target's prelude (NVRTC has no __builtin_inf).
    if (std::isnan(d)) return fmt::format("(({})FJ_NAN)", ty);
    if (std::isinf(d)) return fmt::format("(({})({}FJ_INF))", ty, d < 0 ? "-" : "");
    return fmt::format("(({}){:a})", ty, d);  // hex float: exact
  }
  if (c == DType::kBool) return (is_int ? i != 0 : d != 0) ? "true" : "false";
  if (!is_int) return fmt::format("(({}){:a})", dtype_c_type(c), d);
  return fmt::format("(({}){}LL)", dtype_c_type(c), i);
}
}  // namespace

ExprRef Expr::load(int buffer) {
  Expr e;
  e.kind = ExprKind::kLoad;
  e.buffer = buffer;
  return make(std::move(e));
}
ExprRef Expr::var(std::string name) {
  Expr e;
  e.kind = ExprKind::kVar;
  e.name = std::move(name);
  return make(std::move(e));
}
ExprRef Expr::lit(Literal l, DType type) {
  Expr e;
  e.kind = ExprKind::kLiteral;
  e.literal = std::move(l);
  e.type = type;
  return make(std::move(e));
}
ExprRef Expr::call(std::string fn, std::vector<ExprRef> args) {
  Expr e;
  e.kind = ExprKind::kCall;
  e.name = std::move(fn);
  e.args = std::move(args);
  return make(std::move(e));
}
ExprRef Expr::cast(DType type, ExprRef x) { return unary(ExprKind::kCast, type, std::move(x)); }
ExprRef Expr::convert(DType type, ExprRef x) { return unary(ExprKind::kConvert, type, std::move(x)); }
ExprRef Expr::round(DType type, ExprRef x) {
  FJ_INTERNAL_ASSERT(is_reduced_float(type), "Round to {}", dtype_name(type));
  return unary(ExprKind::kRound, type, std::move(x));
}
ExprRef Expr::select(ExprRef cond, ExprRef a, ExprRef b) {
  Expr e;
  e.kind = ExprKind::kSelect;
  e.args = {std::move(cond), std::move(a), std::move(b)};
  return make(std::move(e));
}
ExprRef Expr::div(ExprRef a, ExprRef b) {
  Expr e;
  e.kind = ExprKind::kDiv;
  e.args = {std::move(a), std::move(b)};
  return make(std::move(e));
}

Stmt Stmt::let(std::string name, DType type, ExprRef value, std::string comment) {
  Stmt s;
  s.kind = kLet;
  s.name = std::move(name);
  s.type = type;
  s.value = std::move(value);
  s.comment = std::move(comment);
  return s;
}
Stmt Stmt::out(int output, ExprRef value) {
  Stmt s;
  s.kind = kOutput;
  s.output = output;
  s.value = std::move(value);
  return s;
}

const char* acc_kind_name(AccKind k) {
  switch (k) {
    case AccKind::kSum: return "sum";
    case AccKind::kDoubleSum: return "dsum";
    case AccKind::kKahanSum: return "ksum";
    case AccKind::kProd: return "prod";
    case AccKind::kMax: return "max";
    case AccKind::kMin: return "min";
    case AccKind::kWelford: return "welford";
  }
  return "?";
}

bool is_sum(AccKind k) { return k == AccKind::kSum || k == AccKind::kDoubleSum || k == AccKind::kKahanSum; }

std::string print_expr(const Expr& e, const NumberFn& num) {
  switch (e.kind) {
    case ExprKind::kLoad: return fmt::format("b{}", e.buffer);
    case ExprKind::kVar: return e.name;
    case ExprKind::kLiteral: return literal_text(e.literal, e.type, num);
    case ExprKind::kCall: {
      std::string args;
      for (const auto& a : e.args) args += (args.empty() ? "" : ", ") + print_expr(*a, num);
      return e.name + "(" + args + ")";
    }
    case ExprKind::kCast: return fmt::format("(({}){})", compute_c_type(e.type), print_expr(*e.args[0], num));
    case ExprKind::kConvert: return fmt::format("(({})({}))", compute_c_type(e.type), print_expr(*e.args[0], num));
    case ExprKind::kRound: {
      // The preludes' fj_round_f16 / fj_round_bf16 take a float; a cast right under the call needs no
      // parentheses of its own.
      const char* fn = e.type == DType::kFloat16 ? "fj_round_f16" : "fj_round_bf16";
      const Expr& x = *e.args[0];
      if (x.kind == ExprKind::kCast) return fmt::format("{}(({}){})", fn, compute_c_type(x.type), print_expr(*x.args[0], num));
      return fmt::format("{}({})", fn, print_expr(x, num));
    }
    case ExprKind::kSelect:
      return fmt::format("({} ? {} : {})", print_expr(*e.args[0], num), print_expr(*e.args[1], num), print_expr(*e.args[2], num));
    case ExprKind::kDiv: return fmt::format("{} / {}", print_expr(*e.args[0], num), print_expr(*e.args[1], num));
  }
  return "";
}

std::string print_stmt(const Stmt& s, const NumberFn& num) {
  if (s.kind == Stmt::kOutput) return fmt::format("o{} = {};", s.output, print_expr(*s.value, num));
  return fmt::format("const {} {} = {};  // {}", compute_c_type(s.type), s.name, print_expr(*s.value, num), s.comment);
}

void vars_read(const Expr& e, std::set<std::string>* out) {
  if (e.kind == ExprKind::kVar) out->insert(e.name);
  for (const auto& a : e.args) vars_read(*a, out);
}

void buffers_read(const Expr& e, std::set<int>* out) {
  if (e.kind == ExprKind::kLoad) out->insert(e.buffer);
  for (const auto& a : e.args) buffers_read(*a, out);
}

bool rounds_reduced_float(const Expr& e) {
  if (e.kind == ExprKind::kRound) return true;
  for (const auto& a : e.args)
    if (rounds_reduced_float(*a)) return true;
  return false;
}

}  // namespace fusion_jit
