#include "torch/executor.h"

#include <c10/core/GradMode.h>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <mutex>

#include "runtime/buffer_pool.h"
#include "torch/cuda_support.h"

#include "support/error.h"
#include "passes/passes.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

const c10::OperatorHandle& find_handle(const std::string& schema) {
  // Cached per schema: the lookup takes a lock and a hash of the name.
  static std::mutex mu;
  static std::unordered_map<std::string, c10::OperatorHandle>* cache =
      new std::unordered_map<std::string, c10::OperatorHandle>();
  std::lock_guard<std::mutex> g(mu);
  auto it = cache->find(schema);
  if (it != cache->end()) return it->second;
  size_t dot = schema.find('.');
  std::string name = schema.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : schema.substr(dot + 1);
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  FJ_CHECK(h.has_value(), "{}: no such operator in the dispatcher", schema);
  return cache->emplace(schema, *h).first->second;
}

// CPU storage for the outputs of generated kernels: large blocks come from the buffer pool and go back to
// it when freed; small ones from torch's CPU allocator. Storage made through it stays resizable (resize_
// on an output reallocates through this allocator, as it does on eager's outputs).
class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes < BufferPool::kMinPooled || Options::get().cpu_pool_mb == 0) return c10::GetCPUAllocator()->allocate(bytes);
    void* p = BufferPool::instance().acquire(bytes);
    return {p, new Block{p, bytes}, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  struct Block {
    void* p;
    size_t bytes;
  };
  static void release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    BufferPool::instance().release(b->p, b->bytes);
    delete b;
  }
};

PoolAllocator& pool_allocator() {
  static auto* a = new PoolAllocator();  // never destroyed: outputs may outlive static destruction
  return *a;
}

// Note [ATen steps' buffers from the pool]
// A plan's ATen steps allocate through torch's CPU allocator: a convolution's result, oneDNN's own
// buffers inside the call, a GEMM's output. On this project's machines each fresh multi-megabyte buffer
// faults its pages in again at every call (glibc gives freed memory above its trim threshold back to the
// kernel), and that cost, bimodal with the allocator's state, was larger than the demo's convolution
// itself (bench/RESULTS.md, issue 70: conv_bn_relu 2.6-3.7 ms per call in some processes, 0.9 ms with
// memory kept mapped). So while a plan runs on a thread, the CPU allocator serves requests of
// BufferPool::kMinPooled bytes and more from the buffer pool (the kernels' outputs' pool, up to
// FUSION_JIT_CPU_POOL_MB; 0 turns both off), and freed buffers go back to it, already mapped. Outside a
// plan's run (eager code in the same process, other threads) every request goes to the allocator torch
// had, unchanged: the wrapper is installed once, when the library loads, in its place (c10's
// SetCPUAllocator, at a higher priority), and holds it. Buffers handed out keep a context equal to their
// address, as raw_allocate (oneDNN's buffers through ideep) requires, and the raw deleter tells the pool's
// buffers from the wrapped allocator's by a table of the pool's buffers alive.
thread_local int t_plan_runs = 0;

class PlanRunAllocator final : public c10::Allocator {
 public:
  explicit PlanRunAllocator(c10::Allocator* base) : base_(base), base_raw_deleter_(base->raw_deleter()) {}

  c10::DataPtr allocate(size_t bytes) override {
    if (t_plan_runs == 0 || bytes < BufferPool::kMinPooled || Options::get().cpu_pool_mb == 0)
      return base_->allocate(bytes);
    void* p = BufferPool::instance().acquire(bytes);
    {
      std::lock_guard<std::mutex> g(mu_);
      live_[p] = bytes;
    }
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

  static PlanRunAllocator* installed;

 private:
  // The pool's buffer `p` given back, or false where `p` is not one of the pool's.
  static bool give_back(void* p) {
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> g(installed->mu_);
      auto it = installed->live_.find(p);
      if (it == installed->live_.end()) return false;
      bytes = it->second;
      installed->live_.erase(it);
    }
    BufferPool::instance().release(p, bytes);
    return true;
  }
  static void release(void* p) { give_back(p); }
  static void raw_delete(void* p) {
    if (!give_back(p) && installed->base_raw_deleter_) installed->base_raw_deleter_(p);
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_raw_deleter_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // the pool's buffers handed out and not yet freed: their sizes
};
PlanRunAllocator* PlanRunAllocator::installed = nullptr;

// Installed when the library loads (Note [ATen steps' buffers from the pool]); never destroyed: tensors
// may outlive static destruction.
[[maybe_unused]] const bool g_plan_run_allocator = [] {
  PlanRunAllocator::installed = new PlanRunAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(PlanRunAllocator::installed, /*priority=*/1);
  return true;
}();


// A type's sizes or strides as ATen takes them, without allocating. A plan's types are numbers; a symbolic
// one is read at its hint, specializing (Note [Symbolic sizes]).
using Ints = c10::SmallVector<int64_t, 6>;
Ints ints(const SymSizes& s) {
  Ints v;
  v.reserve(s.size());
  for (const SymInt& x : s) v.push_back(x);
  return v;
}

// An output tensor with eager's layout.
at::Tensor allocate_output(const TensorType& t) {
  const auto dtype = static_cast<at::ScalarType>(dtype_to_torch_code(t.dtype));
  if (t.device == Device::kCUDA)  // torch's caching allocator (a graph's private pool under capture)
    return at::empty_strided(ints(t.sizes), ints(t.strides), at::TensorOptions().dtype(dtype).device(at::Device(at::kCUDA, t.device_index)));
  return at::detail::empty_strided_generic(ints(t.sizes), ints(t.strides), &pool_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
}

// The bytes of a call's arena (Note [Static memory plan]), aligned as allocate_output's.
at::Tensor allocate_arena(const MemoryPlan& m) {
  if (m.device == Device::kCUDA)
    return at::empty_strided({m.arena_bytes}, {1},
                             at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, m.device_index)));
  return at::detail::empty_generic({m.arena_bytes}, &pool_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   at::kByte, std::nullopt);
}

// A kernel output of type `t` at byte `offset` of the arena (or of a dying input's storage, Note [Kernel
// results written over a dying input]): a tensor of its own on that storage.
at::Tensor arena_tensor(const at::Tensor& arena, const TensorType& t, int64_t offset) {
  const auto dtype = static_cast<at::ScalarType>(dtype_to_torch_code(t.dtype));
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(arena.storage()), arena.key_set(),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_and_strides(ints(t.sizes), ints(t.strides), offset / static_cast<int64_t>(c10::elementSize(dtype)));
  return at::Tensor(std::move(impl));
}

// A step's results that landed in the arena although the plan gave them storage of their own (an op that
// returns its input without saying so in its schema): replaced by copies.
void copy_out_of_arena(std::vector<c10::IValue>& results, const c10::StorageImpl* bytes) {
  for (c10::IValue& v : results)
    v = map_tensors(v, [&](const at::Tensor& t) {
      return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == bytes ? clone_same_layout(t) : t;
    });
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  at::parallel_for(0, n, grain, fn);
}

// Whether `in` has the sizes and strides the plan's type says, but for the strides of size-1 dims, which
// no kernel reads (lowering drops those dims) and which ATen leaves as it likes: contiguous() keeps a
// [1,16,1,1] tensor with strides [16,1,16,16] (it is contiguous), where the plan types [16,1,1,1].
bool same_layout(const at::Tensor& in, const TensorType& t) {
  if (!in.sizes().equals(ints(t.sizes))) return false;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    if (t.sizes[d] != 1 && in.strides()[d] != t.strides[d]) return false;
  return true;
}

