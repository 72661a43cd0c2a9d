// Lowering a fusion group to a KernelSpec (codegen/lowering.h).
#include "codegen/lowering.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "codegen/target.h"
#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

// A double rounded to float16 or bfloat16 the way ATen converts a wrapped scalar: through float.
double round_to(double d, DType t) {
  float f = static_cast<float>(d);
  if (t == DType::kFloat16) return static_cast<double>(static_cast<float>(static_cast<_Float16>(f)));
  if (t == DType::kBFloat16 && !std::isnan(f)) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&f, &u, 4);
  }
  return f;
}

bool is_none(const Literal& l) { return std::holds_alternative<None>(l); }

// Dims of an iteration space with one stride per dim for each buffer.
struct Dims {
  SymSizes sizes;
  std::vector<SymSizes> strides;  // [buffer][dim]
  // Per barrier dim: the merged dim that starts at it, and its elements per index of the barrier dim.
  std::map<int64_t, std::pair<int, SymInt>> barriers;
};


// The dims `order` of (sizes, strides), outermost first, with size-1 dims dropped and each dim merged into
// the one before it when every buffer allows (stride[before] == stride[d] * size[d]); at least one dim.
// The one dimension-merge routine of both kernel kinds. A dim among `barriers` (a piece's: Note [Cats of
// unequal items]) never merges into the dim before it, nor is it dropped; the dims after it may merge
// into it.
Dims merge_dims(const std::vector<int64_t>& order, const SymSizes& sizes, const std::vector<SymSizes>& strides,
                const std::set<int64_t>& barriers = {}) {
  Dims m;
  m.strides.resize(strides.size());
  int64_t last_barrier = -1;
  for (int64_t d : order) {
    const bool barrier = barriers.count(d) > 0;
    if (sizes[d] == 1 && !barrier) continue;  // size-1 dims carry nothing
    bool merge = !m.sizes.empty() && !barrier;
    for (size_t k = 0; k < strides.size() && merge; ++k) merge = m.strides[k].back() == strides[k][d] * sizes[d];
    if (merge) {
      m.sizes.back() *= sizes[d];
      for (size_t k = 0; k < strides.size(); ++k) m.strides[k].back() = strides[k][d];
      if (last_barrier >= 0 && m.barriers[last_barrier].first == static_cast<int>(m.sizes.size()) - 1)
        m.barriers[last_barrier].second *= sizes[d];
    } else {
      if (barrier) {
        m.barriers[d] = {static_cast<int>(m.sizes.size()), 1};
        last_barrier = d;
      }
      m.sizes.push_back(sizes[d]);
      for (size_t k = 0; k < strides.size(); ++k) m.strides[k].push_back(strides[k][d]);
    }
  }
  if (m.sizes.empty()) {
    m.sizes.push_back(1);
    for (auto& st : m.strides) st.push_back(0);
  }
  return m;
}

// Whether int32 offsets suffice: the element count and, for every buffer, its extent (storage offset
// included) and the furthest element the iteration reaches stay below 2^31 - 1. The one index-width rule.
// Where the sizes are symbolic it is one comparison, of the largest of them (the ranges order most), so
// the class's index width is one guard.
bool fits_int32(const KernelSpec& k) {
  SymInt largest = k.numel;
  for (const auto& b : k.buffers) {
    SymInt reach = 1 + b.offset + sym_max(b.gather_rows - 1, 0) * b.gather_stride;
    for (size_t d = 0; d < k.sizes.size(); ++d) reach += (k.sizes[d] - 1) * sym_abs(b.strides[d]);
    largest = sym_max(largest, sym_max(b.extent, reach));
  }
  return largest < std::numeric_limits<int32_t>::max();
}

class Builder {
 public:
  Builder(const FusionGroup& g, const Target& target) : g_(g), target_(target) {
    FJ_INTERNAL_ASSERT(target.device() == group_device(g), "group {} lowered for target {}", g.id, target.name());
  }

  KernelSpec build() {
    spec_.name = fmt::format("fj_kernel_{}", g_.id);
    spec_.group = g_.id;
    spec_.device = group_device(g_);
    std::set<const Node*> members(g_.nodes.begin(), g_.nodes.end());
    if (g_.reduction) return build_reduction(members);
    find_pieces(members);
    for (const Node* n : g_.nodes) {
      if (n->schema() == "prim::ListConstruct") continue;  // its cat reads the items
      auto own = owner_.find(n);
      piece_ = own == owner_.end() ? -1 : own->second;
      if (cat_list(*n)) emit_cat(*n, members);
      else emit_node(*n, members);
    }
    piece_ = -1;
    add_outputs();
    layout();
    return std::move(spec_);
  }

 private:
  // A pointwise kernel's output buffers and the statements storing them: one per output, or, for a cat's
  // result, one per item (Note [Concatenation in kernels]: each into its slice of the result).
  void add_outputs() {
    for (const Value* o : g_.outputs) {
      auto regions = regions_.find(o);
      if (regions != regions_.end()) {
        // Note [Concatenation in kernels]: one store per item, into its slice of the result.
        for (size_t k = 0; k < regions->second.size(); ++k) {
          KernelBuffer b;
          b.value = o;
          b.dtype = o->tensor_type().dtype;
          b.is_output = true;
          b.strides = cat_strides_.at(o);
          b.offset = regions->second[k].first;
          outputs_.push_back(b);
          spec_.body.push_back(Stmt::out(static_cast<int>(outputs_.size() - 1), regions->second[k].second));
        }
        continue;
      }
      KernelBuffer b;
      b.value = o;
      b.dtype = o->tensor_type().dtype;
      b.is_output = true;
      b.strides = o->tensor_type().strides;
      outputs_.push_back(b);
      spec_.body.push_back(Stmt::out(static_cast<int>(outputs_.size() - 1), Expr::var(var_.at(o))));
    }
  }

