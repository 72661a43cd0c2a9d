"""The torch.compile backend: AOT autograd hands over forward, backward and inference graphs of ATen ops;
each becomes a _CompiledGraph, which lowers and compiles the graph at its first call per input signature.

Note [Freezing]
With the freezing option (default off, as Inductor's), an inference graph's parameters and buffers are
constants of its plans instead of inputs: the passes then fold batch norm into the convolution before it,
prepack weights and fold whatever else is computed from constants alone (passes/prepack_rules.cpp, fold_rules.cpp). Which
inputs: those Dynamo marks static (the parameters and buffers of nn.Modules it inlines; also tensors the
user marked with torch._dynamo.mark_static_address), unless the graph mutates one or returns a view of
one (as Inductor's replace_params_with_constants). Training graphs (forward and backward) never freeze.
Freezing treats those tensors as constants, as Inductor's does: the plans compute with their values at
compilation. What the version counter can show is checked at each call, in one native call
(GraphFunction.frozen_changed; a Python loop over efficientnet_b0's 311 parameters took 0.27 ms): another
tensor object at a frozen position, a tensor changed in place through itself (its version counter moves:
an optimizer step, load_state_dict, `p.mul_()` under no_grad), or given new storage (`p.data = t`: its
data pointer moves). Such a change drops the graph's plans and compiles again with the new values, with
one warning; an input found changed twice is an input of the plans from then on. What no counter shows
is NOT seen: writes through `p.data` (`p.data.mul_()`, `p.data.copy_()`: `.data` is another tensor with
a version counter of its own), through numpy or DLPack views, and in place under torch.inference_mode to
an inference tensor (which has no version counter). After such a write call refreeze(model): it drops
the plans of every graph holding one of the model's tensors frozen, and their next call compiles with the
values as they are then. (With default settings nothing is frozen and every call reads the weights as
they are: Note [Weights reordered once per content], src/torch/executor.h.)
"""

import os
import threading
import time
import warnings
import weakref

import torch

from . import _attention, _native, _symbolic
from ._lowering import (LayoutMismatch, Unsupported, channels_last_activations, channels_last_weights, lower,
                        rng_kept, specialization_key)

_OPTION_TYPES = {
    "cuda_graphs": bool,
    "specialization_limit": int,
    "cache_dir": (str, os.PathLike),
    "enable_fusion": bool,
    "freezing": bool,
    "disable": (str, list, tuple),
    "dynamic_kernels": str,
    "remote_cache": str,
    "remote_cache_key_file": (str, os.PathLike),
}
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _option(name):
    """The FUSION_JIT_* variable `name` as the C++ option table parses it (src/support/options.cpp), read
    from the environment as it is now: the table's default where unset, a ValueError naming the variable
    and its value where it does not parse. Switches come back as "0" or "1", lists as a sorted comma list."""
    return _native.ops.option(name)


def _channels_last(opts):
    """Note [Channels-last plans] (src/torch/capture.h); the C++ side checks FUSION_JIT_DISABLE's names."""
    return _enabled("channels_last", opts)


def _enabled(rule, opts):
    """Whether a rule applied on the Python side is on: neither it nor its rule set is named by
    FUSION_JIT_DISABLE or the `disable` option."""
    names = set(_option("FUSION_JIT_DISABLE").split(",")) | set(opts.disable)
    return rule not in names and rule.split(".")[0] not in names


