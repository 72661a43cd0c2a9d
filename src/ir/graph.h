// The graph IR of fusion_jit.
//
// Semantics, written once:
// - A Graph is a list of Nodes in a valid execution (topological) order, with input Values and output
//   Values. Every Value is defined once: by a graph input or by exactly one Node.
// - A Node is named by an ATen schema, `aten::add.Tensor`; its arguments follow that schema's positions.
//   An argument is either a Value (a tensor or a non-tensor computed at run time) or a Literal (a constant
//   known at compile time: None, bool, int, float, string, or a list of ints or floats; ints are SymInts).
// - Tensor Values carry their type from capture: dtype, sizes, strides, device. Sizes and strides are
//   SymInts (ir/sym.h): numbers, or in the graph of a shape class expressions over its symbols, each
//   decision on them recorded as a guard (Note [Symbolic sizes]).
// - Tensor constants (frozen weights) are Nodes `fj::constant(INDEX)`; INDEX refers to a table of
//   tensors held outside the IR by the torch adapter.
// - Broadcasting is numpy's (sizes right-aligned, size 1 stretches), except where the op table says an
//   argument is per-channel (batch_norm's weight, bias, mean, var index dim 1 of the input).
// - Dtype promotion is torch's (ir/dtype.h); fusible ops' output dtypes follow the op table's rule and the
//   verifier checks them.
// - Known ops (the op table, ir/ops.def) are pure. A Node with `side_effects` (an op that mutates or
//   whose schema is unknown to be pure) is never removed, duplicated or reordered by passes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/dtype.h"
#include "ir/sym.h"

namespace fusion_jit {

struct OpInfo;

enum class Device : uint8_t { kCPU, kCUDA };

struct TensorType {
  DType dtype = DType::kFloat32;
  SymSizes sizes;
  SymSizes strides;
  Device device = Device::kCPU;
  int device_index = 0;

  int64_t numel() const { return sym_numel(); }  // specializes the product, not each size
  SymInt sym_numel() const;
  bool is_symbolic() const { return sizes.is_symbolic() || strides.is_symbolic(); }
  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  bool is_contiguous() const;
  // The number of elements the strides reach: max offset + 1 (0 when empty).
  int64_t extent() const { return sym_extent(); }  // specializes the expression, not each size
  SymInt sym_extent() const;
  bool operator==(const TensorType& o) const {
    return dtype == o.dtype && sizes == o.sizes && strides == o.strides && device == o.device &&
           device_index == o.device_index;
  }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
  // "f32[4,8]" with "{8,1}" strides when not contiguous and "@cuda:0" when not on CPU.
  std::string str() const;
};

SymSizes contiguous_strides(const SymSizes& sizes);
// The strides of a 4-d [N, C, H, W] tensor laid out channels-last (NHWC).
SymSizes channels_last_strides(const SymSizes& sizes);
// Whether `t` has `strides`, but for those of its size-1 dims, which no index reads.
bool same_strides(const TensorType& t, const SymSizes& strides);
// Whether `t` is laid out densely in one of eager's memory formats: contiguous, channels-last (4-d) or
// channels-last-3d (5-d), size-1 dims ignored (at::Tensor::is_contiguous for some MemoryFormat).
bool contiguous_in_some_format(const TensorType& t);
// Whether sizes `from` broadcast to `to` (numpy's rule: right-aligned, each dim 1 or equal).
bool broadcasts_to(const SymSizes& from, const SymSizes& to);

// Shape arithmetic that keeps symbols (Note [Symbolic sizes]); each throws Error naming the shapes where
// they do not fit.
// numpy's broadcasting of two shapes.
SymSizes broadcast_shapes(const SymSizes& a, const SymSizes& b);
// What reducing `dims` (in [0, rank)) leaves: the dims dropped, or kept as 1.
SymSizes reduced_shape(const SymSizes& sizes, const std::vector<int64_t>& dims, bool keepdim);
// view and reshape's result: `to` with at most one -1, inferred from the element count of `from`.
SymSizes view_shape(const SymSizes& from, const SymSizes& to);
// cat's result: the items' sizes along `dim` summed, the others equal.
SymSizes cat_shape(const std::vector<SymSizes>& items, int64_t dim);

// Non-tensor values are described by a kind name: int, float, bool, str, None, int[], Tensor[], ...
struct ValueType {
  std::optional<TensorType> tensor;  // set for tensors
  std::string other;                 // otherwise: the kind's name
  bool is_tensor() const { return tensor.has_value(); }
  std::string str() const { return tensor ? tensor->str() : other; }
};

struct None {
  bool operator==(const None&) const { return true; }
};
// Integers and lists of them are SymInts: numbers, or in a class's graph expressions over its symbols
// (a view's sizes, a slice's end), read as numbers where code needs them (Note [Symbolic sizes]).
using Literal = std::variant<None, bool, SymInt, double, std::string, SymSizes, std::vector<double>>;
std::string literal_str(const Literal& l);

class Node;

class Value {
 public:
  int id() const { return id_; }
  const ValueType& type() const { return type_; }
  ValueType& mutable_type() { return type_; }
  const TensorType& tensor_type() const;  // asserts is_tensor()
  bool is_tensor() const { return type_.is_tensor(); }
  Node* producer() const { return producer_; }  // nullptr for graph inputs
  std::string name() const { return "%" + std::to_string(id_); }

