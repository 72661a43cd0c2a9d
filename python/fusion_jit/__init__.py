"""fusion_jit: a JIT fusion compiler for PyTorch, as a torch.compile backend.

    import fusion_jit
    model = torch.compile(model, backend="fusion_jit")
    model = torch.compile(model, backend="fusion_jit", options={"specialization_limit": 4})
    fusion_jit.stats()                 # graphs, kernels, fused_ops, fallback_ops, compile_ms, cache_hits, ...
    fusion_jit.explain(model, x)       # prints each graph's plan with its fusion decisions
    fusion_jit.reset()                 # clears the counters and the compiled plans held in memory
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
                          FUSION_JIT_REMOTE_CACHE and FUSION_JIT_REMOTE_CACHE_KEY_FILE (README: "A fleet's
                          cache on Redis")
    enable_fusion         bool, False compiles one kernel per fusible op; default True
    freezing              bool, inference graphs take the module's parameters and buffers as constants
                          of their plans (batch norm folded into convolutions, weights prepared once);
                          a parameter changed later is detected and the graph compiled again;
                          default FUSION_JIT_FREEZING or False
    disable               str (comma-separated) or list of str: passes, rule sets and rules left out for
                          this model (FUSION_JIT_DISABLE's names, e.g. "prepack.linear_mkl",
                          "channels_last" and "weight_memo"), besides those FUSION_JIT_DISABLE names; an unknown or
                          process-wide name ("fusion", "cache", ...) is a ValueError; default none
    dynamic_kernels       "auto", "on" or "off": whether CPU kernels read their sizes as arguments, so
                          that a graph's signatures differing only in sizes share compiled kernels (auto:
                          from each graph's second signature on); default FUSION_JIT_DYNAMIC or "auto";
                          "off" also lowers a symbolic graph again for each signature (Note [Symbolic
                          graphs]: otherwise its later signatures fill in the template of its first lowering)

A graph that cannot be compiled (an op that mutates its input, a higher-order op, an unsupported dtype,
a compiler failure) runs eagerly, with one warning that says why; FUSION_JIT_STRICT=1 raises instead.
Errors in what the user gave surface as ValueError or TypeError.
"""

import torch

from . import _native
from ._backend import Options, backend, compile, explain, profile, reset, stats
from ._lowering import Unsupported
from ._package import LoadedPackage, load_package, package

__all__ = ["backend", "compile", "explain", "profile", "reset", "stats", "Options", "Unsupported", "package",
           "load_package", "LoadedPackage"]
__version__ = "0.7.0"



def _register():
    # Installed, the package's torch_dynamo_backends entry point registers the backend when dynamo
    # first looks it up (registering here too would be a duplicate); from a source checkout, import does.
    from importlib.metadata import entry_points
    if any(ep.name == "fusion_jit" for ep in entry_points(group="torch_dynamo_backends")):
        return
    torch._dynamo.register_backend(name="fusion_jit")(backend)


_register()