def _differentiated(example_inputs):
    """Whether AOT autograd will make a training graph (forward and backward) of this graph: grad mode
    on and an input that requires grad (its own test)."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def _strict():
    return _option("FUSION_JIT_STRICT") == "1"


def _dynamic_setting(opts):
    """dynamic_kernels, or FUSION_JIT_DYNAMIC where the option is not given ("auto" by default)."""
    return opts.dynamic_kernels or _option("FUSION_JIT_DYNAMIC")


class Options:
    """The backend's options, checked: an unknown name is a ValueError, a wrong type a TypeError."""

    def __init__(self, options=None, mode=None):
        if mode not in _MODES:
            raise ValueError(f"fusion_jit: unknown mode {mode!r} (known: {', '.join(str(m) for m in _MODES[1:])})")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"fusion_jit: options must be a dict, not {type(options).__name__}")
        self.specialization_limit = None  # None: FUSION_JIT_SPECIALIZATION_LIMIT, read by the C++ side
        self.cuda_graphs = _option("FUSION_JIT_CUDA_GRAPHS") == "1" or mode == "reduce-overhead"
        self.cache_dir = None
        self.enable_fusion = True
        self.freezing = _option("FUSION_JIT_FREEZING") == "1"
        self.disable = []  # passes and rules left out for this model (checked by the C++ side)
        self.dynamic_kernels = ""  # "": FUSION_JIT_DYNAMIC, read by the C++ side
        self.remote_cache = None   # None: FUSION_JIT_REMOTE_CACHE, read by the C++ side
        self.remote_cache_key_file = None
        for name, value in (options or {}).items():
            if name not in _OPTION_TYPES:
                raise ValueError(f"fusion_jit: unknown option {name!r} (known: {', '.join(_OPTION_TYPES)})")
            want = _OPTION_TYPES[name]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise TypeError(f"fusion_jit: option {name!r} must be a "
                                f"{getattr(want, '__name__', 'str or path')}, not {type(value).__name__}")
            if name == "specialization_limit" and value < 0:
                raise ValueError(f"fusion_jit: option 'specialization_limit' must be >= 0, not {value}")
            if name == "disable":
                value = [v for v in value.split(",") if v] if isinstance(value, str) else list(value)
                if not all(isinstance(v, str) for v in value):
                    raise TypeError("fusion_jit: option 'disable' must be a comma-separated str or a list of str")
            if name == "dynamic_kernels" and value not in ("auto", "on", "off"):
                raise ValueError(f"fusion_jit: option 'dynamic_kernels' must be 'auto', 'on' or 'off', not {value!r}")
            if name == "cache_dir":
                value = os.fspath(value)
                if not value:
                    raise ValueError("fusion_jit: option 'cache_dir' must not be empty")
            if name == "remote_cache_key_file":
                value = os.fspath(value)
            setattr(self, name, value)
        if (self.remote_cache is None) != (self.remote_cache_key_file is None):
            raise ValueError("fusion_jit: options 'remote_cache' and 'remote_cache_key_file' go together (entries "
                             "are code, signed with the key file's key)")


class _Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.clear()

    def clear(self):
        self.graphs = 0
        self.plans = 0
        self.kernels = 0
        self.fused_ops = 0
        self.fallback_ops = 0
        self.compile_ms = 0.0
        self.eager_graphs = 0
        self.eager_calls = 0
        self.frozen_inputs = 0
        self.lowerings = 0
        self.symbolic_plans = 0
        self.class_plans = 0
        self.class_instances = 0
        self.baseline = list(_native.ops.counters())


_stats = _Stats()
_graphs = weakref.WeakSet()   # every live _CompiledGraph, for reset()
_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


_RAN, _NO_PLAN, _EAGER = 0, 1, 2  # GraphFunction.run's status


def _symbols_and_values(values):
    """A binding ({symbol: value}) as the native calls take it: the symbols' names, their values."""
    return [str(s) for s in values], list(values.values())