// run_plan's check_layouts: an ATen step's tensor results against their types in the graph. A prepacking
// step's result (Note [Prepacked weights]) is in the library's own layout (oneDNN's opaque tensor, MKL's
// packed bytes), which its type does not describe: only its consumer reads it.
void check_step_layouts(const Node& n, const std::vector<c10::IValue>& results) {
  if (is_prepack(n.schema())) return;
  for (size_t i = 0; i < results.size() && i < n.outputs().size(); ++i) {
    const Value* v = n.output(i);
    if (!v->is_tensor() || !results[i].isTensor()) continue;
    const at::Tensor& r = results[i].toTensor();
    const TensorType& t = v->tensor_type();
    const bool ok = r.defined() && r.scalar_type() == static_cast<at::ScalarType>(dtype_to_torch_code(t.dtype)) &&
                    (same_layout(r, t) || (r.numel() == 0 && r.sizes().equals(ints(t.sizes))));
    FJ_CHECK(ok, "{}: {} {} is {} at run time; the graph's type is {}", n.schema(),
             n.outputs().size() > 1 ? fmt::format("result {}", i) : std::string("its result"), v->name(),
             r.defined() ? fmt::format("{} sizes {} strides {}", c10::toString(r.scalar_type()), c10::str(r.sizes()),
                                       c10::str(r.strides()))
                         : std::string("undefined"),
             t.str());
  }
}

// Ops whose results' layout the library chooses at run time, from the kernel it picks (AtenCall::conform).
bool library_chooses_layout(const std::string& schema) { return schema == "aten::scaled_dot_product_attention"; }

// `n`'s tensor results, each copied into its type's layout where the library gave it another: a conforming
// step's (AtenCall::conform) and a folded constant's.
void conform_layouts(const Node& n, std::vector<c10::IValue>& results) {
  for (size_t i = 0; i < results.size() && i < n.outputs().size(); ++i) {
    if (!n.output(i)->is_tensor() || !results[i].isTensor()) continue;
    const at::Tensor& r = results[i].toTensor();
    const TensorType& t = n.output(i)->tensor_type();
    if (!r.defined() || !r.has_storage() || !r.sizes().equals(ints(t.sizes)) || same_layout(r, t)) continue;
    at::Tensor c = at::empty_strided(r.sizes(), ints(t.strides), r.options());
    c.copy_(r);
    results[i] = std::move(c);
  }
}

// The first index of `t` at `p` (walked in t's logical order by its sizes and strides) outside [0, rows),
// or nullopt.
template <class T>
std::optional<int64_t> index_outside(const T* p, const TensorType& t, int64_t rows) {
  const int64_t n = t.numel(), nd = t.dim();
  const auto bad = [rows](T x) { return x < 0 || static_cast<int64_t>(x) >= rows; };
  if (n == 0) return std::nullopt;
  if (t.is_contiguous()) {
    for (int64_t i = 0; i < n; ++i)
      if (bad(p[i])) return static_cast<int64_t>(p[i]);
    return std::nullopt;
  }
  std::vector<int64_t> at(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (bad(p[off])) return static_cast<int64_t>(p[off]);
    for (int64_t d = nd - 1; d >= 0; --d) {
      off += t.strides[d];
      if (++at[d] < t.sizes[d]) break;
      off -= t.strides[d] * t.sizes[d];
      at[d] = 0;
    }
  }
  return std::nullopt;
}

// Note [Gathered loads]: a CPU kernel's indices are checked before it runs, and an index outside its
// table raises what eager raises there (embedding's IndexError, gather's RuntimeError naming the index,
// the dim and its size), before anything is written.
void check_gather_indices(const KernelSpec& spec, void* const* ptrs) {
  if (spec.device != Device::kCPU) return;
  for (const KernelBuffer& b : spec.buffers) {
    if (b.gather < 0) continue;
    const KernelBuffer& index = spec.buffers[b.gather];
    const TensorType& t = index.value->tensor_type();
    const int64_t rows = b.gather_rows;
    const auto bad = index.dtype == DType::kInt64 ? index_outside(static_cast<const int64_t*>(ptrs[b.gather]), t, rows)
                                                  : index_outside(static_cast<const int32_t*>(ptrs[b.gather]), t, rows);
    if (!bad) continue;
    TORCH_CHECK_INDEX(b.gather_dim >= 0, "index out of range in self");
    TORCH_CHECK(false, "index ", *bad, " is out of bounds for dimension ", b.gather_dim, " with size ", rows);
  }
}

// Torch's current stream on a device; none for the host.
void* current_stream(Device device, int index) { return device == Device::kCUDA ? current_cuda_stream(index) : nullptr; }

}  // namespace

namespace {

// Asks eager how its CPU kernels compute where that depends on the CPU (codegen's EagerCpuMath).
EagerCpuMath probe_eager_cpu_math() {
  EagerCpuMath m;
  const double inf = std::numeric_limits<double>::infinity();
  // A contiguous tensor of 64 elements: through oneDNN (NaN at +inf) where eager takes it for the dtype.
  auto onednn = [&](at::ScalarType t) { return at::gelu(at::full({64}, inf, at::TensorOptions().dtype(t))).isnan().all().item<bool>(); };
  m.gelu_onednn_f32 = onednn(at::kFloat);
  m.gelu_onednn_bf16 = onednn(at::kBFloat16);
  m.gelu_onednn_f16 = onednn(at::kHalf);
  return m;
}

// Registered when the library loads; run at the first kernel generated.
[[maybe_unused]] const bool g_probe_registered = (set_eager_cpu_math_probe(&probe_eager_cpu_math), true);

// Whether this build of torch has `schema` (the mkldnn:: ops exist only with oneDNN), for the rules that
// rewrite into such ops (passes/prepack_rules.cpp, fold_rules.cpp).
bool schema_in_dispatcher(const std::string& schema) {
  if (schema.rfind("mkldnn::", 0) == 0 && !at::hasMKLDNN()) return false;
  if (schema.rfind("mkl::", 0) == 0 && !at::hasMKL()) return false;
  const size_t dot = schema.find('.');
  return c10::Dispatcher::singleton()
      .findSchema({schema.substr(0, dot), dot == std::string::npos ? "" : schema.substr(dot + 1)})
      .has_value();
}
[[maybe_unused]] const bool g_schema_probe_registered = (set_schema_probe(&schema_in_dispatcher), true);

}  // namespace

bool onednn_bf16_supported() {
  static const bool supported = [] {
    if (!schema_in_dispatcher("mkldnn::_is_mkldnn_bf16_supported")) return false;
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow("mkldnn::_is_mkldnn_bf16_supported", "")
        .typed<bool()>()
        .call();
  }();
  return supported;
}

namespace {
[[maybe_unused]] const bool g_bf16_probe_registered = (set_onednn_bf16_probe(&onednn_bf16_supported), true);

}  // namespace

// Nodes whose op draws from a random generator (the dispatcher's nondeterministic_seeded tag), unless a
// literal `train=False` makes it the identity (dropout in eval mode), are marked as having side effects:
// passes then never merge, fold, remove or reorder them, and fusion leaves them to ATen in graph order,
// so they draw eager's numbers from eager's generator. Mutating schemas are marked too.
void mark_side_effects(Graph& g) {
  for (Node* n : g.nodes()) {
    const std::string& s = n->schema();
    if (n->is_constant() || n->side_effects() || s.rfind("aten::", 0) != 0) continue;
    size_t dot = s.find('.');
    auto h = c10::Dispatcher::singleton().findSchema({s.substr(0, dot), dot == std::string::npos ? "" : s.substr(dot + 1)});
    if (!h) continue;
    bool impure = h->schema().is_mutable();
    if (!impure && h->hasTag(at::Tag::nondeterministic_seeded)) {
      impure = true;
      const auto& params = h->schema().arguments();
      for (size_t i = 0; i < params.size() && i < n->args().size(); ++i)
        if (params[i].name() == "train" && !n->args()[i].is_value() &&
            std::holds_alternative<bool>(n->args()[i].literal) && !std::get<bool>(n->args()[i].literal))
          impure = false;
    }
    n->set_side_effects(impure);
  }
}