  // The variable holding a tensor argument, loading it from a buffer when it comes from outside.
  // `channel`: for a per-channel argument (batch_norm's), the dim of the group's shape its elements run
  // along (channel_dim); -1 for any other argument.
  ExprRef arg_var(const Value* v, const std::set<const Node*>& members, int channel = -1) {
    if (v->producer() && members.count(v->producer()) && channel < 0) {
      deps_vals_.insert(v);
      return Expr::var(var_.at(v));
    }
    auto key = std::make_tuple(v, channel, frame_, piece_);
    auto it = loads_.find(key);
    if (it != loads_.end()) {
      if (g_.reduction) deps_bufs_.insert(it->second);
      return Expr::load(it->second);
    }
    const int index = add_input(v, v->tensor_type(), channel);
    loads_[key] = index;
    return Expr::load(index);
  }

  // A new input buffer for `v`, its elements laid out as `t` (v's own type, or the view of it a gather
  // reads: Note [Gathered loads]). Its strides over the reduction's shape (in the frame of the node being
  // emitted), or over the group's shape: numpy broadcasting (right-aligned), or the channel dim only.
  int add_input(const Value* v, const TensorType& t, int channel) {
    KernelBuffer b;
    b.value = v;
    b.dtype = v->tensor_type().dtype;
    b.piece = piece_;
    const int index = static_cast<int>(inputs_.size());
    if (g_.reduction) {
      if (channel >= 0) {
        b.strides.assign(g_.reduction->shape.size(), 0);
        if (t.sizes[0] != 1) b.strides[static_cast<size_t>(channel)] = t.strides[0];
      } else {
        b.strides = strides_over_shape(t, frame_);
      }
      deps_bufs_.insert(index);
    } else {
      const int64_t nd = static_cast<int64_t>(g_.shape.size()), off = nd - t.dim();
      b.strides.assign(nd, 0);
      if (channel >= 0) {
        if (t.sizes[0] != 1) b.strides[static_cast<size_t>(channel)] = t.strides[0];
      } else {
        FJ_INTERNAL_ASSERT(off >= 0, "{} has more dims than group {}", t.str(), g_.id);
        for (int64_t d = 0; d < t.dim(); ++d) b.strides[off + d] = t.sizes[d] == 1 ? SymInt(0) : t.strides[d];
      }
    }
    inputs_.push_back(b);
    return index;
  }

  // Note [Cats of unequal items]: the group's cat of unequal items, if any, splits the kernel into one
  // piece per item (and a cat inside an item splits its piece again); the nodes computing an item are
  // emitted into its piece.
  void find_pieces(const std::set<const Node*>& members) {
    const Node* root = nullptr;
    for (const Node* n : g_.nodes) {
      if (!cat_list(*n)) continue;
      auto f = cat_form(*n, nullptr);
      if (f && f->ragged) root = n;  // the last: the others lie in its items
    }
    if (!root) return;
    std::string why;
    auto pieces = cat_pieces(*root, members, &why);
    FJ_INTERNAL_ASSERT(pieces.has_value(), "group {}: {}", g_.id, why);
    owner_ = std::move(pieces->owner);
    for (size_t i = 0; i < pieces->pieces.size(); ++i) {
      const CatPiece& cp = pieces->pieces[i];
      auto f = cat_form(*cp.cat, nullptr);
      KernelPiece p;
      p.parent = cp.parent;
      p.dim = static_cast<int>(f->dim);
      // Starts along the group's dims: a piece of the same dim as its parent's lies at its parent's start.
      SymInt base = 0;
      for (int q = cp.parent; q >= 0; q = pieces_[static_cast<size_t>(q)].parent)
        if (pieces_[static_cast<size_t>(q)].dim == p.dim) {
          base = pieces_[static_cast<size_t>(q)].start;
          break;
        }
      SymInt at = 0;
      for (int k = 0; k < cp.item; ++k) at += f->items[k]->tensor_type().sizes[f->dim];
      p.start = base + at;
      p.end = p.start + f->items[cp.item]->tensor_type().sizes[f->dim];
      p.var = fmt::format("t{}", cp.cat->output()->id());
      p.type = cp.cat->output()->tensor_type().dtype;
      pieces_.push_back(std::move(p));
      piece_of_[{cp.cat, cp.item}] = static_cast<int>(i);
    }
  }

  // The statements of the node being emitted go to its piece's body, or to the kernel's.
  std::vector<Stmt>& body() { return piece_ >= 0 ? pieces_.at(piece_).body : spec_.body; }

  // A cat or stack (Note [Concatenation in kernels]): with one item a copy of it, else one store per item;
  // items of unequal sizes: the piece of each defines the result's variable.
  void emit_cat(const Node& n, const std::set<const Node*>& members) {
    std::string why;
    auto f = cat_form(n, &why);
    FJ_INTERNAL_ASSERT(f.has_value(), "{} in group {}: {}", n.schema(), g_.id, why);
    auto split = piece_of_.find({&n, 0});
    if (split != piece_of_.end()) {
      const Value* out = n.output();
      const int outer = piece_;
      for (size_t k = 0; k < f->items.size(); ++k) {
        piece_ = piece_of_.at({&n, static_cast<int>(k)});
        pieces_[static_cast<size_t>(piece_)].value = arg_var(f->items[k], members);
      }
      piece_ = outer;
      var_[out] = pieces_[static_cast<size_t>(split->second)].var;
      return;
    }
    FJ_INTERNAL_ASSERT(f->shape == g_.shape, "{} over {} items in a group of another shape", n.schema(),
                       f->items.size());
    const Value* out = n.output();
    if (f->copies()) {
      std::string name = fmt::format("t{}", out->id());
      body().push_back(Stmt::let(name, out->tensor_type().dtype, arg_var(f->items[0], members), n.schema()));
      var_[out] = name;
      return;
    }
    auto& regions = regions_[out];
    for (size_t k = 0; k < f->items.size(); ++k) regions.emplace_back(f->offset(k), arg_var(f->items[k], members));
    cat_strides_[out] = f->strides;
  }