class _CompiledGraph:
    """One FX graph: one plan per input signature, compiled at the first call with that signature. The
    signature table, the specialization limit and its warning are the C++ GraphFunction's (the same as
    for TorchScript modules); this class lowers the graph when the table has no plan for a signature.

    `freeze`: positions of the graph's inputs that are constants of the plan (Note [Freezing])."""

    def __init__(self, gm, name, opts, record=None, freeze=(), inference=False):
        # AOT autograd calls it with the list of arguments. An instance attribute: dynamo wraps backward
        # compilers' results with functools.wraps, which copies the instance's __dict__.
        self._boxed_call = True
        self.gm = gm
        self.name = name
        self.opts = opts
        limit = -1 if opts.specialization_limit is None else opts.specialization_limit
        self.fn = _native.GraphFunction(name, opts.enable_fusion, opts.cuda_graphs, limit, opts.disable,
                                        opts.dynamic_kernels)
        # The per-call methods, looked up once: each lookup on the script object makes a new method object
        # (2 of a small graph's 7 us per call).
        self._run = self.fn.run
        self._frozen_changed = self.fn.frozen_changed
        self.positions = None       # which arguments are tensor inputs of the plans (known after the first lowering)
        self.key_positions = []     # which are numbers the plans are specialized on
        self.all_tensors = False    # every argument is a tensor input: `args` is the input list
        self.outputs = {}           # specialization key -> output spec of the lowering
        self.eager_reason = None
        self.record = record        # explain(): a list that receives (name, plan text or reason)
        self.freeze = set(freeze)
        self.inference = inference  # an inference graph: no activations saved for a backward graph
        self.frozen = []            # positions of the frozen inputs as compiled (the native side holds the
                                    # tensors, their versions and data pointers, and checks them at each call)
        self.changes = {}           # position -> times its frozen tensor was found changed
        self.frozen_ids = set()     # id() of the frozen tensors as compiled (refreeze)
        self.lock = threading.Lock()
        # Note [Symbolic graphs]: a graph with symbolic sizes is lowered once, as its shape class's graph;
        # its later signatures are instances of that class.
        self.symbolic = (_symbolic.is_symbolic(gm) and _dynamic_setting(opts) != "off"
                         and _enabled("symbolic", opts))
        # Note [Plans of a shape class] (src/runtime/plan.h): its later signatures instances of one plan.
        self.class_plans = _enabled("symbolic.class", opts)
        self.template = None
        self.no_template = None     # why a symbolic graph has none (debugging)
        self.channels_last_copies = {}  # Note [Folded constants shared across signatures] (_lowering.py)
        with _stats.lock:
            _stats.graphs += 1
        _graphs.add(self)

    def __call__(self, args):
        if self.frozen and self._frozen_changed([args[i] for i in self.frozen]):
            self._unfreeze_changed(args)
        if self.eager_reason is None and self.positions is not None:
            if self.all_tensors:
                tensors, key = args, ""
            else:
                tensors = [args[i] for i in self.positions]
                key = specialization_key(args, self.key_positions)
            spec = self.outputs.get(key)
            status, outs = self._run(tensors, key)
            if status == _RAN and spec is not None:
                return [outs[v] if kind == "ir" else v for kind, v in spec]
            if status == _EAGER:
                self._report_warnings()
                return self._eager(args)
        return self._compile_and_run(args)

    def _unfreeze_changed(self, args):
        """Note [Freezing]: a frozen parameter or buffer was replaced or changed in place since the plans
        were compiled. The plans are dropped and the next lowering takes the new values; one found changed
        twice is from then on an input of the plans, read at each call."""
        with self.lock:
            changed = [self.frozen[k] for k in self.fn.frozen_changed([args[i] for i in self.frozen])]
            if not changed:
                return
            for i in changed:
                self.changes[i] = self.changes.get(i, 0) + 1
                if self.changes[i] >= 2:
                    self.freeze.discard(i)
            _warn_once((id(self), "frozen", tuple(changed)),
                       f"fusion_jit: {self.name}: frozen input(s) {changed} (parameters or buffers, constants "
                       f"of its plans under the freezing option) changed after compilation; compiling again "
                       f"(an input changed twice is read at each call from then on)")
            self.clear()

    def _report_warnings(self):
        for message in self.fn.take_warnings():
            warnings.warn(f"fusion_jit: {message}", RuntimeWarning, stacklevel=4)

    def _eager(self, args):
        with _stats.lock:
            _stats.eager_calls += 1
        return list(self.gm(*args))

    def _give_up(self, reason, args, results=None):
        if _strict():
            raise
        self.eager_reason = reason
        with _stats.lock:
            _stats.eager_graphs += 1
        _warn_once((id(self), "eager"), f"fusion_jit: {self.name} runs eagerly: {reason}")
        if self.record is not None:
            self.record.append((self.name, f"runs eagerly: {reason}\n"))
        return list(results) if results is not None else self._eager(args)

    def _compile_and_run(self, args):
        if self.eager_reason is not None:
            return self._eager(args)
        template = self.template  # (another thread may drop it meanwhile)
        if template is not None:
            results = self._from_template(template, args)
            if results is not None:
                return results
        t0 = time.perf_counter()
        freeze = {i for i in self.freeze if isinstance(args[i], torch.Tensor)}
        # Note [Weights reordered once per content] (src/torch/executor.h).
        memo = _enabled("weight_memo", self.opts)
        try:
            cl, layout = channels_last_weights(self.gm, freeze) if freeze and _channels_last(self.opts) else (set(), None)
            acts = set()
            if not cl and layout is None and self.inference and _channels_last(self.opts):
                # (Not in training: the forward's saved activations would be copied back to the layout
                # the backward graph was traced with.)
                acts, layout = channels_last_activations(self.gm, memo_weights=memo, frozen=freeze)
            try:
                low = lower(self.gm, args, freeze, cl, acts, symbolic=self.symbolic and self.template is None,
                            copies=self.channels_last_copies, memo_weights=memo)
            except ((LayoutMismatch, RuntimeError) if cl or acts else ()) as e:
                # Channels-last weights or activations are an optimization: where an op of the graph
                # refuses the layout (a view of a channels-last tensor that only a copy could give), lower
                # as traced.
                layout = f"layout: NCHW kept (channels-last failed: {e})\n"
                low = lower(self.gm, args, freeze)
        except Unsupported as e:
            return self._give_up(str(e), args)
        with _stats.lock:
            _stats.lowerings += 1
        tensors = [args[i] for i in low.tensor_positions]
        info = None
        if low.template is not None:
            # The symbolic graph's first signature is the first instance of its class's plan: that plan's
            # code is the one compile of the class.
            try:
                got = self._from_class(low.template, tensors, low.key,
                                       dict(zip(low.template.symbols, low.template.bind(args))))
            except TypeError:
                got = None
            if got is not None:
                info = got[0]
        if info is None and low.template is not None:
            # No plan of the class here: the class's graph at this call's sizes, built on its own.
            info = self._own_plan(low, tensors, args)
            if info is None:  # the template dropped: this call lowered again with numbers, its results kept
                try:
                    with rng_kept():
                        again = lower(self.gm, args, freeze, cl, acts, copies=self.channels_last_copies,
                                      memo_weights=memo)
                except Unsupported as e:
                    return self._give_up(str(e), args, low.results)
                again.results, again.no_template = low.results, self.no_template
                low = again
        try:
            if info is None:
                info = self.fn.add(tensors, low.key, low.ir, low.constants)
            compiled, kernels, fused, aten, _, _, added_here = info[:7]
        except (ValueError, TypeError, RuntimeError) as e:
            return self._give_up(f"compiling it failed: {e}", args, low.results)
        ms = (time.perf_counter() - t0) * 1000.0
        self.positions = low.tensor_positions
        self.key_positions = low.key_positions
        self.all_tensors = len(self.positions) == len(args)
        if not self.frozen and freeze:
            self.frozen = sorted(freeze)
            self.fn.set_frozen([args[i] for i in self.frozen])
            self.frozen_ids = {id(args[i]) for i in self.frozen}
        if not compiled:  # past the specialization limit: the lowering ran the graph eagerly
            self._report_warnings()
            with _stats.lock:
                _stats.eager_calls += 1
            return list(low.results)
        self.outputs[low.key] = low.outputs
        if low.template is not None:
            self.template = low.template
        elif low.no_template is not None:  # not tried again: each signature is lowered
            self.symbolic, self.no_template = False, low.no_template
        if added_here:
            with _stats.lock:
                _stats.plans += 1
                _stats.kernels += int(kernels)
                _stats.fused_ops += int(fused)
                _stats.fallback_ops += int(aten)
                _stats.compile_ms += ms
                _stats.frozen_inputs += len(freeze)
            if self.record is not None:
                head = (f"freezing: {len(freeze)} parameter(s) and buffer(s) are constants of the plan\n"
                        if freeze else "") + (layout or "")
                if low.template is not None:
                    if low.template.no_class is None:
                        head += (f"symbolic graph: {low.template.describe_sources()}; its later signatures are "
                                 f"instances of one plan of its shape class ({low.template.numbers} numbers are "
                                 f"expressions over its symbols)\n")
                    else:
                        head += (f"symbolic graph: {low.template.describe_sources()}; its later signatures are "
                                 f"its class's graph at their sizes ({low.template.numbers} numbers; no plan of "
                                 f"the class: {low.template.no_class})\n")
                elif low.no_template is not None:
                    head += f"symbolic graph: no template ({low.no_template}); each signature is lowered\n"
                self.record.append((self.name, head + self.fn.explain(tensors, low.key)))
        return list(low.results)

    def _own_plan(self, low, tensors, args):
        """The info of this signature's own plan, made from the class's graph of `low`'s template at this
        call's sizes (GraphFunction::add_at), its first run checked; None where that fails (the template is
        dropped: the caller lowers the call again with numbers)."""
        t = low.template
        values = dict(zip(t.symbols, t.bind(args)))
        try:
            return self.fn.add_at(tensors, low.key, t.class_ir, *_symbols_and_values(values), t.constants, True)[0]
        except (ValueError, TypeError, RuntimeError) as e:
            if _strict() and not isinstance(e, TypeError):
                raise
            self.symbolic, self.no_template = False, f"dropped at {t.describe(values)}: {e}"
            return None

    def _from_class(self, template, tensors, key, values):
        """Note [Plans of a shape class] (src/runtime/plan.h): (info, outputs) of this signature's plan as an
        instance of the plan of the template's shape class, built at its first use; None where it is not
        one (no class, a size outside it, the class refused: the caller builds the signature's own text).
        TypeError where an input is laid out otherwise than the class says."""
        if template.no_class is not None or not self.class_plans:
            return None
        try:
            info, outs, outside = self.fn.add_from_class(tensors, key, template.class_ir,
                                                         *_symbols_and_values(values), template.constants)
        except (ValueError, RuntimeError) as e:
            template.drop_class(f"refused at {template.describe(values)}: {e}")
            if _strict():
                raise
            return None
        if outside:
            if self.record is not None:
                self.record.append((self.name, f"symbolic graph: {template.describe(values)} is outside the class's "
                                               f"plan ({outside}); built from its own text\n"))
            return None
        with _stats.lock:
            _stats.class_plans += int(info[7])
        return info, outs

    def _from_template(self, template, args):
        """Note [Symbolic graphs]: this call's signature from the class's graph of the template (the class's
        plan evaluated, or a plan of its own from that graph at its sizes), built and run on `args` with its
        types checked. None where the call is to be lowered instead: inputs that bind no values or are laid
        out otherwise (the template kept), or a failure (the template dropped)."""
        t0 = time.perf_counter()
        got = template.instantiate(args)
        if got is None:
            return None
        spec, values = got
        tensors = [args[i] for i in self.positions]
        key = specialization_key(args, self.key_positions)
        try:
            got = self._from_class(template, tensors, key, values)
        except TypeError:
            return None  # an input laid out otherwise than the class's (a view): lowered
        from_class = got is not None
        info, outs = got if from_class else (None, None)
        if info is None:
            try:
                info, outs = self.fn.add_at(tensors, key, template.class_ir, *_symbols_and_values(values),
                                            template.constants, True)
            except TypeError:
                return None  # an input laid out otherwise than the class's (a view): lowered
            except (ValueError, RuntimeError) as e:
                # Not made again: from now on each signature is lowered.
                self.template, self.symbolic = None, False
                self.no_template = f"dropped at {template.describe(values)}: {e}"
                if _strict():
                    raise
                return None
        compiled, kernels, fused, aten, _, _, added_here = info[:7]
        if not compiled:  # past the specialization limit
            self._report_warnings()
            return self._eager(args)
        self.outputs[key] = spec
        if not outs:  # another thread added it
            status, outs = self.fn.run(tensors, key)
            if status != _RAN:
                return None
        if added_here:
            with _stats.lock:
                _stats.plans += 1
                _stats.symbolic_plans += 1
                _stats.class_instances += int(from_class)
                _stats.kernels += int(kernels)
                _stats.fused_ops += int(fused)
                _stats.fallback_ops += int(aten)
                _stats.compile_ms += (time.perf_counter() - t0) * 1000.0
                _stats.frozen_inputs += len(self.frozen)
            if self.record is not None:
                how = ("the class's plan evaluated there" if from_class
                       else "its own, from the class's graph at its sizes")
                self.record.append((self.name, f"symbolic graph: the plan of {template.describe(values)}, {how}\n"
                                    + self.fn.explain(tensors, key)))
        return [outs[v] if kind == "ir" else v for kind, v in spec]

    def clear(self):
        self.fn.clear()
        self.template = None
        self.channels_last_copies.clear()
        self.outputs.clear()
        self.positions = None
        self.frozen = []
        self.frozen_ids = set()
        self.fn.set_frozen([])
        self.eager_reason = None