at::Tensor distinct_view(at::Tensor t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) t = t.narrow(d, 0, 1);
  return t;
}

at::Tensor clone_same_layout(const at::Tensor& t) {
  at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
  distinct_view(c).copy_(distinct_view(t));
  return c;
}

c10::IValue unalias_constants(c10::IValue result, const std::vector<c10::IValue>& constants,
                              const c10::StorageImpl* arena) {
  std::vector<std::pair<const void*, at::Tensor>> copies;  // the same tensor returned twice stays one
  auto fresh = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.has_storage()) return t;
    for (const auto& [impl, copy] : copies)
      if (impl == t.unsafeGetTensorImpl()) return copy;
    bool shared = arena && t.storage().unsafeGetStorageImpl() == arena;
    for (const c10::IValue& c : constants)
      shared = shared || (c.isTensor() && c.toTensor().has_storage() && c.toTensor().storage().is_alias_of(t.storage()));
    if (!shared) return t;
    copies.emplace_back(t.unsafeGetTensorImpl(), clone_same_layout(t));
    return copies.back().second;
  };
  return map_tensors(result, fresh);
}

c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& e : v.toTupleRef().elements()) items.push_back(map_tensors(e, fn));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(fn(t));
    return list;
  }
  return v;
}

void call_schema(const std::string& schema, std::vector<c10::IValue>& stack) { find_handle(schema).callBoxed(stack); }

namespace {

// Literals the IR has no kind for, converted by the schema: a device is written as a string ("cpu",
// "cuda:0"), a list of bools (output masks of backward ops) as a list of 0/1, a list of optional
// Scalars (oneDNN post-ops' scalars) as a list of ints or of floats.
void convert_literals(const c10::OperatorHandle& h, std::vector<c10::IValue>& stack) {
  for (size_t i = 0; i < stack.size() && i < h.schema().arguments().size(); ++i) {
    if (!stack[i].isString() && !stack[i].isIntList() && !stack[i].isDoubleList()) continue;
    c10::TypePtr t = h.schema().arguments()[i].type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (stack[i].isString() && t->kind() == c10::TypeKind::DeviceObjType) {
      stack[i] = c10::Device(stack[i].toStringRef());
    } else if (stack[i].isIntList() && t->kind() == c10::TypeKind::ListType &&
               t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::BoolType) {
      c10::List<bool> bools;
      for (int64_t b : stack[i].toIntVector()) bools.push_back(b != 0);
      stack[i] = bools;
    } else if ((stack[i].isIntList() || stack[i].isDoubleList()) && t->kind() == c10::TypeKind::ListType) {
      c10::TypePtr e = t->expectRef<c10::ListType>().getElementType();
      if (auto opt = e->cast<c10::OptionalType>()) e = opt->getElementType();
      if (e->kind() == c10::TypeKind::NumberType) {
        c10::List<std::optional<c10::Scalar>> scalars;
        for (const c10::IValue& v : stack[i].toListRef()) scalars.push_back(v.toScalar());
        stack[i] = scalars;
      }
    }
  }
}

}  // namespace

std::vector<c10::IValue> call_aten(const Node& n, const std::vector<c10::IValue>& value_args) {
  std::vector<c10::IValue> stack;
  size_t vi = 0;
  for (const Arg& a : n.args()) stack.push_back(a.is_value() ? value_args.at(vi++) : literal_to_ivalue(a.literal));
  const std::string& s = n.schema();
  if (s == "prim::ListConstruct") {
    if (n.output()->type().other == "Tensor?[]") {  // index's indices: None where a dim is not indexed
      c10::List<std::optional<at::Tensor>> list;
      for (auto& v : stack) list.push_back(v.isNone() ? std::optional<at::Tensor>() : v.toTensor());
      return {c10::IValue(list)};
    }
    c10::List<at::Tensor> list;
    for (auto& v : stack) list.push_back(v.toTensor());
    return {c10::IValue(list)};
  }
  if (s == "prim::ListUnpack") {
    auto list = stack.at(0).toTensorList();
    FJ_CHECK(list.size() == n.outputs().size(), "prim::ListUnpack: {} elements, {} expected", list.size(),
             n.outputs().size());
    std::vector<c10::IValue> out;
    for (size_t i = 0; i < list.size(); ++i) out.emplace_back(list.get(i));
    return out;
  }
  const c10::OperatorHandle& h = find_handle(s);
  convert_literals(h, stack);
  h.callBoxed(stack);
  FJ_INTERNAL_ASSERT(stack.size() == n.outputs().size(), "{} returned {} values, {} expected", s, stack.size(),
                     n.outputs().size());
  return stack;
}