 private:
  friend class Graph;
  int id_ = 0;
  ValueType type_;
  Node* producer_ = nullptr;
};

struct Arg {
  Value* value = nullptr;  // set, or else the literal
  Literal literal;
  static Arg of(Value* v) { return Arg{v, None{}}; }
  static Arg lit(Literal l) { return Arg{nullptr, std::move(l)}; }
  bool is_value() const { return value != nullptr; }
};

class Node {
 public:
  const std::string& schema() const { return schema_; }  // "aten::add.Tensor"
  const OpInfo* op() const { return op_; }                // nullptr: not in the op table (opaque)
  const std::vector<Arg>& args() const { return args_; }
  std::vector<Arg>& mutable_args() { return args_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* output(size_t i = 0) const { return outputs_.at(i); }
  bool side_effects() const { return side_effects_; }
  void set_side_effects(bool s) { side_effects_ = s; }
  // Values among the arguments, in order (with repeats).
  std::vector<Value*> value_inputs() const;
  // For fj::constant nodes: the index of the tensor in the constants table.
  int64_t constant_index() const;
  bool is_constant() const { return schema_ == "fj::constant"; }

 private:
  friend class Graph;
  std::string schema_;
  const OpInfo* op_ = nullptr;
  std::vector<Arg> args_;
  std::vector<Value*> outputs_;
  bool side_effects_ = false;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Value* add_input(ValueType type);
  // Appends a node. Output types are given; ops of the table are linked by schema.
  Node* append(const std::string& schema, std::vector<Arg> args, std::vector<ValueType> output_types);
  // Inserts before `before` (nullptr: at the end).
  Node* insert(Node* before, const std::string& schema, std::vector<Arg> args,
               std::vector<ValueType> output_types);
  void add_output(Value* v) { outputs_.push_back(v); }

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  std::vector<Value*>& mutable_outputs() { return outputs_; }
  // Nodes in execution order.
  std::vector<Node*> nodes() const;
  size_t num_nodes() const { return nodes_.size(); }

  // Replaces every use of `from` (arguments and graph outputs) by `to`.
  void replace_all_uses(Value* from, Value* to);
  // Removes a node whose outputs are unused.
  void erase(Node* n);
  // Turns `n`, a node of one output, into fj::constant(index) in place: its output Value (and id) stays,
  // so plans that name the value by id still fit (a step evaluated once when a package loads).
  void make_constant(Node* n, int64_t index);
  // Users of each value, by value id: the nodes that take it as an argument (once per node).
  std::vector<std::vector<Node*>> users() const;
  // The users of one value, as users()[v->id()], without building the table.
  std::vector<Node*> users_of(const Value* v) const;
  int num_value_ids() const { return next_id_; }
  // Renumbers values in definition order, so that the printed form is canonical.
  void renumber();
  std::unique_ptr<Graph> clone() const;
  // Lines the passes leave for explain ("rewrites: decompose.softmax x2"). Not part of the text form:
  // graphs that print alike are the same program, whatever made them.
  std::vector<std::string>& notes() { return notes_; }
  const std::vector<std::string>& notes() const { return notes_; }
  // The hints of the symbols its sizes are expressions over (Note [Symbolic sizes]); empty when every
  // size is a number. Printed as "graph[s0=37](...)".
  const SymBindings& symbols() const { return symbols_; }
  void set_symbol(const std::string& name, int64_t hint) { symbols_[name] = hint; }
  void clear_symbols() { symbols_.clear(); }

 private:
  Value* new_value(ValueType type, Node* producer);
  std::vector<Value*> inputs_, outputs_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::string> notes_;
  SymBindings symbols_;
  int next_id_ = 0;
};

// The graph of a shape class at one binding of its symbols: every size, stride and integer literal the
// number its expression takes there, no symbols left. Throws Error naming a symbol `b` lacks, or a size that comes out
// negative. Valid as the class's program where the guards its builder recorded hold (Note [Symbolic sizes]).
std::unique_ptr<Graph> concretize(const Graph& g, const SymBindings& b);

// Note [Graphs of two sizes]
// A shape class's graph is made from two typed captures of one program at two sizes (a fuzzed graph replayed
// at two extents; a model captured at two input signatures), never from their text. generalize() walks
// `first` and `second` in lockstep: the same inputs, ops, arguments, dtypes, devices and outputs, and every
// literal but integers alike. It gives one symbol to each extent of `extents` that changes (first value ->
// second, both at least 2; the symbol's hint is the first), and each integer that differs (a size, a stride,
// an integer literal or a list's item; not a constant's index, and never a negative one) an expression over
// them worth both values: the simplest of a symbol, a product of two or three, a multiple, a sum of two, a
// symbol times a constant plus a constant. Strides that are exactly the contiguous strides of their sizes
// in both become the contiguous strides of the class's sizes. Any expression that fits is as good as another: is_instance() is the test of
// membership, and the caller checks that both captures pass it. Null, with `why` naming the first place
// where they differ, where the graphs differ in more than integers, an integer fits no expression, or none
// differs.
std::unique_ptr<Graph> generalize(const Graph& first, const Graph& second, const std::map<int64_t, int64_t>& extents,
                                  std::string* why);
// Whether `g` (a capture, all numbers) is the class's graph `cls` at the binding `at`: the same program, each
// integer of `cls` worth `g`'s there (strides as exactly as sizes). Where not, `why` names the first difference. `cls` is only read.
bool is_instance(const Graph& cls, const SymBindings& at, const Graph& g, std::string* why = nullptr);
// Whether `a` and `b` are one program but for their integers (generalize()'s walk, nothing fitted).
bool same_program(const Graph& a, const Graph& b);
// A hash of `g` with its integers left out: captures that may be instances of one class share it.
size_t structure_hash(const Graph& g);

// Moves every tensor of the graph to `device` (types only): a plan captured on CPU tensors becomes the
// plan of the same model on a GPU, for ahead-of-time CUDA compilation without a GPU.
void set_device(Graph& g, Device device, int index);

// Textual form: prints and parses back to an identical graph (ir/text.cpp).
std::string print_graph(const Graph& g);
std::unique_ptr<Graph> parse_graph(const std::string& text);
// Checks the invariants above and the op table's rules; throws InternalError naming the node.
void verify_graph(const Graph& g);

}  // namespace fusion_jit