def _freezable(gm):
    """Note [Freezing]: the positions of an inference graph's inputs that may be constants of its plans:
    the parameters and buffers of nn.Modules (which Dynamo marks static inputs), unless the graph mutates
    one or returns a view of one. Empty when AOT autograd gives no tracing context."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    n = len(gm.graph.find_nodes(op="placeholder"))
    if meta is None or len(meta.input_info) != n:
        return set()
    from torch._functorch._aot_autograd.schemas import MutationType
    aliased = {o.base_idx for o in meta.output_info if o.base_idx is not None}
    return {i for i in meta.static_input_indices
            if 0 <= i < n and i not in aliased and meta.input_info[i].mutation_type == MutationType.NOT_MUTATED}


def _decompositions():
    # Backward ops of elementwise activations, and softmax's, into elementwise ops and sums the fuser
    # joins with their neighbours; everything else stays as AOT autograd gives it.
    aten = torch.ops.aten
    from torch._decomp import get_decompositions
    return get_decompositions([
        aten.threshold_backward, aten.gelu_backward, aten.sigmoid_backward, aten.tanh_backward,
        aten.silu_backward, aten.hardswish_backward, aten.hardsigmoid_backward,
        aten._softmax_backward_data, aten._log_softmax_backward_data,
    ])


def _restore_addcdiv(gm):
    """Dynamo hands `torch.addcdiv(s, a, b, value=v)` over as `s + (a / b) * v` (its handle_addcdiv,
    which spares a graph break on the value). Eager's addcdiv computes s + v * a / b in one kernel, in
    float for float16 and bfloat16, where the three ops each round to the dtype: up to a few ulps apart
    where s and v * a / b cancel. The three nodes of one addcdiv call (one stack trace, whose line names
    addcdiv; the quotient and the product used once) become that addcdiv again."""
    import operator

    g = gm.graph
    changed = False
    for add in list(g.nodes):
        if add.op != "call_function" or add.target not in (torch.add, operator.add) or len(add.args) != 2 or add.kwargs:
            continue
        s, mul = add.args
        if (not isinstance(mul, torch.fx.Node) or mul.target not in (torch.mul, operator.mul) or len(mul.users) != 1
                or len(mul.args) != 2 or mul.kwargs):
            continue
        div, v = mul.args
        if (not isinstance(div, torch.fx.Node) or div.target not in (torch.div, operator.truediv)
                or len(div.users) != 1 or len(div.args) != 2 or div.kwargs):
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        traces = {n.meta.get("stack_trace") or "" for n in (add, mul, div)}
        trace = traces.pop()
        if traces or not trace.strip() or "addcdiv" not in trace.strip().splitlines()[-1]:
            continue
        with g.inserting_before(add):
            node = g.call_function(torch.addcdiv, (s, div.args[0], div.args[1]), {"value": v})
        node.meta = dict(add.meta)
        add.replace_all_uses_with(node)
        for n in (add, mul, div):
            g.erase_node(n)
        changed = True
    if changed:
        g.lint()
        gm.recompile()
    return gm


class _Backend:
    """A torch.compile backend with given options; `record` collects each graph's plan (explain)."""

    def __init__(self, opts, record=None):
        self.opts = opts
        self.record = record
        self.count = 0

    def _compiler(self, kind):
        def compile_graph(gm, example_inputs):
            self.count += 1
            freeze = _freezable(gm) if kind == "inference" and self.opts.freezing else ()
            return _CompiledGraph(gm, f"{kind} graph {self.count}", self.opts, self.record, freeze,
                                  inference=kind == "inference")
        return compile_graph

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        if self.opts.cache_dir is not None:
            _native.ops.use_cache_dir(self.opts.cache_dir)
        if self.opts.remote_cache is not None:
            _native.ops.use_remote_cache(self.opts.remote_cache, self.opts.remote_cache_key_file)
        aot = aot_autograd(fw_compiler=self._compiler("forward"), bw_compiler=self._compiler("backward"),
                           inference_compiler=self._compiler("inference"), decompositions=_decompositions)
        gm = _restore_addcdiv(gm)
        if _differentiated(example_inputs) and _enabled("attention.sdpa", self.opts):
            _attention.rewrite(gm, self.record, strict=_strict())
        return aot(gm, example_inputs)


