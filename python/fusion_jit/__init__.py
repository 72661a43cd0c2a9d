"""fusion_jit: a JIT fusion compiler for PyTorch, as a torch.compile backend.

    import fusion_jit
    model = torch.compile(model, backend="fusion_jit")
    model = torch.compile(model, backend="fusion_jit", options={"specialization_limit": 4})
    fusion_jit.stats()                 # graphs, kernels, fused_ops, fallback_ops, compile_ms, cache_hits, ...
    fusion_jit.explain(model, x)       # prints each graph's plan with its fusion decisions
    fusion_jit.reset()                 # clears the counters and the compiled plans held in memory
    fusion_jit.refreeze(model)         # freezing: the model's graphs compile again with its weights as they are
    with fusion_jit.profile() as p:    # times each plan step inside the block: p.table(), p.summary()
        model(x)
    fusion_jit.package(model, (x,), "model.fjpkg")    # an ahead-of-time package (_package.py)
    served = fusion_jit.load_package("model.fjpkg")  # runs with no capture and no compiler

Options (torch.compile's `options=`, or fusion_jit.compile's keyword arguments):
    cuda_graphs           bool, replay each CUDA plan as a CUDA Graph (mode="reduce-overhead" sets it);
                          default FUSION_JIT_CUDA_GRAPHS or False
    specialization_limit  int >= 0, plans kept per graph (one per input signature); later signatures
                          run eagerly with one warning; default FUSION_JIT_SPECIALIZATION_LIMIT or 8
    cache_dir             str, the on-disk cache of compiled kernels and plans for this process from
                          then on; default FUSION_JIT_CACHE_DIR or ~/.cache/fusion_jit
    remote_cache          str, a Redis shared by a fleet as the cache's second tier for this process from
    remote_cache_key_file then on (redis://[user:password@]host[:port][/db] or unix:///path), with the
                          file of the key its entries are signed with; both or neither; default
                          FUSION_JIT_REMOTE_CACHE and FUSION_JIT_REMOTE_CACHE_KEY_FILE (docs/caching.md: "A
                          fleet's cache on Redis")
    enable_fusion         bool, False compiles one kernel per fusible op; default True
    freezing              bool, inference graphs take the module's parameters and buffers as constants
                          of their plans (batch norm folded into convolutions, weights prepared once);
                          treated as constants: a parameter replaced or changed in place through
                          itself is detected and the graph compiled again; writes through .data,
                          numpy or DLPack are not seen (call fusion_jit.refreeze(model));
                          default FUSION_JIT_FREEZING or False
    disable               str (comma-separated) or list of str: passes, rule sets and rules left out for
                          this model (FUSION_JIT_DISABLE's names, e.g. "prepack.linear_mkl",
                          "channels_last" and "weight_memo"), besides those FUSION_JIT_DISABLE names; an unknown or
                          process-wide name ("fusion", "cache", ...) is a ValueError; default none
    dynamic_kernels       "auto", "on" or "off": whether CPU kernels read their sizes as arguments, so
                          that a graph's signatures differing only in sizes share compiled kernels (auto:
                          from each graph's second signature on); default FUSION_JIT_DYNAMIC or "auto";
                          "off" also lowers a symbolic graph again for each signature (Note [Symbolic
                          graphs]: otherwise its later signatures are instances of the shape class its
                          first lowering wrote)

A graph that cannot be compiled (an op that mutates its input, a higher-order op, an unsupported dtype,
a compiler failure) runs eagerly, with one warning that says why; FUSION_JIT_STRICT=1 raises instead.
Errors in what the user gave surface as ValueError or TypeError.
"""

import sys

from . import _native
from ._backend import Options, backend, compile, explain, profile, refreeze, reset, stats
from ._lowering import Unsupported
from ._package import LoadedPackage, load_package, package

__all__ = ["backend", "compile", "explain", "profile", "refreeze", "reset", "stats", "Options", "Unsupported", "package",
           "load_package", "LoadedPackage"]
__version__ = "0.7.0"

# Note [Registering the backend lazily]
# torch.compile(backend="fusion_jit") finds the backend by name in Dynamo's registry. Importing
# torch._dynamo (and the parts of torch._inductor it takes along) costs more than `import torch` itself,
# which a process that only loads a package (load_package) or never compiles
# must not pay. So importing this package never imports Dynamo (tests/python/test_import.py):
# - installed, the torch_dynamo_backends entry point (pyproject.toml) names `fusion_jit:backend`, and Dynamo
#   loads it at its first lookup of the name (importing this package if it was not);
# - from a source checkout (no entry point), the backend is registered when Dynamo is imported: at once if
#   it already was, otherwise by a one-shot finder on sys.meta_path that runs torch._dynamo's module, then
#   registers (torch.compile imports torch._dynamo before it looks the backend up).
# Either way the name is registered once: where Dynamo's registry already knows it (its entry point, found
# by a lookup that is now importing this package), registering it too would be a duplicate (an assertion).


def _register_with_dynamo():
    from torch._dynamo.backends import registry
    if "fusion_jit" not in registry._BACKENDS and "fusion_jit" not in registry._COMPILER_FNS:
        registry.register_backend(backend, name="fusion_jit")


class _RegisterOnDynamoImport:
    """The finder of Note [Registering the backend lazily]: finds torch._dynamo as the finders after it on
    sys.meta_path do, and registers the backend once its module has run; it then leaves sys.meta_path."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # None: Python goes on as without this finder (and fails as it would)
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                _register_with_dynamo()
            except Exception as e:  # noqa: BLE001 - never fail torch._dynamo's import for our registration
                import warnings
                warnings.warn(f"fusion_jit: registering the backend with torch._dynamo failed: {e}")

        spec.loader.exec_module = exec_then_register
        return spec


def _register():
    if "torch._dynamo" in sys.modules:
        _register_with_dynamo()
    elif not any(isinstance(f, _RegisterOnDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnDynamoImport())


_register()