// Note [ATen steps resolved at plan build]
// An ATen step used to find its operator by schema name at every call (a lock and a hash of the name),
// convert its literal arguments to IValues (lists allocated anew) and fix their types by the schema. All
// of that depends on the plan only: resolve_aten_steps does it once per plan instance, and run_plan copies
// the prepared stack (IValue copies: refcounts), puts the step's values in (moving those that die at the
// step, so that no extra reference outlives it) and calls the operator boxed. The cost per step before
// and after is in bench/RESULTS.md ("ATen steps resolved at plan build").
//
// Note [Views made at plan build]
// A view step's result (view, _unsafe_view, t, transpose, permute, expand, unsqueeze, squeeze.dim, alias,
// and slice.Tensor and select.int with literal arguments) has sizes and strides the plan's types give
// (plans are specialized on their inputs' layouts) and its base's storage offset (plus, for a slice, its
// start times the dim's stride in the base's type; for a select, the index times it: view_offset); the dispatcher's 0.3-0.7 us per call (eager's own cost) buys nothing else for an
// intermediate value. Such a step makes the alias directly: a tensor on the base's storage and version
// counter, with those sizes and strides. Where it would be seen: not for values the plan returns, or that
// another view step (made through the dispatcher) takes (eager's results are views with autograd's view
// metadata, `_base`), and at run time not where the base requires grad with grad mode on (the
// dispatcher's path records the view for autograd then; with grad mode off eager's view does not
// require grad either). Strides of size-1 dims may differ from what ATen would pick for them; nothing
// reads those (the kernels' layout check skips them, as does ATen's contiguity). A split, split_with_sizes
// or chunk whose list one ListUnpack reads, with every piece so hidden, makes its pieces the same way,
// each at the offset of the pieces before it (gpt2's q, k, v: 4.6 us per split through the dispatcher).
namespace {

bool is_fast_view_schema(const std::string& s) {
  static const std::set<std::string> kViews = {"aten::view",          "aten::_unsafe_view", "aten::t",
                                               "aten::transpose.int", "aten::permute",      "aten::expand",
                                               "aten::unsqueeze",     "aten::squeeze.dim",  "aten::alias",
                                               "aten::slice.Tensor",  "aten::select.int"};
  return kViews.count(s) > 0;
}

// The elements a slice or a select moves its result's start by, from its literal arguments and its
// input's type, as ATen computes it (negative start and index count from the end; start clamped to the
// dim); 0 for the other views; nullopt where an argument is computed at run time or out of range.
std::optional<int64_t> view_offset(const Node& n) {
  const bool slice = n.schema() == "aten::slice.Tensor", select = n.schema() == "aten::select.int";
  if (!slice && !select) return 0;
  for (const Arg& a : n.args())
    if (&a != &n.args()[0] && a.is_value()) return std::nullopt;
  const TensorType& in = n.args()[0].value->tensor_type();
  const int64_t rank = in.dim();
  auto int_at = [&](size_t i, std::optional<int64_t> dflt) -> std::optional<int64_t> {
    if (i >= n.args().size() || std::holds_alternative<None>(n.args()[i].literal)) return dflt;
    if (!std::holds_alternative<SymInt>(n.args()[i].literal)) return std::nullopt;
    return std::get<SymInt>(n.args()[i].literal);
  };
  auto dim = int_at(1, slice ? std::optional<int64_t>(0) : std::nullopt);
  if (!dim || rank == 0) return std::nullopt;
  const int64_t d = *dim < 0 ? *dim + rank : *dim;
  if (d < 0 || d >= rank) return std::nullopt;
  const int64_t size = in.sizes[d];
  auto at = int_at(2, slice ? std::optional<int64_t>(0) : std::nullopt);
  if (!at) return std::nullopt;
  int64_t i = *at < 0 ? *at + size : *at;
  if (select) {
    if (i < 0 || i >= size) return std::nullopt;  // eager raises
  } else {
    auto step = int_at(4, 1);
    if (!step || *step <= 0) return std::nullopt;
    i = std::clamp<int64_t>(i, 0, size);
  }
  return i * in.strides[d];
}

// Whether the op's first result aliases an argument (a view), by its schema.
bool returns_alias(const c10::OperatorHandle& h) {
  const auto& rets = h.schema().returns();
  return !rets.empty() && rets[0].alias_info() != nullptr;
}

// A dense CPU or CUDA tensor without bits that the dispatcher's view would carry over by its own rules
// (conjugate, negative, zero tensors) or keys that route ops elsewhere (Python subclasses,
// functionalization).
bool plain_tensor(const at::Tensor& t) {
  if (t.layout() != at::kStrided || !t.has_storage() || t.is_conj() || t.is_neg() || t._is_zerotensor()) return false;
  const c10::DispatchKeySet ks = t.key_set();
  return !ks.has(c10::DispatchKey::Python) && !ks.has(c10::DispatchKey::PythonTLSSnapshot) &&
         !ks.has(c10::DispatchKey::Functionalize) && (t.is_cpu() || t.is_cuda());
}

at::Tensor make_view(const at::Tensor& base, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides, base.storage_offset() + offset);
  impl->set_version_counter(base.unsafeGetTensorImpl()->version_counter());
  return at::Tensor(std::move(impl));
}

bool is_split_schema(const std::string& s) {
  return s == "aten::split.Tensor" || s == "aten::split_with_sizes" || s == "aten::chunk";
}

// A split or chunk (dim: argument 2, default 0) whose list only one ListUnpack reads, every piece hidden
// (`hidden`): its pieces are made at plan build, each at the sum of the earlier pieces' sizes along the
// dim times the dim's stride in the input's type.
template <typename Hidden>
void resolve_split(const Node& n, const std::vector<std::vector<Node*>>& users, const Hidden& hidden, AtenCall& c) {
  if (n.outputs().size() != 1 || n.args().empty() || !n.args()[0].is_value() || !n.args()[0].value->is_tensor())
    return;
  for (size_t i = 1; i < n.args().size(); ++i)
    if (n.args()[i].is_value()) return;
  const auto& lu = users[n.output()->id()];
  if (lu.size() != 1 || lu[0]->schema() != "prim::ListUnpack" || !hidden(n.output())) return;
  const TensorType& in = n.args()[0].value->tensor_type();
  int64_t dim = 0;
  if (n.args().size() > 2) {
    if (!std::holds_alternative<SymInt>(n.args()[2].literal)) return;
    dim = std::get<SymInt>(n.args()[2].literal);
  }
  if (dim < 0) dim += in.dim();
  if (dim < 0 || dim >= in.dim()) return;
  std::vector<std::vector<int64_t>> sizes, strides;
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const Value* p : lu[0]->outputs()) {
    if (!p->is_tensor() || !hidden(p)) return;
    const TensorType& t = p->tensor_type();
    if (t.dim() != in.dim()) return;
    sizes.push_back(t.sizes);
    strides.push_back(t.strides);
    offsets.push_back(at * in.strides[dim]);
    at += t.sizes[dim];
  }
  if (at != in.sizes[dim]) return;  // not the pieces of this input: our bug, left to ATen
  c.fast_split = true;
  c.piece_sizes = std::move(sizes);
  c.piece_strides = std::move(strides);
  c.piece_offsets = std::move(offsets);
}