  // embedding(table, indices): the table's element at the row the index picks, along the result's last
  // dim; the indices broadcast over it. gather(table, dim, indices): the table's element at the index
  // along `dim`, at the result's own index along the others. Two buffers, the indices first (Note
  // [Gathered loads]).
  void emit_gather(const Node& n) {
    const GatherForm gf = gather_form(n).value();
    const TensorType& tt = gf.table->tensor_type();
    TensorType it = gf.index->tensor_type();
    TensorType view = tt;  // the table's elements the loop walks, the gathered dim's stride 0
    if (gf.embedding) {
      it.sizes.push_back(1);
      it.strides.push_back(0);
      view.sizes = {tt.sizes[1]};
      view.strides = {tt.strides[1]};
    } else {
      view.sizes = it.sizes;
      view.strides[gf.dim] = 0;
    }
    const int ib = add_input(gf.index, it, -1);
    const int tb = add_input(gf.table, view, -1);
    inputs_[tb].gather = ib;
    inputs_[tb].gather_stride = tt.strides[gf.dim];
    inputs_[tb].gather_rows = tt.sizes[gf.dim];
    inputs_[tb].gather_dim = gf.embedding ? -1 : gf.dim;
    const Value* out = n.output();
    std::string name = fmt::format("t{}", out->id());
    Stmt stmt = Stmt::let(name, out->tensor_type().dtype, Expr::load(tb), n.schema());
    stmt.held = out->tensor_type().dtype == tt.dtype && is_reduced_float(tt.dtype);  // a load of the table
    if (g_.reduction) stmt_[out] = stmt;
    else body().push_back(stmt);
    var_[out] = name;
  }

  // Note [batch_norm's formulas]
  // Eager computes inference batch_norm (x, weight, bias, mean, var, ..., eps) by one of two formulas,
  // chosen per device and, on the CPU, by layout (Target::batch_norm_form): x * alpha + beta, alpha =
  // w / sqrt(var + eps) and beta = b - mean * alpha (the CPU's kernel for contiguous operands), or
  // ((x - mean) * invstd) * w + b (every other case). They agree up to rounding on ordinary values and
  // not elsewhere: with w = b = -inf and mean > 0, beta is NaN where the second gives -inf, and where
  // x * alpha cancels against beta the first loses what the second keeps. So the kernel follows eager's
  // choice for the node's own operands. A missing weight or bias is 1 or 0, as in eager.
  ExprRef batch_norm(const Node& n, const std::vector<ExprRef>& t, ExprRef eps, DType ct) {
    ExprRef w = t[1] ? t[1] : Expr::lit(int64_t{1}, ct);
    ExprRef b = t[2] ? t[2] : Expr::lit(int64_t{0}, ct);
    const BatchNormForm form = target_.batch_norm_form(n);
    if (form == BatchNormForm::kScaleShift) {
      if (g_.reduction) return Expr::call("fj_batch_norm", {t[0], w, b, t[3], t[4], eps});
      // In three statements: alpha and beta read only the per-channel operands (Note [Row-invariant values]).
      const std::string id = fmt::format("t{}", n.output()->id());
      body().push_back(Stmt::let(id + "_alpha", ct, Expr::call("fj_bn_alpha", {w, t[4], eps}), n.schema()));
      body().push_back(Stmt::let(id + "_beta", ct, Expr::call("fj_bn_beta", {b, t[3], Expr::var(id + "_alpha")}), n.schema()));
      return Expr::call("fj_bn_apply", {t[0], Expr::var(id + "_alpha"), Expr::var(id + "_beta")});
    }
    ExprRef one = Expr::lit(int64_t{1}, ct);
    ExprRef invstd = Expr::call("fj_reciprocal", {Expr::call("fj_sqrt", {Expr::call("fj_add", {t[4], eps, one})})});
    ExprRef centered = Expr::call("fj_sub", {t[0], t[3], one});
    ExprRef scaled = Expr::call("fj_mul", {Expr::call("fj_mul", {centered, invstd}), w});
    return Expr::call("fj_add", {scaled, b, one});
  }

  void emit_node(const Node& n, const std::set<const Node*>& members) {
    if (n.op()->category == OpCategory::kGather) return emit_gather(n);
    const OpInfo& op = *n.op();
    const Value* out = n.output();
    DType out_t = out->tensor_type().dtype;
    DType ct = op_compute_dtype(op, n.args(), out_t);
    const Operands a = operands(n, members, ct);
    ExprRef e = node_expr(n, a, ct);
    // Convert to the output's compute type, and round where eager materializes a reduced float (unless the
    // value is one the dtype holds already: Note [Results that need no rounding]).
    ExprRef value = Expr::convert(out_t, e);
    if (is_reduced_float(out_t) && !keeps_held_value(n, a, out_t)) value = Expr::round(out_t, value);
    std::string name = fmt::format("t{}", out->id());
    Stmt stmt = Stmt::let(name, out_t, value, n.schema());
    stmt.held = is_reduced_float(out_t);  // rounded, or a value the dtype holds already
    if (g_.reduction) stmt_[out] = stmt;
    else body().push_back(stmt);
    var_[out] = name;
  }

  // A node's operands as its expression reads them: its tensor arguments (absent ones null), as loaded and
  // converted to the compute type `ct`, and its scalar arguments.
  struct Operands {
    std::vector<ExprRef> tensors;  // converted to the compute type
    std::vector<ExprRef> raw;      // as loaded
    std::vector<Literal> lits;
  };
  Operands operands(const Node& n, const std::set<const Node*>& members, DType ct) {
    const OpInfo& op = *n.op();
    const Value* out = n.output();
    DType out_t = out->tensor_type().dtype;
    std::vector<ExprRef> tensors, raw;
    std::vector<Literal> lits;
    // Scalars that take part in promotion become tensors of the promoted dtype in eager (ATen wraps
    // them), so with f16/bf16 they are rounded to it before the arithmetic; so is masked_fill's value.
    // The exceptions are the target's (Target::rounds_argument).
    DType promoted = op_promoted_dtype(op, n.args(), out_t);
    for (size_t i = 0; i < op.args.size(); ++i) {
      const ArgSpec& spec = op.args[i];
      bool present = i < n.args().size();
      if (spec.is_tensor()) {
        if (!present || !n.args()[i].is_value()) {
          raw.push_back(nullptr);
          tensors.push_back(nullptr);
          continue;
        }
        if (op.rule == DTypeRule::kCastLike && i == 1) continue;  // only its dtype matters
        const Value* v = n.args()[i].value;
        ExprRef var = arg_var(v, members, spec.kind == ArgKind::kChannel ? channel_dim(n) : -1);
        raw.push_back(var);
        // Eager converts each operand to the promoted dtype first: into float16 or bfloat16 that rounds.
        DType vt = v->tensor_type().dtype;
        bool rounds = is_reduced_float(promoted) && vt != promoted && vt != DType::kBool;
        if (rounds && target_.rounds_argument(op, i, v, out, /*promoting=*/true))
          tensors.push_back(Expr::round(promoted, Expr::cast(DType::kFloat32, var)));
        else
          tensors.push_back(Expr::cast(ct, var));
      } else if (spec.kind == ArgKind::kScalar || spec.kind == ArgKind::kScalarNoPromote ||
                 spec.kind == ArgKind::kOptScalar || spec.kind == ArgKind::kMode) {
        Literal l = present ? n.args()[i].literal : literal_arg(n, i);
        const bool promoting =
            spec.kind == ArgKind::kScalar || spec.kind == ArgKind::kOptScalar || op.kernel_fn == "masked_fill";
        bool rounds = target_.rounds_argument(op, i, nullptr, out, promoting) && is_reduced_float(promoted);
        if (rounds && std::holds_alternative<double>(l)) l = round_to(std::get<double>(l), promoted);
        // Integers too: float16 has no 2049.
        if (rounds && std::holds_alternative<SymInt>(l))
          l = round_to(static_cast<double>(std::get<SymInt>(l)), promoted);
        lits.push_back(l);
      }
    }
    return {std::move(tensors), std::move(raw), std::move(lits)};
  }