def backend(gm, example_inputs, options=None, mode=None):
    """The "fusion_jit" backend of torch.compile (registered when Dynamo is imported, or by the entry point: Note [Registering the backend lazily])."""
    return _Backend(Options(options, mode))(gm, example_inputs)


def compile(model, *, dynamic=None, fullgraph=False, **options):
    """torch.compile(model, backend=fusion_jit) with the options checked now (ValueError, TypeError)."""
    opts = Options(options)
    return torch.compile(model, backend=_Backend(opts), dynamic=dynamic, fullgraph=fullgraph)


def stats():
    """Counters since the last reset(): graphs compiled by the backend (forward, backward, inference),
    plans (one per graph and input signature), kernels, fused_ops (IR nodes inside kernels),
    fallback_ops (IR nodes run through ATen per call of each plan), compile_ms (lowering and compiling,
    all plans), cache_hits and cache_misses (the on-disk kernel and plan cache), compiles (compiler
    invocations), eager_graphs (graphs given up on), eager_calls (calls run eagerly), frozen_inputs
    (parameters and buffers made constants of plans by the freezing option, summed over plans), lowerings
    (graphs run node by node and written as IR for a new signature), symbolic_plans (plans built from a
    symbolic graph's template instead: Note [Symbolic graphs]), class_plans (plans of a shape class built,
    once per symbolic graph: Note [Plans of a shape class]), class_instances (the symbolic_plans that are a
    class's plan evaluated at their sizes rather than built from their own text), plans_dropped (plans of signatures that
    reused another's kernels, dropped past FUSION_JIT_SHARED_PLANS per graph and built again if their
    signature came back; over the graphs alive now), remote_hits, remote_misses, remote_refused,
    remote_errors and remote_ms (the cache's remote tier on Redis, FUSION_JIT_REMOTE_CACHE: time spent in
    its operations, connects included)."""
    c = _native.ops.counters()
    dropped = sum(g.fn.plans_dropped() for g in list(_graphs))
    b = _stats.baseline
    with _stats.lock:
        return {
            "graphs": _stats.graphs, "plans": _stats.plans, "kernels": _stats.kernels,
            "fused_ops": _stats.fused_ops, "fallback_ops": _stats.fallback_ops,
            "compile_ms": _stats.compile_ms, "cache_hits": c[0] - b[0], "cache_misses": c[1] - b[1],
            "compiles": (c[2] - b[2]) + (c[3] - b[3]), "eager_graphs": _stats.eager_graphs,
            "eager_calls": _stats.eager_calls, "frozen_inputs": _stats.frozen_inputs,
            "lowerings": _stats.lowerings, "symbolic_plans": _stats.symbolic_plans,
            "class_plans": _stats.class_plans, "class_instances": _stats.class_instances,
            "plans_dropped": dropped, "remote_hits": c[4] - b[4], "remote_misses": c[5] - b[5],
            "remote_refused": c[6] - b[6], "remote_errors": c[7] - b[7], "remote_ms": (c[8] - b[8]) / 1000.0,
        }