// The dispatcher's operator for a schema, or nullptr (a prim:: node, a name it lacks).
const c10::OperatorHandle* dispatcher_op(const std::string& s) {
  if (s.rfind("prim::", 0) == 0) return nullptr;
  try {
    return &find_handle(s);
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The memory plan's questions about ops (runtime/memory_plan.h), answered from the dispatcher's schemas: a
// view by its first return's alias annotation, a mutation by the schema's mutability (an op the
// dispatcher lacks may mutate), and the in-place forms this adapter knows.
class DispatcherOpFacts final : public OpFacts {
 public:
  bool returns_alias(const Node& n) const override {
    const c10::OperatorHandle* op = dispatcher_op(n.schema());
    return op && fusion_jit::returns_alias(*op);
  }
  bool may_mutate(const Node& n) const override {
    const c10::OperatorHandle* op = dispatcher_op(n.schema());
    return !op || op->schema().is_mutable();
  }
  // Note [Results written into a dying argument] (runtime/memory_plan.cpp): a residual block's last
  // convolution whose post-ops are those its in-place form takes (add with alpha 1, then relu or none)
  // writes into the residual `other`, its value input 1, where this build of torch has that form.
  InPlaceForm in_place_form(const Node& n) const override {
    if (n.schema() != "mkldnn::_convolution_pointwise.binary") return {};
    const auto& a = n.args();
    if (a.size() != 13 || !a[0].is_value() || !a[1].is_value()) return {};
    auto is = [&](size_t i, const Literal& l) { return !a[i].is_value() && a[i].literal == l; };
    if (!is(8, std::string("add"))) return {};
    if (!is(9, None{}) && !is(9, int64_t{1}) && !is(9, 1.0)) return {};
    if (!is(10, None{}) && !is(10, std::string("relu"))) return {};
    constexpr const char* kForm = "mkldnn::_convolution_pointwise_.binary";
    if (!dispatcher_op(kForm)) return {};
    return {kForm, 1};
  }
};

}  // namespace

const OpFacts& dispatcher_op_facts() {
  static const DispatcherOpFacts facts;
  return facts;
}

const OpFacts& plan_op_facts() {
  static const TableOpFacts facts(dispatcher_op_facts());
  return facts;
}

void resolve_aten_steps(PlanInstance& inst, bool in_place) {
  const ExecutablePlan& plan = *inst.plan;
  inst.calls.assign(plan.steps.size(), AtenCall());
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const ExecStep& st = plan.steps[i];
    if (st.kernel >= 0 || st.node->is_constant()) continue;
    const Node& n = *st.node;
    AtenCall& c = inst.calls[i];
    for (const Arg& a : n.args()) {
      if (a.is_value()) {
        c.slots.push_back(static_cast<int>(c.stack.size()));
        c.stack.emplace_back();
      } else {
        c.stack.push_back(literal_to_ivalue(a.literal));
      }
    }
    for (const Value* v : n.value_inputs()) c.ids.push_back(v->id());
    FJ_INTERNAL_ASSERT(c.ids.size() == c.slots.size(), "{}: {} value arguments, {} value inputs", n.schema(),
                       c.slots.size(), c.ids.size());
    const std::string& s = n.schema();
    if (s == "prim::ListConstruct") {
      c.kind = n.output()->type().other == "Tensor?[]" ? AtenCall::Kind::kOptionalTensorList
                                                        : AtenCall::Kind::kTensorList;
    } else if (s == "prim::ListUnpack") {
      c.kind = AtenCall::Kind::kListUnpack;
    } else {
      c.kind = AtenCall::Kind::kOp;
      c.op = &find_handle(s);
      convert_literals(*c.op, c.stack);
      c.conform = library_chooses_layout(s);
      // Note [Weights reordered once per content]: the reorder of a weight given at each call.
      const auto& ins = plan.graph->inputs();
      if (s == "mkldnn::_reorder_convolution_weight" && !c.ids.empty() && c.slots.at(0) == 0 &&
          std::any_of(ins.begin(), ins.end(), [&](const Value* v) { return v->id() == c.ids[0]; }))
        c.memo = std::make_shared<ReorderMemo>();
    }
  }
  // Views made at plan build: decided last to first, since whether a view may be one depends on its users.
  const Graph& g = *plan.graph;
  std::vector<int> step_of(g.num_value_ids(), -1);  // value id -> the ATen step producing it
  for (size_t i = 0; i < plan.steps.size(); ++i)
    if (inst.calls[i].kind != AtenCall::Kind::kNone)
      for (const Value* v : plan.steps[i].node->outputs()) step_of[v->id()] = static_cast<int>(i);
  std::vector<bool> returned(g.num_value_ids(), false);
  for (const Value* v : g.outputs()) returned[v->id()] = true;
  const auto users = g.users();
  // Whether a view's result `v` is seen only where no view metadata is read: not returned, and no user is
  // a view made by the dispatcher or a list (whose elements reach ops that may return them: unbind...).
  auto hidden = [&](const Value* v) {
    if (returned[v->id()]) return false;
    for (const Node* u : users[v->id()]) {
      const int us = u->outputs().empty() ? -1 : step_of[u->output()->id()];
      if (us < 0) continue;  // a node inside a kernel
      const AtenCall& uc = inst.calls[us];
      if (uc.kind == AtenCall::Kind::kOp && returns_alias(*uc.op) && !uc.fast_view && !uc.fast_split) return false;
      if (uc.kind == AtenCall::Kind::kTensorList || uc.kind == AtenCall::Kind::kOptionalTensorList) return false;
    }
    return true;
  };
  for (size_t i = plan.steps.size(); i-- > 0;) {
    AtenCall& c = inst.calls[i];
    if (c.kind != AtenCall::Kind::kOp) continue;  // kernel steps have no node
    const Node& n = *plan.steps[i].node;
    if (is_split_schema(n.schema())) {
      resolve_split(n, users, hidden, c);
      continue;
    }
    if (!is_fast_view_schema(n.schema()) || n.outputs().size() != 1 ||
        !n.output()->is_tensor() || c.ids.empty() || !hidden(n.output()))
      continue;
    const auto offset = view_offset(n);
    if (!offset) continue;
    const TensorType& t = n.output()->tensor_type();
    c.fast_view = true;
    c.view_offset = *offset;
    c.view_sizes = t.sizes;
    c.view_strides = t.strides;
  }
  std::vector<int64_t> view_offset(plan.steps.size(), -1);
  for (size_t i = 0; i < plan.steps.size(); ++i)
    if (inst.calls[i].kind == AtenCall::Kind::kOp && inst.calls[i].fast_view) view_offset[i] = inst.calls[i].view_offset;
  inst.schedule = schedule_run(plan, view_offset);  // Note [Views folded into kernel loads]
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    AtenCall& c = inst.calls[i];
    const auto& rel = inst.schedule.release[i];
    c.move.clear();
    for (int id : c.ids) {
      const bool dies = std::find(rel.begin(), rel.end(), id) != rel.end();
      c.move.push_back(dies && std::count(c.ids.begin(), c.ids.end(), id) == 1);
    }
  }
  inst.memory = plan_memory(plan, in_place);
  inst.peak_bytes = plan_peak_bytes(plan, &inst.memory);
  // Note [Results written into a dying argument]: the argument is moved into the stack (it dies there).
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    AtenCall& c = inst.calls[i];
    const int j = inst.memory.in_place[i];
    if (j < 0 || c.kind != AtenCall::Kind::kOp || !c.move.at(j)) continue;
    c.in_place_op = &find_handle(plan_op_facts().in_place_form(*plan.steps[i].node).schema);
    c.in_place_slot = c.slots.at(j);
  }
}

int64_t eager_peak_bytes(const Graph& g) { return eager_peak_bytes(g, plan_op_facts()); }

int64_t plan_peak_bytes(const ExecutablePlan& plan, const MemoryPlan* memory) {
  return plan_peak_bytes(plan, plan_op_facts(), memory);
}

MemoryPlan plan_memory(const ExecutablePlan& plan, bool in_place) {
  return plan_memory(plan, plan_op_facts(), in_place);
}

std::string instance_explain(const PlanInstance& inst) {
  int fast = 0, folded = 0, in_place = 0, kernels_in_place = 0;
  for (size_t i = 0; i < inst.calls.size(); ++i) {
    const AtenCall& c = inst.calls[i];
    fast += c.fast_view || c.fast_split;
    folded += inst.schedule.folded.at(i);
    in_place += c.in_place_op != nullptr;
  }
  for (const auto& pairs : inst.memory.kernel_in_place) kernels_in_place += !pairs.empty();
  std::string views;
  if (fast > 0)
    views = fmt::format("views made at plan build: {}, {} of them folded into kernel loads (no step)\n", fast, folded);
  if (in_place > 0)
    views += fmt::format("results written into a dying argument's storage: {} step{}\n", in_place,
                         in_place == 1 ? "" : "s");
  if (kernels_in_place > 0)
    views += fmt::format("kernels writing over a dying input: {}\n", kernels_in_place);
  if (!inst.class_note.empty()) views += "shape class: none: " + inst.class_note + "\n";
  std::string line = views + fmt::format("memory: peak {} per call", format_bytes(inst.peak_bytes));
  if (inst.captured.eager_peak_bytes > 0)
    line += fmt::format(", eager {} ({:.0f}%)", format_bytes(inst.captured.eager_peak_bytes),
                        100.0 * static_cast<double>(inst.peak_bytes) / static_cast<double>(inst.captured.eager_peak_bytes));
  const MemoryPlan& m = inst.memory;
  if (m.arena_bytes > 0)
    line += fmt::format("; arena {} for {} intermediate{} of {}", format_bytes(m.arena_bytes), m.values,
                        m.values == 1 ? "" : "s", format_bytes(m.value_bytes));
  return line + "\n";
}

namespace {

// Whether `v` is a tensor that nothing but `v` refers to, nor to its storage, and that an op may write in
// place without autograd or a dispatch key of its own seeing it (Note [Results written into a dying
// argument]).
bool sole_reference(const c10::IValue& v) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  return t.defined() && plain_tensor(t) && t.use_count() == 1 && t.storage().use_count() == 1 &&
         !(t.requires_grad() && at::GradMode::is_enabled()) && (!t.is_inference() || c10::InferenceMode::is_enabled());
}