  // Note [Results that need no rounding]
  // A float16 or bfloat16 result is rounded to its dtype where eager stores it, which is a no-op where the
  // value is already one the dtype holds. Ops flagged kKeepsValue (ops.def: relu, neg, abs, maximum,
  // clamp, where, masked_fill, clone, a cast to the same dtype, ...) give one of their operands' values,
  // negated, with its sign cleared or chosen; where every tensor operand other than a bool condition has
  // the result's dtype (a load of it, or a result rounded to it) and every literal is held exactly in it,
  // the rounding is left out. The bits are the same (a NaN stays NaN and is made quiet by the store), and
  // GCC has fewer instructions to vectorize and allocate: in a bfloat16 CNN about one rounding in three
  // is a relu's or a clone's (bench/RESULTS.md, "bfloat16 compile time").
  bool keeps_held_value(const Node& n, const Operands& a, DType out_t) const {
    if (!n.op()->has(OpFlag::kKeepsValue)) return false;
    for (const Arg& arg : n.args()) {
      if (!arg.is_value()) continue;
      if (!arg.value->is_tensor()) return false;  // a scalar read at run time: its value is not known here
      const DType t = arg.value->tensor_type().dtype;
      if (t != out_t && t != DType::kBool) return false;
    }
    for (const Literal& l : a.lits) {
      if (std::holds_alternative<double>(l)) {
        const double d = std::get<double>(l);
        if (!std::isnan(d) && round_to(d, out_t) != d) return false;
      } else if (std::holds_alternative<SymInt>(l)) {
        const SymInt& v = std::get<SymInt>(l);
        if (v.is_symbolic() || round_to(static_cast<double>(v), out_t) != static_cast<double>(v)) return false;
      } else if (!is_none(l) && !std::holds_alternative<std::string>(l)) {
        return false;  // a literal of another kind: not judged here
      }
    }
    return true;
  }

  // The expression computing node `n` in the compute type `ct` from its operands `a`: the kernel function
  // of its op (OpInfo::kernel_fn), with the arguments, modes and special cases of each.
  ExprRef node_expr(const Node& n, const Operands& a, DType ct) {
    const OpInfo& op = *n.op();
    const DType out_t = n.output()->tensor_type().dtype;
    const std::vector<ExprRef>& tensors = a.tensors;
    const std::vector<ExprRef>& raw = a.raw;
    const std::vector<Literal>& lits = a.lits;
    const std::string& fn = op.kernel_fn;
    ExprRef e;
    auto L = [&](size_t k) { return Expr::lit(lits.at(k), ct); };
    if (fn == "add" || fn == "sub" || fn == "rsub") {
      // Tensor overloads: (a, b, alpha); Scalar overloads: (a, scalar, alpha).
      ExprRef b = tensors.size() > 1 ? tensors[1] : L(0);
      ExprRef alpha = tensors.size() > 1 ? L(0) : L(1);
      e = Expr::call("fj_" + fn, {tensors[0], b, alpha});
    } else if (fn == "div" && lits.size() > (tensors.size() > 1 ? 0u : 1u)) {
      const Literal& mode = lits.back();
      ExprRef b = tensors.size() > 1 ? tensors[1] : L(0);
      std::string suffix = is_none(mode) ? "" : "_" + std::get<std::string>(mode);
      e = Expr::call("fj_div" + suffix, {tensors[0], b});
    } else if (fn == "gelu") {
      std::string mode = std::get<std::string>(lits.at(0));
      e = Expr::call(mode == "tanh" ? "fj_gelu_tanh" : "fj_" + target_.gelu_fn(n, out_t), {tensors[0]});
    } else if (fn == "pow" && tensors.size() == 1) {
      e = pow_scalar(tensors[0], lits.at(0), ct, !target_.pow_uses_sqrt(out_t));
    } else if (fn == "clamp") {
      e = tensors[0];
      if (!is_none(lits.at(0))) e = Expr::call("fj_clamp_min", {e, L(0)});
      if (!is_none(lits.at(1))) e = Expr::call("fj_clamp_max", {e, L(1)});
    } else if (fn == "where") {
      // (cond, a, b) with either of a, b a scalar.
      std::vector<ExprRef> vals;
      size_t ti = 1, lit = 0;
      for (size_t i = 1; i < op.args.size(); ++i) vals.push_back(op.args[i].is_tensor() ? tensors[ti++] : L(lit++));
      e = Expr::select(raw[0], vals[0], vals[1]);
    } else if (fn == "masked_fill") {
      ExprRef v = tensors.size() > 2 ? tensors[2] : L(0);
      e = Expr::select(raw[1], v, tensors[0]);
    } else if (fn == "cast") {
      e = Expr::cast(ct, raw[0]);
    } else if (fn == "batch_norm") {
      e = batch_norm(n, tensors, L(0), ct);
    } else {
      std::vector<ExprRef> args = tensors;
      for (size_t k = 0; k < lits.size(); ++k) args.push_back(L(k));
      e = Expr::call("fj_" + target_.math_fn(fn, out_t), std::move(args));
    }
    return e;
  }

