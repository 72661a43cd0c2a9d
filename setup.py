"""Builds the native part of the fusion_jit package with CMake (see pyproject.toml for the rest).

The C++ build needs the torch the package will run with (its headers and libraries). pip builds in an
isolated environment without it, so torch is looked for in this order: FUSION_JIT_TORCH_DIR, an
importable torch, then the interpreter pip runs for (sys.executable) with the isolation's PYTHONPATH
removed. Needs cmake, g++ and the Debian packages of docs/building.md (libfmt-dev libssl-dev
nlohmann-json3-dev); tests and the CLI are not built.
"""

import os
import shutil
import subprocess
import sys
import time

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBS = ["libfusion_jit.so", "libfusion_jit_python.so"]


def torch_dir():
    given = os.environ.get("FUSION_JIT_TORCH_DIR")
    if given:
        return given
    try:
        import torch
        return os.path.dirname(torch.__file__)
    except ImportError:
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    r = subprocess.run([sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                       env=env, capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        raise RuntimeError("fusion_jit: torch (2.11.0) was not found for the C++ build; install torch first, or "
                           "set FUSION_JIT_TORCH_DIR to its package directory\n" + r.stderr)
    return r.stdout.strip().splitlines()[-1]


class BuildWithNative(build_py):
    def run(self):
        super().run()
        build = os.environ.get("FUSION_JIT_PIP_BUILD_DIR", os.path.join(ROOT, "build", "pip"))
        jobs = os.environ.get("FUSION_JIT_BUILD_JOBS", "2")
        cmake = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", f"-DFJ_TORCH_DIR={torch_dir()}",
                 f"-DFJ_PYTHON={sys.executable}", "-DFJ_BUILD_TESTS=OFF"]
        if shutil.which("ccache"):
            cmake.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        t0 = time.time()
        print(f"fusion_jit: building the native library in {build} (-j{jobs}; minutes on a cold build)", flush=True)
        subprocess.check_call(cmake)
        subprocess.check_call(["cmake", "--build", build, "--target", "fusion_jit_python", f"-j{jobs}"])
        out = os.path.join(self.build_lib, "fusion_jit", "lib")
        os.makedirs(out, exist_ok=True)
        for lib in LIBS:
            shutil.copy2(os.path.join(build, lib), os.path.join(out, lib))
        print(f"fusion_jit: native library built in {time.time() - t0:.0f} s", flush=True)


class NativeDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries shared libraries
        return True


setup(cmdclass={"build_py": BuildWithNative}, distclass=NativeDistribution)