// Runs a resolved step on `stack` (its arguments); the step's results replace them.
void run_call(const AtenCall& c, const Node& n, std::vector<c10::IValue>& stack) {
  switch (c.kind) {
    case AtenCall::Kind::kOp:
      if (c.memo) {
        // Note [Weights reordered once per content]. The hash is of the bytes before the reorder reads
        // them: a weight written meanwhile hashes otherwise at the next call and is reordered again.
        const at::Tensor w = stack[c.slots[0]].toTensor();
        if (const auto h = ReorderMemo::hash_of(w)) {
          c10::IValue kept = c.memo->find(w, *h);
          if (kept.isNone()) {
            c.op->callBoxed(stack);
            c.memo->put(w, *h, stack.at(0));
          } else {
            stack.assign(1, std::move(kept));
          }
          return;
        }
      }
      if (c.fast_view || c.fast_split) {
        const at::Tensor& base = stack[c.slots[0]].toTensor();
        if ((!base.requires_grad() || !at::GradMode::is_enabled()) && plain_tensor(base)) {
          if (c.fast_view) {
            stack.assign(1, c10::IValue(make_view(base, c.view_sizes, c.view_strides, c.view_offset)));
            return;
          }
          c10::List<at::Tensor> pieces;
          pieces.reserve(c.piece_offsets.size());
          for (size_t i = 0; i < c.piece_offsets.size(); ++i)
            pieces.push_back(make_view(base, c.piece_sizes[i], c.piece_strides[i], c.piece_offsets[i]));
          stack.assign(1, c10::IValue(std::move(pieces)));
          return;
        }
      }
      if (c.in_place_op && sole_reference(stack[c.in_place_slot])) {
        // Note [Results written into a dying argument]: the in-place form takes that argument first.
        std::rotate(stack.begin(), stack.begin() + c.in_place_slot, stack.begin() + c.in_place_slot + 1);
        c.in_place_op->callBoxed(stack);
      } else {
        c.op->callBoxed(stack);
      }
      FJ_INTERNAL_ASSERT(stack.size() == n.outputs().size(), "{} returned {} values, {} expected", n.schema(),
                         stack.size(), n.outputs().size());
      return;
    case AtenCall::Kind::kOptionalTensorList: {  // index's indices: None where a dim is not indexed
      c10::List<std::optional<at::Tensor>> list;
      for (auto& v : stack) list.push_back(v.isNone() ? std::optional<at::Tensor>() : std::move(v).toTensor());
      stack.assign(1, c10::IValue(std::move(list)));
      return;
    }
    case AtenCall::Kind::kTensorList: {
      c10::List<at::Tensor> list;
      for (auto& v : stack) list.push_back(std::move(v).toTensor());
      stack.assign(1, c10::IValue(std::move(list)));
      return;
    }
    case AtenCall::Kind::kListUnpack: {
      auto list = stack.at(0).toTensorList();
      FJ_CHECK(list.size() == n.outputs().size(), "prim::ListUnpack: {} elements, {} expected", list.size(),
               n.outputs().size());
      std::vector<c10::IValue> out;
      out.reserve(list.size());
      for (size_t i = 0; i < list.size(); ++i) out.emplace_back(list.get(i));
      stack = std::move(out);
      return;
    }
    case AtenCall::Kind::kNone:
      break;
  }
  FJ_INTERNAL_ASSERT(false, "{}: step not resolved", n.schema());
}

}  // namespace

std::string cuda_graph_blocker(const ExecutablePlan& plan, const std::vector<c10::IValue>& inputs, int* device) {
  *device = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) continue;
    const at::Tensor& t = inputs[i].toTensor();
    if (!t.is_cuda()) return fmt::format("input {} is on {}, not on a GPU", i, t.device().str());
    if (*device >= 0 && t.get_device() != *device) return fmt::format("input {} is on another GPU", i);
    *device = t.get_device();
  }
  if (*device < 0) return "the plan has no CUDA tensor input";
  for (const auto& k : plan.kernels)
    if (k.spec.device != Device::kCUDA) return fmt::format("{} is a CPU kernel", k.spec.name);
  for (const auto& st : plan.steps) {
    if (!st.node || st.node->is_constant()) continue;
    for (const Value* v : st.node->outputs())
      if (v->is_tensor() && v->tensor_type().device != Device::kCUDA)
        return fmt::format("{} computes on the CPU", st.node->schema());
  }
  return "";
}

std::string input_signature(const std::vector<c10::IValue>& inputs, const c10::Device* as_device) {
  std::string key;
  key.reserve(64 * inputs.size());
  auto put = [&](int64_t x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
  for (const auto& v : inputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      put(1);
      if (!t.defined()) {
        put(-1);
        continue;
      }
      put(static_cast<int64_t>(t.scalar_type()));
      const c10::Device device = as_device ? *as_device : t.device();
      put(static_cast<int64_t>(device.type()) * 1024 + device.index());
      put(t.dim());
      for (auto s : t.sizes()) put(s);
      for (auto s : t.strides()) put(s);
      put(t.requires_grad());
    } else {
      put(2);
      key += c10::str(v.tagKind(), ":", v);  // non-tensor inputs specialize by value
      key += '\0';
    }
  }
  return key;
}

void optimize_captured_on_cuda(CapturedGraph& cap, std::set<std::string> skip) {
  set_device(*cap.graph, Device::kCUDA, 0);
  optimize_captured(cap, skip);
  set_device(*cap.graph, Device::kCUDA, 0);
}

std::string FoldedConstants::root_key(const c10::IValue& v) {
  if (v.isInt() || v.isDouble() || v.isBool() || v.isNone()) return c10::str(v.tagKind(), ":", v);
  if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().is_inference()) return "";
  const at::Tensor& t = v.toTensor();
  {
    std::lock_guard<std::mutex> g(mu_);
    roots_.try_emplace(t.unsafeGetTensorImpl(), t);
  }
  return fmt::format("{}@{}", static_cast<const void*>(t.unsafeGetTensorImpl()), t._version());
}

std::optional<std::vector<c10::IValue>> FoldedConstants::find(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  std::vector<c10::IValue> results;
  for (const Weak& w : it->second) {
    auto strong = w.lock();
    if (!strong) return std::nullopt;  // no plan holds it any more: made again
    results.emplace_back(at::Tensor(std::move(strong)));
  }
  return results;
}

void FoldedConstants::put(const std::string& key, const std::vector<c10::IValue>& results) {
  std::vector<Weak> kept;
  for (const c10::IValue& r : results) {
    if (!r.isTensor() || !r.toTensor().defined()) return;  // tensors only
    kept.emplace_back(r.toTensor().getIntrusivePtr());
  }
  std::lock_guard<std::mutex> g(mu_);
  entries_[key] = std::move(kept);
  if (entries_.size() > 2 * live_after_sweep_ + 16) {
    // Entries whose results every plan dropped are forgotten.
    for (auto it = entries_.begin(); it != entries_.end();) {
      bool live = true;
      for (const Weak& w : it->second) live = live && !w.expired();
      it = live ? std::next(it) : entries_.erase(it);
    }
    live_after_sweep_ = entries_.size();
  }
}

void FoldedConstants::clear() {
  std::lock_guard<std::mutex> g(mu_);
  entries_.clear();
  roots_.clear();
  live_after_sweep_ = 0;
}