  // ---- Reduction groups (Note [Reduction kernels]) ----

  // The dim of the group's shape (of the reduction's shape S, in a reduction group) along which the
  // channels of `n` (dim 1 of its result: batch_norm's) run: its result's dims are the last ones of the
  // group's shape, or of the frame it is emitted in (numpy broadcasting, right-aligned).
  int channel_dim(const Node& n) const {
    const int64_t rank = n.output()->tensor_type().dim();
    if (g_.reduction) {
      const std::vector<int64_t> target = frame_dims(frame_);
      const int64_t off = static_cast<int64_t>(target.size()) - rank;
      FJ_INTERNAL_ASSERT(rank > 1 && off >= 0, "group {}: {} of rank {} in a frame of rank {}", g_.id, n.schema(),
                         rank, target.size());
      return static_cast<int>(target[static_cast<size_t>(off + 1)]);
    }
    const int64_t off = static_cast<int64_t>(g_.shape.size()) - rank;
    FJ_INTERNAL_ASSERT(rank > 1 && off >= 0, "group {}: {} of rank {} in a group of rank {}", g_.id, n.schema(), rank,
                       g_.shape.size());
    return static_cast<int>(off + 1);
  }

  // The dims of the reduction's shape S that the frame's dims are (all of S's, or those left after the
  // reduced dims are squeezed out).
  std::vector<int64_t> frame_dims(bool squeezed) const {
    const auto& f = *g_.reduction;
    std::vector<int64_t> target;
    for (int64_t d = 0; d < static_cast<int64_t>(f.shape.size()); ++d)
      if (!squeezed || !std::count(f.dims.begin(), f.dims.end(), d)) target.push_back(d);
    return target;
  }

  // Strides of `t` over the reduced shape S: right-aligned against S (or, in the squeezed frame, against
  // the kept dims of S); size-1 dims have stride 0.
  SymSizes strides_over_shape(const TensorType& t, bool squeezed) const {
    const auto& f = *g_.reduction;
    const std::vector<int64_t> target = frame_dims(squeezed);
    SymSizes st(f.shape.size(), 0);
    const int64_t off = static_cast<int64_t>(target.size()) - t.dim();
    FJ_INTERNAL_ASSERT(off >= 0, "{} has more dims than the reduction's frame", t.str());
    for (int64_t k = 0; k < t.dim(); ++k)
      if (t.sizes[k] != 1) st[target[off + k]] = t.strides[k];
    return st;
  }

  bool squeezed_frame(const Value* v) const { return v->tensor_type().dim() != static_cast<int64_t>(g_.reduction->shape.size()); }

  void emit_reduction(const Node& n, const std::set<const Node*>& members) {
    auto info = reduction_info(n);
    FJ_INTERNAL_ASSERT(info.has_value());
    const Value* in = n.args()[0].value;
    const Value* out = n.output();
    DType out_t = out->tensor_type().dtype;
    DType acc_t = compute_dtype(out_t);
    frame_ = false;
    ExprRef x = arg_var(in, members);
    KernelAccumulator a;
    a.kind = info->kind == "mean" || info->kind == "sum" ? AccKind::kSum
             : info->kind == "var"                      ? AccKind::kWelford
             : info->kind == "prod"                     ? AccKind::kProd
             : info->kind == "max"                      ? AccKind::kMax
                                                        : AccKind::kMin;
    FJ_INTERNAL_ASSERT(a.kind != AccKind::kMin || info->kind == "min", "reduction kind {}", info->kind);
    a.type = compute_dtype(acc_t);
    // Sums of terms that cannot be negative (softmax's exps, rms_norm's squares) cannot cancel: float lanes
    // keep them accurate, and cost less than double.
    const Node* src = in->producer() && members.count(in->producer()) ? in->producer() : nullptr;
    const bool non_negative =
        src && src->op() &&
        (src->op()->has(OpFlag::kNonNegative) ||
         (src->op()->kernel_fn == "mul" && src->args().size() >= 2 && src->args()[0].is_value() &&
          src->args()[0].value == src->args()[1].value));
    if (a.kind == AccKind::kSum && is_floating(acc_t)) a.kind = target_.float_sum(a.type, non_negative);
    if (a.kind == AccKind::kDoubleSum) a.type = DType::kFloat64;
    a.input = Expr::cast(a.type, x);
    acc_of_[out] = a;
    const std::string kind = info->kind;
    const Literal correction = Literal(info->correction);
    std::string name = fmt::format("t{}", out->id());
    std::string schema = n.schema();
    finish_[out] = [=](ExprRef acc) {
      ExprRef r = acc;
      if (kind == "mean") r = Expr::div(acc, Expr::cast(acc_t, Expr::var(kRowLength)));
      else if (kind == "var") r = Expr::call("fj_welford_var", {acc, Expr::lit(correction, acc_t)});
      ExprRef value = Expr::convert(out_t, r);
      if (is_reduced_float(out_t)) value = Expr::round(out_t, value);
      Stmt s = Stmt::let(name, out_t, value, schema);
      s.held = is_reduced_float(out_t);
      return s;
    };
    var_[out] = name;
  }

  KernelSpec build_reduction(const std::set<const Node*>& members) {
    const ReductionForm& f = *g_.reduction;
    for (const Node* n : g_.nodes) {
      deps_vals_.clear();
      deps_bufs_.clear();
      const Value* out = n->output();
      frame_ = f.row_values.count(out) && squeezed_frame(out);
      if (n->op()->category == OpCategory::kReduction) emit_reduction(*n, members);
      else emit_node(*n, members);
      val_deps_[out] = deps_vals_;
      buf_deps_[out] = deps_bufs_;
    }
    std::set<const Value*> outs(g_.outputs.begin(), g_.outputs.end());
    for (const Value* o : g_.outputs) {
      KernelBuffer b;
      b.value = o;
      b.dtype = o->tensor_type().dtype;
      b.is_output = true;
      b.strides = strides_over_shape(o->tensor_type(), f.row_values.count(o) && squeezed_frame(o));
      outputs_.push_back(b);
    }
    layout_reduction();
    const int first_out = static_cast<int>(inputs_.size());
    for (int k = 0; k < first_out; ++k)
      if (row_buffer(k)) spec_.row_loads.push_back(k);
    // Row values known before the first pass.
    for (const Node* n : g_.nodes) {
      const Value* o = n->output();
      if (f.row_values.count(o) && !acc_of_.count(o) && f.ready.at(o) == 0) spec_.row_prologue.push_back(stmt_.at(o));
    }
    for (int p = 0; p < f.passes; ++p) spec_.passes.push_back(lower_pass(p, members, outs, first_out));
    for (const Value* o : g_.outputs)
      if (f.row_values.count(o)) spec_.row_stores.emplace_back(first_out + output_index(o), var_.at(o));
    hoist_batch_norm_parts();
    return std::move(spec_);
  }

