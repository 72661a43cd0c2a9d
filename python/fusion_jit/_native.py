"""Loads the native library (TORCH_LIBRARY registrations: torch.classes.fusion_jit.*, torch.ops.fusion_jit.*).

Looked for, in order: FUSION_JIT_LIBRARY (a path), the package's own lib/ (pip install), and the build/
directory of the source checkout the package sits in (./run build).
"""

import os

import torch

_NAME = "libfusion_jit_python.so"


def _library_path():
    # The one FUSION_JIT_* variable the package reads itself rather than through the option table
    # (torch.ops.fusion_jit.option, as _backend.py reads the others): it names the library that holds the
    # table, so it is read before that library is loaded. The table lists it only so that it is not
    # rejected as unknown.
    given = os.environ.get("FUSION_JIT_LIBRARY")
    if given:
        if not os.path.isfile(given):
            raise ImportError(f"fusion_jit: FUSION_JIT_LIBRARY={given}: no such file")
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "lib", _NAME), os.path.join(here, "..", "..", "build", _NAME)]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.normpath(c)
    raise ImportError(
        "fusion_jit: the native library was not found (looked for "
        + ", ".join(os.path.normpath(c) for c in candidates)
        + "); build it with `./run build` in the repository, `pip install` the repository, or set "
        "FUSION_JIT_LIBRARY to its path")


path = _library_path()
torch.ops.load_library(path)
GraphFunction = torch.classes.fusion_jit.GraphFunction
ops = torch.ops.fusion_jit