void optimize_captured(CapturedGraph& cap, const std::set<std::string>& skip, FoldedConstants* shared) {
  // (A shape class's graph: its instances' own, Note [Plans of a shape class].)
  if (cap.graph->symbols().empty()) cap.eager_peak_bytes = eager_peak_bytes(*cap.graph);
  auto& constants = cap.constants;
  // Note [Folded constants shared across signatures]: each constant's key, by index ("" where not known).
  std::vector<std::string> keys(constants.size());
  const size_t roots = constants.size();
  for (size_t i = 0; i < roots && shared; ++i) keys[i] = shared->root_key(constants[i]);
  ConstantEvaluator eval = [&constants, &keys, shared](const Node& n) -> std::optional<std::vector<int64_t>> {
    std::vector<c10::IValue> args;
    std::string key = shared ? n.schema() : std::string();
    for (const Value* v : n.value_inputs()) {
      const auto index = static_cast<size_t>(v->producer()->constant_index());
      args.push_back(constants.at(index));
      const std::string& k = index < keys.size() ? keys[index] : std::string();
      key = key.empty() || k.empty() ? std::string() : key + " (" + k + ")";
    }
    if (!key.empty()) {
      for (const Arg& a : n.args())
        if (!a.is_value()) key += " " + literal_str(a.literal);
      // The results' types too: a folded tensor takes the strides its type says (below).
      for (const Value* o : n.outputs()) key += " -> " + o->type().str();
      key = sha256_hex(key);
    }
    auto keep = [&constants, &keys, &key](std::vector<c10::IValue> outs) {
      std::vector<int64_t> idx;
      for (size_t i = 0; i < outs.size(); ++i) {
        idx.push_back(static_cast<int64_t>(constants.size()));
        constants.push_back(std::move(outs[i]));
        keys.resize(constants.size());
        if (!key.empty()) keys.back() = fmt::format("{}#{}", key, i);
      }
      return idx;
    };
    if (!key.empty())
      if (auto found = shared->find(key)) return keep(std::move(*found));
    try {
      auto outs = call_aten(n, args);
      // A folded tensor takes the strides its type says (ATen may have chosen others from its inputs'
      // layouts: a product with a channels-last weight is channels-last), so that kernels reading it see
      // the layout they were generated for. oneDNN's reordered weights and MKL's packed ones keep what the
      // library gave them.
      const bool keep_layout = n.schema().rfind("mkldnn::", 0) == 0 || n.schema().rfind("mkl::", 0) == 0;
      if (!keep_layout) conform_layouts(n, outs);
      if (!key.empty()) shared->put(key, outs);
      return keep(std::move(outs));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  mark_side_effects(*cap.graph);
  run_pipeline(*cap.graph, eval, skip);
}

std::string message_of(const std::exception& e) {
  auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string s = c10_error ? c10_error->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

int prepack_at_load(PlanInstance& inst, std::map<std::string, c10::IValue>* shared, const std::string& where) {
  c10::NoGradGuard no_grad;
  Graph& g = *inst.plan->graph;
  std::vector<c10::IValue>& constants = inst.captured.constants;
  int evaluated = 0;
  for (Node* n : g.nodes()) {
    if (!is_prepack(n->schema())) continue;
    // The package is checked against damage, not against a graph written by hand: the step must fit the
    // operator's schema before the dispatcher sees it.
    FJ_CHECK(schema_in_dispatcher(n->schema()), "{}: its plan prepacks weights with {}, which this build of torch lacks",
             where, n->schema());
    const size_t arity = find_handle(n->schema()).schema().arguments().size();
    FJ_CHECK(n->outputs().size() == 1 && n->args().size() == arity,
             "{}: not a valid package: {} with {} arguments and {} results; its schema takes {} and gives 1", where,
             n->schema(), n->args().size(), n->outputs().size(), arity);
    std::vector<c10::IValue> args;
    std::string key = n->schema();
    bool all_constant = true;
    for (const Value* v : n->value_inputs()) {
      const Node* p = v->producer();
      all_constant &= p != nullptr && p->is_constant();
      if (!all_constant) break;
      const int64_t index = p->constant_index();
      FJ_CHECK(index >= 0 && index < static_cast<int64_t>(constants.size()),
               "{}: not a valid package: {} reads constant {}, of {}", where, n->schema(), index, constants.size());
      const c10::IValue& c = constants[static_cast<size_t>(index)];
      args.push_back(c);
      key += fmt::format(" {}", c.isTensor() ? static_cast<const void*>(c.toTensor().unsafeGetTensorImpl()) : nullptr);
    }
    if (!all_constant) continue;  // a weight given at each call: prepacked at each call, as in the JIT
    for (const Arg& a : n->args())
      if (!a.is_value()) key += " " + literal_str(a.literal);
    auto [it, fresh] = shared->try_emplace(key);
    if (fresh) {
      try {
        std::vector<c10::IValue> outs = call_aten(*n, args);
        FJ_CHECK(outs.size() == 1 && outs[0].isTensor(), "it gave {} results", outs.size());
        it->second = std::move(outs[0]);
      } catch (const std::exception& e) {
        shared->erase(it);
        detail::throw_error(fmt::format("{}: prepacking a weight ({} of {}) failed: {}", where, n->schema(),
                                        n->output()->type().str(), message_of(e)));
      }
    }
    constants.push_back(it->second);
    g.make_constant(n, static_cast<int64_t>(constants.size()) - 1);
    ++evaluated;
  }
  return evaluated;
}

int grad_requiring_input(const std::vector<c10::IValue>& inputs) {
  if (!c10::GradMode::is_enabled()) return -1;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].isTensor() && inputs[i].toTensor().defined() && inputs[i].toTensor().requires_grad())
      return static_cast<int>(i);
  return -1;
}

std::string grad_eager_reason(const std::vector<c10::IValue>& inputs) {
  const int i = grad_requiring_input(inputs);
  if (i < 0) return "";
  return fmt::format("input {} requires grad and grad mode is on: compiled plans record no autograd "
                     "history, so this signature runs eagerly (call under torch::NoGradGuard to compile it)",
                     i);
}

c10::IValue run_instance(PlanInstance& inst, const std::vector<c10::IValue>& inputs, bool cuda_graphs,
                         const std::string& name, bool* replayed) {
  *replayed = false;
  if (!cuda_graphs) return run_plan(inst, inputs);
  std::lock_guard<std::mutex> g(inst.graph_mu);
  if (!inst.graph_tried) {
    inst.graph_tried = true;
    int device = -1;
    inst.graph_note = cuda_graph_blocker(*inst.plan, inputs, &device);
    if (inst.graph_note.empty()) {
      try {
        inst.cuda_graph = std::make_unique<CudaGraphReplay>(
            inputs, [&inst](const std::vector<c10::IValue>& in) { return run_plan(inst, in); }, device);
      } catch (const Error& e) {
        inst.graph_note = e.what();
        log_warn("{}: this signature runs without CUDA Graphs: {}", name, e.what());
      }
    }
  }
  if (!inst.cuda_graph) return run_plan(inst, inputs);
  *replayed = true;
  return inst.cuda_graph->replay(inputs);
}

std::optional<ContentHash> ReorderMemo::hash_of(const at::Tensor& w) {
  if (!w.defined() || !w.has_storage() || !w.device().is_cpu() || !w.is_non_overlapping_and_dense() ||
      w.const_data_ptr() == nullptr)
    return std::nullopt;
  // Dense and non-overlapping: its elements fill numel * itemsize bytes from its data pointer. Pieces of a
  // fixed size, hashed on the pool and combined, so that the hash does not depend on the thread count.
  constexpr int64_t kPiece = int64_t{1} << 18;
  const auto* bytes = static_cast<const char*>(w.const_data_ptr());
  const int64_t n = w.numel() * static_cast<int64_t>(w.element_size());
  if (n < 2 * kPiece) return content_hash(bytes, static_cast<size_t>(n));
  std::vector<ContentHash> pieces(static_cast<size_t>((n + kPiece - 1) / kPiece));
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      pieces[i] = content_hash(bytes + i * kPiece, static_cast<size_t>(std::min(kPiece, n - i * kPiece)));
  });
  return combine_hashes(pieces.data(), pieces.size());
}