  // Whether buffer k is a row buffer of the laid-out reduction kernel: read once per row (stride 0 along
  // every reduced dim). A gathered buffer is a row buffer when its indices are too (Note [Gathered loads]).
  bool row_buffer(int k) const {
    const int nd = static_cast<int>(spec_.sizes.size());
    for (int b : {k, spec_.buffers[k].gather}) {
      if (b < 0) continue;
      for (int d = spec_.kept_dims; d < nd; ++d)
        if (spec_.buffers[b].strides[d] != 0) return false;
    }
    return true;
  }

  // The element buffers value v reads, directly or through the element values it is made of.
  int element_loads(const Value* v) const {
    const ReductionForm& f = *g_.reduction;
    std::set<int> bufs;
    std::set<const Value*> seen;
    std::vector<const Value*> stack{v};
    while (!stack.empty()) {
      const Value* u = stack.back();
      stack.pop_back();
      if (!seen.insert(u).second || !buf_deps_.count(u)) continue;
      for (int b : buf_deps_.at(u))
        if (!row_buffer(b)) bufs.insert(b);
      for (const Value* d : val_deps_.at(u))
        if (!f.row_values.count(d)) stack.push_back(d);
    }
    return static_cast<int>(bufs.size());
  }

  // Whether element value v, computed in an earlier pass, is kept in the scratch row for a later one
  // instead of computed again: the target approves it (Target::may_keep_between_passes, within its
  // budget), and an approved value stays approved.
  bool stashable(const Value* v) {
    const Node* n = v->producer();
    if (!n->op()) return false;
    if (kept_.count(v)) return true;
    const KeptValue kv{v->tensor_type().dtype, n->op()->has(OpFlag::kExpensive), element_loads(v)};
    if (!target_.may_keep_between_passes(spec_, kv, kept_.size(), &scratch_budget_)) return false;
    kept_.insert(v);
    return true;
  }

  // The values pass p of a reduction kernel starts from: the element values its accumulators read, and the
  // element outputs it stores.
  std::vector<const Value*> pass_roots(int p, const std::set<const Node*>& members,
                                       const std::set<const Value*>& outs) const {
    const ReductionForm& f = *g_.reduction;
    std::vector<const Value*> roots;
    for (const Node* n : g_.nodes) {
      const Value* o = n->output();
      if (acc_of_.count(o) && f.ready.at(o) == p + 1) {
        const Value* in = n->args()[0].value;
        if (!f.row_values.count(in) && in->producer() && members.count(in->producer())) roots.push_back(in);
      }
      if (!f.row_values.count(o) && outs.count(o) && f.phase.at(o) == p) roots.push_back(o);
    }
    return roots;
  }

  // Element values the pass computes: the closure of its roots over element values, stopping at
  // expensive values an earlier pass computed (they come from the scratch row: `*from_scratch`).
  std::set<const Value*> pass_values(std::vector<const Value*> stack, int p,
                                     std::set<const Value*>* from_scratch) {
    const ReductionForm& f = *g_.reduction;
    std::set<const Value*> needed;
    while (!stack.empty()) {
      const Value* v = stack.back();
      stack.pop_back();
      auto earlier = computed_in_.find(v);
      if (earlier != computed_in_.end() && earlier->second < p && stashable(v)) {
        from_scratch->insert(v);
        continue;
      }
      if (!needed.insert(v).second) continue;
      for (const Value* d : val_deps_.at(v))
        if (!f.row_values.count(d)) stack.push_back(d);
    }
    return needed;
  }

  // Pass p of a reduction kernel (Note [Reduction kernels]): the element values it computes or reads from
  // the scratch row, its loads, accumulators and element stores, then what it makes known after its loop.
  KernelPass lower_pass(int p, const std::set<const Node*>& members, const std::set<const Value*>& outs,
                        int first_out) {
    const ReductionForm& f = *g_.reduction;
    KernelPass pass;
    std::set<const Value*> from_scratch;
    const std::set<const Value*> needed = pass_values(pass_roots(p, members, outs), p, &from_scratch);
    for (const Value* v : from_scratch) {
      auto& src = spec_.passes[computed_in_.at(v)];
      if (std::find(src.stash_out.begin(), src.stash_out.end(), var_.at(v)) == src.stash_out.end()) {
        src.stash_out.push_back(var_.at(v));
        spec_.scratch.emplace_back(var_.at(v), compute_dtype(v->tensor_type().dtype));
      }
      pass.stash_in.push_back(var_.at(v));
    }
    for (const Value* v : needed) computed_in_.emplace(v, p);
    std::set<int> loads;
    for (const Node* n : g_.nodes) {
      const Value* o = n->output();
      bool accumulates = acc_of_.count(o) && f.ready.at(o) == p + 1;
      if (needed.count(o)) pass.body.push_back(stmt_.at(o));
      if (needed.count(o) || accumulates)
        for (int b : buf_deps_.at(o))
          if (!row_buffer(b)) loads.insert(b);
      if (accumulates) pass.accs.push_back(acc_of_.at(o));
      if (!f.row_values.count(o) && outs.count(o) && f.phase.at(o) == p)
        pass.stores.emplace_back(first_out + output_index(o), var_.at(o));
    }
    pass.loads.assign(loads.begin(), loads.end());
    // After the loop: the pass's reductions, then the row values they make known.
    for (const Node* n : g_.nodes) {
      const Value* o = n->output();
      if (acc_of_.count(o) && f.ready.at(o) == p + 1) {
        pass.after.push_back(finish_.at(o)(Expr::var(fmt::format("acc{}", acc_count_++))));
      }
    }
    for (const Node* n : g_.nodes) {
      const Value* o = n->output();
      if (f.row_values.count(o) && !acc_of_.count(o) && f.ready.at(o) == p + 1) pass.after.push_back(stmt_.at(o));
    }
    return pass;
  }

