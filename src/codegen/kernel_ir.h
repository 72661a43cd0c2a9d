// The kernel IR: the scalar code of a fusion group's kernel as typed statements over typed expressions,
// which each target's printer prints without parsing anything (Note [Kernel IR]).
//
// Note [Kernel IR]
// A kernel (KernelSpec, codegen/kernel_spec.h) is an iteration space, its buffers with one stride per
// iteration dim (the index map: offset = sum of index[d] * stride[d]), and code:
//  - pointwise kernels: `body`, run once per element;
//  - reduction kernels: a row prologue, then passes over the row's elements (each with a per-element body,
//    accumulators fed per element, element stores, and statements run after the loop), then row stores.
// The code is a list of statements:
//    Let     `const T name = value;  // comment`  a value of compute type T (float for float16/bfloat16)
//    Output  `o<k> = value;`                     a pointwise kernel's k-th output
// over expressions:
//    Load(b)            the element of buffer b the loop is at, converted to its compute type (printed
//                       `b<b>`: printers load each buffer once per element, before the statements)
//    Var(name)          a value a Let defined (`t<id>`), or an accumulator's result (`acc<k>`)
//    Literal(l, T)      a number in compute type T (hex floats: exact; FJ_NAN / FJ_INF for specials)
//    Call(fn, args)     a function of the targets' preludes (`fj_add`, `fj_exp`, ...)
//    Cast(T, x)         `((T)x)`; Convert(T, x): `((T)(x))` (an op's value into its result's compute type)
//    Round(t, x)        x rounded to float16 or bfloat16 where eager materializes such a value
//    Select(c, a, b)    `(c ? a : b)`
//    Div(a, b)          `a / b`
// Accumulators have a kind (AccKind) and the dtype they accumulate in; their input is an expression.
// Printers ask the IR what they need (which variables a statement reads, which row values exist, whether
// any value is rounded to a reduced float) by walking it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"

namespace fusion_jit {

// The C type a value of dtype `t` is computed in: float for float16 and bfloat16 (and float32), else
// the dtype's own C type. The one place that decides it for every target.
const char* compute_c_type(DType t);

enum class ExprKind { kLoad, kVar, kLiteral, kCall, kCast, kConvert, kRound, kSelect, kDiv };

struct Expr;
using ExprRef = std::shared_ptr<const Expr>;

struct Expr {
  ExprKind kind = ExprKind::kVar;
  DType type = DType::kFloat32;  // Literal, Cast, Convert: the compute type; Round: float16 or bfloat16
  int buffer = -1;               // Load
  std::string name;              // Var: the variable; Call: the prelude function
  Literal literal;               // Literal
  std::vector<ExprRef> args;     // Call: arguments; Cast, Convert, Round: one; Select: 3; Div: 2

  static ExprRef load(int buffer);
  static ExprRef var(std::string name);
  static ExprRef lit(Literal l, DType type);
  static ExprRef call(std::string fn, std::vector<ExprRef> args);
  static ExprRef cast(DType type, ExprRef x);
  static ExprRef convert(DType type, ExprRef x);
  static ExprRef round(DType type, ExprRef x);
  static ExprRef select(ExprRef cond, ExprRef a, ExprRef b);
  static ExprRef div(ExprRef a, ExprRef b);
};

struct Stmt {
  enum Kind { kLet, kOutput } kind = kLet;
  std::string name;     // Let: the variable
  DType type = DType::kFloat32;  // Let: its compute type
  int output = -1;      // Output: o<output>
  ExprRef value;
  std::string comment;  // Let: the IR node's schema
  // Let of a float16 or bfloat16 type: its value is one the type holds (rounded to it, loaded from it, or
  // kept: Note [Results that need no rounding]), so that a store of it need not round again.
  bool held = false;

  static Stmt let(std::string name, DType type, ExprRef value, std::string comment);
  static Stmt out(int output, ExprRef value);
};

// How an accumulator combines (Note [Reduction kernels] in kernel_spec.h, the schedules in the printers).
enum class AccKind {
  kSum,        // plain sum (integers; float32 sums of terms that cannot be negative on CPU; float on CUDA)
  kDoubleSum,  // float32 sums and means on CPU: float partials added up in double
  kKahanSum,   // other floating sums: compensated
  kProd,
  kMax,
  kMin,
  kWelford,    // var: Welford's mean and M2
};
const char* acc_kind_name(AccKind k);  // "sum", "dsum", "ksum", "prod", "max", "min", "welford"
bool is_sum(AccKind k);                // kSum, kDoubleSum or kKahanSum

// How a printer prints a number of the kernel (a size, a stride, a bound): as a literal or an argument
// (KernelNumbers, kernel_spec.h).
using NumberFn = std::function<std::string(const SymInt&)>;

// C text of an expression or a statement (without indentation or newline). The targets' printers share
// these: the expression syntax is the same C for both, only the preludes behind the names differ. An
// integer literal that is a size of a shape class (`x + s1`, Note [Symbolic sizes]) is printed by `num`,
// an argument of the kernel where it has them; without `num` it is read as a number (a guard).
std::string print_expr(const Expr& e, const NumberFn& num = nullptr);
std::string print_stmt(const Stmt& s, const NumberFn& num = nullptr);

// Queries the printers ask.
void vars_read(const Expr& e, std::set<std::string>* out);     // Var names
void buffers_read(const Expr& e, std::set<int>* out);          // Load buffers
bool rounds_reduced_float(const Expr& e);                       // any Round inside

}  // namespace fusion_jit