def reset():
    """Clears the counters and every plan held in memory: the next call of each graph compiles again
    (from the on-disk cache when it has the plan). Dynamo's own caches are not touched."""
    for g in list(_graphs):
        g.clear()
    _warned.clear()
    with _stats.lock:
        _stats.clear()


def refreeze(model=None):
    """Note [Freezing]: the plans of every compiled graph that holds one of `model`'s parameters or buffers
    frozen (`model`: an nn.Module, or what torch.compile or fusion_jit.compile returned for one; None: every
    graph of the process) are dropped, so that each graph's next call compiles again with the tensors'
    values as they are then. Call it after changing frozen weights in a way the check at each call cannot
    see: through `.data` (`p.data.mul_()`, `p.data.copy_()`), numpy or DLPack views, or in place under
    torch.inference_mode. Kernels whose source did not change come from the kernel cache. Returns how many
    graphs it dropped."""
    if model is None:
        ids = None
    else:
        module = getattr(model, "_orig_mod", model)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"fusion_jit.refreeze: expected an nn.Module or a compiled one, got {type(model).__name__}")
        ids = {id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
    dropped = 0
    for g in list(_graphs):
        with g.lock:
            hit = g.frozen_ids if ids is None else g.frozen_ids & ids
            if hit:
                g.clear()
                dropped += 1
    return dropped


def explain(model, *inputs, file=None, **options):
    """Compiles `model` for `inputs` (running it once) and prints each graph's plan: its kernels, the ops
    run through ATen, and the reason for every fusion decision. Returns the text."""
    record = []
    compiled = torch.compile(model, backend=_Backend(Options(options), record))
    compiled(*inputs)
    graphs = sum(1 for name, _ in record if not name.startswith("torch graph"))  # (Dynamo-level rewrites)
    parts = [f"fusion_jit: {graphs} graph(s)"]
    for name, text in record:
        parts.append(f"== {name} ==\n{text}")
    text = "\n".join(parts)
    print(text, file=file)
    return text


class profile:
    """Times each step of every fusion_jit plan run inside the block:

        with fusion_jit.profile() as p:
            for _ in range(100):
                model(x)
        print(p.table())      # where the time went: our kernels, ATen compute, ATen other, by op
        p.summary()           # the same as a dict (milliseconds, summed over the block)

    ATen compute is convolution, GEMM and attention (oneDNN, cuDNN, cuBLAS); ATen other is every other op
    a plan runs through ATen (views, copies, embedding, pooling, ...). `plan_ms` is the plans' own wall
    time; what a caller measures beyond it is host overhead outside the plans (Dynamo's guards, the
    backend's Python wrapper). On CUDA a step's time is the host time to launch it. Profiling adds two
    clock reads per step; blocks do not nest."""

    def __enter__(self):
        _native.ops.profile_enable(True)
        self.entries = []
        return self

    def __exit__(self, *exc):
        self.entries = _native.ops.profile_read()
        _native.ops.profile_enable(False)
        return False

    def summary(self):
        """{"plan_runs", "plan_ms", "kernels_ms", "aten_compute_ms", "aten_other_ms", "steps": {kind: calls},
        "ops": {schema or "fj::kernel": (calls, ms)}} over the block."""
        rows = {name: (calls, ns / 1e6) for name, calls, ns in self.entries}
        get = lambda k: rows.get(k, (0, 0.0))
        out = {"plan_runs": get("plan")[0], "plan_ms": get("plan")[1]}
        for kind in ("kernels", "aten_compute", "aten_other"):
            out[kind + "_ms"] = get(kind)[1]
        out["steps"] = {kind: get(kind)[0] for kind in ("kernels", "aten_compute", "aten_other")}
        out["ops"] = {k: v for k, v in rows.items() if k not in ("plan", "kernels", "aten_compute", "aten_other")}
        return out

    def table(self, top=8):
        """The summary as text, per plan run, with the `top` costliest ops."""
        s = self.summary()
        n = max(s["plan_runs"], 1)
        lines = [f"{s['plan_runs']} plan runs, {s['plan_ms'] / n * 1000:.1f} us each:"]
        for kind in ("kernels", "aten_compute", "aten_other"):
            lines.append(f"  {kind:<13} {s[kind + '_ms'] / n * 1000:9.1f} us  {s['steps'][kind] / n:6.1f} steps")
        rest = s["plan_ms"] - s["kernels_ms"] - s["aten_compute_ms"] - s["aten_other_ms"]
        lines.append(f"  {'between steps':<13} {rest / n * 1000:9.1f} us")
        ops = sorted(s["ops"].items(), key=lambda kv: -kv[1][1])[:top]
        for name, (calls, ms) in ops:
            lines.append(f"    {name:<44} {ms / n * 1000:9.1f} us  x{calls / n:.1f}")
        return "\n".join(lines)