  // Note [batch_norm's per-channel part in reduction kernels]
  // In a reduction group batch_norm is one call per element, fj_batch_norm(x, w, b, mean, var, eps),
  // whose alpha = w / sqrt(var + eps) and beta = b - mean * alpha read only its per-channel operands.
  // Where those are row buffers (a channel per row: the kept dim of a channels-last mean over H and W,
  // efficientnet_b0's squeeze-and-excite), the two are computed once per row in the row prologue and the
  // element's call becomes fj_bn_apply(x, alpha, beta): the same operations on the same values, so the
  // same results, without a square root and a division per element (a column tile's loop cannot hoist them
  // itself: they differ from lane to lane).
  void hoist_batch_norm_parts() {
    const std::set<int> row_bufs(spec_.row_loads.begin(), spec_.row_loads.end());
    std::set<std::string> row_vars;
    for (const Stmt& st : spec_.row_prologue)
      if (st.kind == Stmt::kLet) row_vars.insert(st.name);
    std::function<bool(const Expr&)> invariant = [&](const Expr& e) {
      if (e.kind == ExprKind::kLoad) return row_bufs.count(e.buffer) > 0;
      if (e.kind == ExprKind::kVar) return row_vars.count(e.name) > 0;
      for (const ExprRef& a : e.args)
        if (!invariant(*a)) return false;
      return true;
    };
    std::map<std::string, std::string> made;  // the per-channel operands, printed -> the parts' prefix
    std::function<ExprRef(const ExprRef&)> rewrite = [&](const ExprRef& e) -> ExprRef {
      if (e->kind == ExprKind::kCall && e->name == "fj_batch_norm" && e->args.size() == 6 &&
          e->args[5]->kind == ExprKind::kLiteral &&
          std::all_of(e->args.begin() + 1, e->args.end(), [&](const ExprRef& a) { return invariant(*a); })) {
        std::string key;
        for (size_t i = 1; i < 6; ++i) key += print_expr(*e->args[i]) + ";";
        auto [it, fresh] = made.emplace(key, fmt::format("bn{}_", made.size()));
        const std::string alpha = it->second + "alpha", beta = it->second + "beta";
        const DType ct = e->args[5]->type;  // eps, a literal of the compute type
        if (fresh) {
          spec_.row_prologue.push_back(
              Stmt::let(alpha, ct, Expr::call("fj_bn_alpha", {e->args[1], e->args[4], e->args[5]}), "aten::batch_norm"));
          spec_.row_prologue.push_back(
              Stmt::let(beta, ct, Expr::call("fj_bn_beta", {e->args[2], e->args[3], Expr::var(alpha)}), "aten::batch_norm"));
        }
        return Expr::call("fj_bn_apply", {rewrite(e->args[0]), Expr::var(alpha), Expr::var(beta)});
      }
      std::vector<ExprRef> args;
      bool changed = false;
      for (const ExprRef& a : e->args) {
        args.push_back(rewrite(a));
        changed |= args.back() != a;
      }
      if (!changed) return e;
      auto copy = std::make_shared<Expr>(*e);
      copy->args = std::move(args);
      return copy;
    };
    for (KernelPass& pass : spec_.passes) {
      for (Stmt& st : pass.body) st.value = rewrite(st.value);
      for (auto& a : pass.accs) a.input = rewrite(a.input);
    }
  }

  int output_index(const Value* o) const {
    for (size_t i = 0; i < outputs_.size(); ++i)
      if (outputs_[i].value == o) return static_cast<int>(i);
    FJ_INTERNAL_ASSERT(false, "{} is not an output", o->name());
    return -1;
  }