c10::IValue ReorderMemo::find(const at::Tensor& w, const ContentHash& h) {
  std::lock_guard<std::mutex> lock(mu);
  if (!kept || h != hash || w.scalar_type() != dtype || w.sizes() != c10::IntArrayRef(sizes) ||
      w.strides() != c10::IntArrayRef(strides))
    return {};
  return result;
}

void ReorderMemo::put(const at::Tensor& w, const ContentHash& h, const c10::IValue& r) {
  std::lock_guard<std::mutex> lock(mu);
  kept = true;
  hash = h;
  dtype = w.scalar_type();
  sizes = w.sizes().vec();
  strides = w.strides().vec();
  result = r;
}

namespace {

// The run loop's values on torch (Note [The run loop], runtime/run_loop.h): the call's IValues by value
// id, kernel outputs allocated with eager's strides from the buffer pool or placed in the arena, ATen
// steps through the dispatcher.
class TorchSteps final : public StepRunner {
 public:
  TorchSteps(const PlanInstance& p, const std::vector<c10::IValue>& inputs, bool check_layouts)
      : p_(p), plan_(*p.plan), check_layouts_(check_layouts), env_(plan_.graph->num_value_ids()) {
    const Graph& g = *plan_.graph;
    FJ_INTERNAL_ASSERT(inputs.size() == g.inputs().size());
    FJ_INTERNAL_ASSERT(p.calls.size() == plan_.steps.size(), "the plan's ATen steps were not resolved");
    for (size_t i = 0; i < inputs.size(); ++i) env_[g.inputs()[i]->id()] = inputs[i];
    // What launches take from torch: its threads and its current streams (plain functions: no allocation).
    launch_context_.parallel_for = parallel_for;
    launch_context_.grain = Options::get().cpu_grain;
    launch_context_.stream = current_stream;
  }

  const void* input(const KernelBuffer& b) override {
    const at::Tensor& in = env_[b.value->id()].toTensor();
    const TensorType& t = b.value->tensor_type();
    FJ_INTERNAL_ASSERT(same_layout(in, t), "input {} has layout {} {}, the plan expects {}", b.value->name(),
                       c10::str(in.sizes()), c10::str(in.strides()), t.str());
    return in.const_data_ptr();
  }
  const void* root(int id) override { return env_[id].toTensor().const_data_ptr(); }
  void* made_output(const KernelBuffer& b) override { return env_[b.value->id()].toTensor().mutable_data_ptr(); }
  bool sole_reference(int id) override { return fusion_jit::sole_reference(env_[id]); }
  void* write_over(const KernelBuffer& b, int over) override {
    // The output is a tensor of its own on the input's storage, with the plan's strides (which may differ
    // from the input's in size-1 dims: a [2,16,1,1] convolution result strided [16,1,16,16] where eager's
    // output is [16,1,1,1]).
    const at::Tensor& in = env_[over].toTensor();
    env_[b.value->id()] =
        arena_tensor(in, b.value->tensor_type(), in.storage_offset() * static_cast<int64_t>(in.element_size()));
    return const_cast<void*>(in.const_data_ptr());
  }
  void* allocate(const KernelBuffer& b, int64_t offset) override {
    if (offset >= 0 && !arena_.defined()) {
      arena_ = allocate_arena(p_.memory);
      arena_bytes_ = arena_.storage().unsafeGetStorageImpl();
      arena_ref_ = arena_.storage().getWeakStorageImpl();
    }
    at::Tensor out = offset >= 0 ? arena_tensor(arena_, b.value->tensor_type(), offset) : allocate_output(b.value->tensor_type());
    void* data = out.mutable_data_ptr();
    env_[b.value->id()] = std::move(out);
    return data;
  }
  void launch(int kernel, void* const* buffers) override {
    const KernelSpec& spec = plan_.kernels[kernel].spec;
    check_gather_indices(spec, buffers);
    plan_.launch(kernel, spec.buffers.back().value->tensor_type().device_index, buffers, launch_context_);
  }
  void constant(const Node& n) override { env_[n.output()->id()] = p_.captured.constants.at(n.constant_index()); }
  void call(size_t step, const Node& n) override {
    const AtenCall& c = p_.calls[step];
    stack_.assign(c.stack.begin(), c.stack.end());
    for (size_t j = 0; j < c.slots.size(); ++j)
      stack_[c.slots[j]] = c.move[j] ? std::move(env_[c.ids[j]]) : env_[c.ids[j]];
    run_call(c, n, stack_);
    if (c.conform) conform_layouts(n, stack_);
    if (check_layouts_) check_step_layouts(n, stack_);
    if (p_.memory.check[step]) copy_out_of_arena(stack_, arena_bytes_);
    for (size_t i = 0; i < stack_.size(); ++i) env_[n.output(i)->id()] = std::move(stack_[i]);
  }
  void release(int id) override { env_[id] = c10::IValue(); }
  void release_arena() override { arena_.reset(); }

  const c10::IValue& value(int id) const { return env_[id]; }
  const c10::StorageImpl* arena_bytes() const { return arena_bytes_; }

 private:
  const PlanInstance& p_;
  const ExecutablePlan& plan_;
  const bool check_layouts_;
  std::vector<c10::IValue> env_;
  std::vector<c10::IValue> stack_;
  LaunchContext launch_context_;
  // Note [Static memory plan]: one allocation for the call's intermediates, made where the first is
  // written and let go once the last is (its placed values hold it until they die).
  at::Tensor arena_;
  // Compared only: results must not land in it. The weak reference keeps the StorageImpl's memory (not
  // its bytes) for the whole call, so that no storage allocated after the arena is let go can take its
  // address and pass for it (its results were copied out, and views of one result came back apart).
  const c10::StorageImpl* arena_bytes_ = nullptr;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> arena_ref_;
};

}  // namespace

PooledAllocations::PooledAllocations() { ++t_plan_runs; }
PooledAllocations::~PooledAllocations() { --t_plan_runs; }

c10::IValue run_plan(const PlanInstance& p, const std::vector<c10::IValue>& inputs, bool check_layouts) {
  const Graph& g = *p.plan->graph;
  PooledAllocations pooled;  // Note [ATen steps' buffers from the pool]
  TorchSteps steps(p, inputs, check_layouts);
  run_steps(*p.plan, p.schedule, p.memory, steps);
  const auto env = [&](int id) -> const c10::IValue& { return steps.value(id); };
  c10::IValue result;
  switch (p.captured.output_kind) {
    case OutputKind::kSingle:
      result = env(g.outputs().at(0)->id());
      break;
    case OutputKind::kTuple: {
      std::vector<c10::IValue> items;
      for (const Value* o : g.outputs()) items.push_back(env(o->id()));
      result = c10::ivalue::Tuple::create(std::move(items));
      break;
    }
    case OutputKind::kList: {
      c10::List<at::Tensor> list;
      for (const Value* o : g.outputs()) list.push_back(env(o->id()).toTensor());
      result = list;
      break;
    }
  }
  return unalias_constants(std::move(result), p.captured.constants, steps.arena_bytes());
}


}  // namespace fusion_jit