  // Orders and merges the kept dims and the reduced dims separately (each by the strides of the first
  // buffer that varies along the row), decides the index type.
  void layout_reduction() {
    const ReductionForm& f = *g_.reduction;
    spec_.buffers = inputs_;
    for (auto& o : outputs_) spec_.buffers.push_back(o);
    const size_t nb = spec_.buffers.size();
    size_t main = 0;
    for (size_t k = 0; k < nb; ++k) {
      bool varies = false;
      for (int64_t d : f.dims) varies |= spec_.buffers[k].strides[d] != 0;
      if (varies) {
        main = k;
        break;
      }
    }
    std::vector<int64_t> kept, red;
    for (int64_t d = 0; d < static_cast<int64_t>(f.shape.size()); ++d)
      (std::count(f.dims.begin(), f.dims.end(), d) ? red : kept).push_back(d);
    std::vector<SymSizes> all(nb);
    for (size_t k = 0; k < nb; ++k) all[k] = spec_.buffers[k].strides;
    Dims merged;
    merged.strides.resize(nb);
    // Each of the two parts ordered by the main buffer's strides (outermost first), then merged.
    auto place = [&](std::vector<int64_t> dims) {
      const auto& ms = spec_.buffers[main].strides;
      std::stable_sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return sym_abs(ms[a]) > sym_abs(ms[b]); });
      Dims part = merge_dims(dims, f.shape, all);
      merged.sizes.insert(merged.sizes.end(), part.sizes.begin(), part.sizes.end());
      for (size_t k = 0; k < nb; ++k) merged.strides[k].insert(merged.strides[k].end(), part.strides[k].begin(), part.strides[k].end());
      SymInt n = 1;
      for (const SymInt& x : part.sizes) n *= x;
      return n;
    };
    spec_.rows = place(kept);
    spec_.kept_dims = static_cast<int>(merged.sizes.size());
    spec_.row_len = place(red);
    spec_.sizes = merged.sizes;
    spec_.numel = spec_.rows * spec_.row_len;
    for (size_t k = 0; k < nb; ++k) {
      auto& b = spec_.buffers[k];
      b.strides = merged.strides[k];
      b.extent = b.value->tensor_type().sym_extent();
    }
    spec_.index32 = fits_int32(spec_);
  }

  // pow with a literal exponent: the special cases ATen's CPU kernel takes, else fj_pow.
  // (For float16 ATen takes the special cases only for integral exponents: pow(-inf, 0.5) is +inf there,
  // sqrt(-inf) NaN in float32 and bfloat16.)
  ExprRef pow_scalar(const ExprRef& x, const Literal& exp, DType ct, bool reduced) {
    double p = std::holds_alternative<double>(exp) ? std::get<double>(exp)
               : std::holds_alternative<SymInt>(exp) ? static_cast<double>(std::get<SymInt>(exp))
                                                      : static_cast<double>(std::get<bool>(exp));
    if (is_floating(ct)) {
      if (p == 2) return Expr::call("fj_sq", {x});
      if (p == 3) return Expr::call("fj_cube", {x});
      if (p == 0.5 && !reduced) return Expr::call("fj_sqrt", {x});
      if (p == -0.5 && !reduced) return Expr::call("fj_rsqrt", {x});
      if (p == -1) return Expr::call("fj_reciprocal", {x});
      if (p == -2) return Expr::call("fj_reciprocal", {Expr::call("fj_sq", {x})});
    }
    return Expr::call("fj_pow", {x, Expr::lit(exp, ct)});
  }

  // Orders and merges the iteration dims, decides the index type.
  void layout() {
    spec_.buffers = inputs_;
    for (auto& o : outputs_) spec_.buffers.push_back(o);
    if (kernel_hooks().before_layout) kernel_hooks().before_layout(g_, spec_);
    const SymSizes& sizes = g_.shape;
    int64_t nd = static_cast<int64_t>(sizes.size());
    // Order dims by the first output's strides, outermost (largest stride) first; stable.
    std::vector<int64_t> perm(nd);
    std::iota(perm.begin(), perm.end(), 0);
    if (!outputs_.empty()) {
      const auto& os = outputs_[0].strides;
      std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
        if (sizes[a] == 1 || sizes[b] == 1) return false;
        return os[a] > os[b];
      });
    }
    std::vector<SymSizes> all(spec_.buffers.size());
    for (size_t k = 0; k < all.size(); ++k) all[k] = spec_.buffers[k].strides;
    std::set<int64_t> barriers;
    for (const auto& p : pieces_) barriers.insert(p.dim);
    // A buffer of a piece one index long along its dim reads index 0 there, whatever its stride: take
    // the stride that lets the dim merge with the next one (a cache's new position and its features,
    // one loop instead of a loop per position).
    for (size_t k = 0; k < spec_.buffers.size(); ++k) {
      if (spec_.buffers[k].piece < 0) continue;
      for (int q = spec_.buffers[k].piece; q >= 0; q = pieces_[static_cast<size_t>(q)].parent) {
        const KernelPiece& pc = pieces_[static_cast<size_t>(q)];
        if (pc.end - pc.start != 1) continue;
        auto at = std::find(perm.begin(), perm.end(), static_cast<int64_t>(pc.dim));
        auto next = std::find_if(at + 1, perm.end(), [&](int64_t d) { return sizes[d] != 1; });
        if (next != perm.end()) all[k][pc.dim] = all[k][*next] * sizes[*next];
      }
    }
    Dims m = merge_dims(perm, sizes, all, barriers);
    spec_.sizes = m.sizes;
    for (auto& p : pieces_) {
      const auto& [dim, scale] = m.barriers.at(p.dim);
      p.dim = dim;
      p.start *= scale;
      p.end *= scale;
    }
    spec_.pieces = std::move(pieces_);
    spec_.numel = 1;
    for (const SymInt& s : m.sizes) spec_.numel *= s;
    for (size_t k = 0; k < spec_.buffers.size(); ++k) {
      auto& b = spec_.buffers[k];
      b.strides = m.strides[k];
      b.extent = b.value->tensor_type().sym_extent();
    }
    spec_.index32 = fits_int32(spec_);
  }

  const FusionGroup& g_;
  const Target& target_;
  KernelSpec spec_;
  std::map<std::tuple<const Value*, int, bool, int>, int> loads_;  // (value, channel, frame, piece) -> buffer
  // Note [Cats of unequal items]: the piece of the node being emitted (-1: none), the piece each node
  // computes, the pieces (dims and ranges over the group's shape until layout()).
  int piece_ = -1;
  std::map<const Node*, int> owner_;
  std::vector<KernelPiece> pieces_;
  std::map<std::pair<const Node*, int>, int> piece_of_;  // (cat, item) -> piece
  // Reduction groups: whether the node being emitted is a row value in the squeezed frame (its dims are
  // the kept dims), and what each statement reads.
  bool frame_ = false;
  std::set<const Value*> deps_vals_;
  std::set<int> deps_bufs_;
  std::map<const Value*, Stmt> stmt_;
  std::map<const Value*, std::set<const Value*>> val_deps_;
  std::map<const Value*, std::set<int>> buf_deps_;
  std::map<const Value*, KernelAccumulator> acc_of_;
  // Reductions: the statement naming the result, given the accumulator's variable.
  std::map<const Value*, std::function<Stmt(ExprRef)>> finish_;
  std::map<const Value*, std::string> var_;
  // Results of cats with several items: each item's offset and value, and the result's strides.
  std::map<const Value*, std::vector<std::pair<SymInt, ExprRef>>> regions_;
  std::map<const Value*, SymSizes> cat_strides_;
  std::vector<KernelBuffer> inputs_, outputs_;
  // Reduction kernels' passes: the first pass computing each element value, the element values kept in the
  // scratch row between passes and what is left of its budget (Target::may_keep_between_passes), and the
  // accumulators so far (acc<k>).
  std::map<const Value*, int> computed_in_;
  std::set<const Value*> kept_;
  int64_t scratch_budget_ = Target::kScratchStart;
  int acc_count_ = 0;
};

}  // namespace

KernelSpec make_kernel_spec(const FusionGroup& group, const Target& target) {
  KernelSpec k = Builder(group, target).build();
  if (kernel_hooks().after_lowering) kernel_hooks().after_lowering(group, k);
  return k;
}

Device group_device(const FusionGroup& group) {
  FJ_INTERNAL_ASSERT(!group.outputs.empty(), "group {} has no outputs", group.id);
  return group.outputs.front()->tensor_type().device;
}

}  // namespace fusion_jit
