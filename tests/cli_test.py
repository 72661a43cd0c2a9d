"""The fusion-jit CLI: successful runs and every error case (exit code 2, one line naming the problem).

Usage: python tests/cli_test.py PATH/TO/fusion-jit   (FJ_CLI_TEST_CASES=TEXT: only the cases whose name holds TEXT;
FJ_CLI_TEST_SHARD=I/N: the I-th of N shares of the cases). Each case's time is printed with its result.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

CLI = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(prefix="fj-cli-test-")
# A kernel cache of this run's own: cases that must see a compile do not meet kernels of earlier runs.
os.environ["FUSION_JIT_CACHE_DIR"] = os.path.join(TMP, "cache")
results = []


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x * y + 1.0) - torch.tanh(x), x.relu()


class BitModel(torch.nn.Module):
    def forward(self, x):
        return x & 1


class Chain8(torch.nn.Module):
    def forward(self, x, y, z):
        a = torch.sigmoid(x + y) * z
        b = torch.tanh(a - 1.0) + x
        return torch.relu(b * 0.5) - torch.exp(-a)


MODEL = os.path.join(TMP, "model.pt")
torch.jit.script(Model()).save(MODEL)
BITS = os.path.join(TMP, "bits.pt")
torch.jit.script(BitModel()).save(BITS)
CHAIN8 = os.path.join(TMP, "chain8.pt")
torch.jit.script(Chain8()).save(CHAIN8)


def cli(*args, env=None):
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env)


# FJ_CLI_TEST_CASES=TEXT: only the cases whose name holds TEXT run (a quick check of one area).
ONLY = os.environ.get("FJ_CLI_TEST_CASES", "")
# FJ_CLI_TEST_SHARD=I/N: only every N-th case from the I-th (1-based) runs, so that N processes share the
# cases (CMakeLists.txt runs the sanitized build's in two, on two cores).
SHARD = os.environ.get("FJ_CLI_TEST_SHARD", "1/1")
try:
    SHARD_INDEX, SHARD_COUNT = (int(x) for x in SHARD.split("/"))
    assert 1 <= SHARD_INDEX <= SHARD_COUNT
except (ValueError, AssertionError):
    sys.exit(f"FJ_CLI_TEST_SHARD={SHARD!r}: expected I/N with 1 <= I <= N")
_seen = 0


def untimed(disable):
    """A FUSION_JIT_DISABLE value naming `disable` (comma list) and conv_timing, as the suite's environment does
    (CMakeLists.txt): a case that sets its own keeps its convolution decisions on the estimates."""
    return ",".join([n for n in disable.split(",") if n] + ["conv_timing"])

def case(name):
    def wrap(fn):
        global _seen
        _seen += 1
        if ONLY not in name or (_seen - 1) % SHARD_COUNT != SHARD_INDEX - 1:
            return fn
        start = time.monotonic()
        try:
            fn()
            results.append((name, None, time.monotonic() - start))
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            results.append((name, f"{type(e).__name__}: {e}", time.monotonic() - start))
        return fn

    return wrap


def expect_error(args, fragment, code=2, env=None):
    p = cli(*args, env=env)
    assert p.returncode == code, f"exit {p.returncode}, expected {code}; stderr: {p.stderr!r}"
    err = p.stderr.strip()
    assert fragment in err, f"{fragment!r} not in {err!r}"
    assert len(err.splitlines()) == 1, f"expected one line, got: {err!r}"
    assert "Traceback" not in err and "frame #" not in err


@case("run --check --json passes and reports")
def _():
    p = cli("run", MODEL, "--input", "f32[64,32]", "f32[32]", "--check", "--json", "--bench", "3")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    for k in ("check", "ops", "fused_groups", "kernels", "fallback_ops", "max_abs_err", "eager_ms", "fused_ms", "compile_ms"):
        assert k in j, k
    assert j["check"] == "pass", j
    # sigmoid(x*y+1) - tanh(x) is one group; relu(x) is another that reads x too, merged side by side
    # (Note [Horizontal fusion]): one kernel.
    assert j["kernels"] == 1 and j["fused_groups"] == 1, j
    assert j["ops"] == 6, j
    assert j["eager_ms"] > 0 and j["fused_ms"] > 0, j


@case("transposed, bf16 and 0-d specs")
def _():
    for specs in (["f32[32,64]{1,32}", "f32[64]"], ["bf16[8,16]", "bf16[16]"], ["f32[]", "f32[]"], ["f64[0,4]", "f64[4]"]):
        p = cli("run", MODEL, "--input", *specs, "--check", "--json")
        assert p.returncode == 0, (specs, p.stderr)
        assert json.loads(p.stdout)["check"] == "pass", (specs, p.stdout)


@case("--inputs and --save-outputs round trip through torch.save/torch.load")
def _():
    x, y = torch.randn(5, 7), torch.randn(7)
    inputs = os.path.join(TMP, "in.pt")
    torch.save([x, y], inputs)
    out = os.path.join(TMP, "out.pt")
    p = cli("run", MODEL, "--inputs", inputs, "--check", "--save-outputs", out)
    assert p.returncode == 0, p.stderr
    got = torch.load(out)
    ref = Model()(x, y)
    assert len(got) == 2
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)


@case("explain shows groups, reasons and the source on request")
def _():
    p = cli("explain", MODEL, "--input", "f32[64,32]", "f32[32]", "--dump-source")
    assert p.returncode == 0, p.stderr
    assert "group 0: 6 ops" in p.stdout and "merged side by side (horizontal)" in p.stdout, p.stdout
    assert "+ aten::" in p.stdout and "saves" in p.stdout, p.stdout
    assert 'extern "C" void fj_kernel_0' in p.stdout, p.stdout
    assert "memory: peak 16.0 KB per call, eager 24.0 KB (67%)" in p.stdout, p.stdout
    # The plan's build: compile time beside the size of the source compiled (issue 71).
    assert re.search(r"codegen [0-9.]+ ms, compile [0-9.]+ ms of [0-9.]+ KB of source\n", p.stdout), p.stdout
    # FUSION_JIT_DISABLE=horizontal keeps the two groups apart.
    p = subprocess.run([CLI, "explain", MODEL, "--input", "f32[64,32]", "f32[32]"], capture_output=True, text=True,
                       env=dict(os.environ, FUSION_JIT_DISABLE="horizontal"))
    assert p.returncode == 0, p.stderr
    assert "group 0: 5 ops" in p.stdout and "group 1: 1 op" in p.stdout and "side by side" not in p.stdout, p.stdout


@case("one kernel per op: the intermediates share an arena, and FUSION_JIT_DISABLE=arena allocates each alone")
def _():
    x, y = torch.randn(64, 32), torch.randn(32)
    inputs = os.path.join(TMP, "in_arena.pt")
    torch.save([x, y], inputs)
    ref = Model()(x, y)
    for disable, line in (("fusion", "memory: peak 24.0 KB per call, eager 24.0 KB (100%); arena 16.0 KB for 4 "
                                     "intermediates of 32.0 KB\n"),
                          ("fusion,arena", "memory: peak 24.0 KB per call, eager 24.0 KB (100%)\n")):
        env = dict(os.environ, FUSION_JIT_DISABLE=disable)
        p = subprocess.run([CLI, "explain", MODEL, "--input", "f32[64,32]", "f32[32]"], capture_output=True, text=True,
                           env=env)
        assert p.returncode == 0, p.stderr
        assert line in p.stdout, p.stdout
        out = os.path.join(TMP, "out_arena.pt")
        p = subprocess.run([CLI, "run", MODEL, "--inputs", inputs, "--check", "--save-outputs", out], capture_output=True,
                           text=True, env=env)
        assert p.returncode == 0, p.stderr
        for g, r in zip(torch.load(out), ref):
            torch.testing.assert_close(g, r)


class Residual(torch.nn.Module):
    """A stem convolution, then a residual block whose residual (the stem's result) dies at its last conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.c1, self.c2 = (torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(3))

    def forward(self, x):
        s = torch.relu(self.stem(x))
        return torch.relu(self.c2(torch.relu(self.c1(s))) + s)


@case("a dead residual takes its block's result, and FUSION_JIT_DISABLE=in_place leaves it out-of-place")
def _():
    model = os.path.join(TMP, "residual.pt")
    torch.jit.script(Residual().eval()).save(model)
    x = torch.randn(2, 8, 20, 20)
    inputs = os.path.join(TMP, "in_residual.pt")
    torch.save([x], inputs)
    line = "results written into a dying argument's storage: 1 step\n"
    for disable, present in (("", True), ("in_place", False)):
        env = dict(os.environ, FUSION_JIT_DISABLE=untimed(disable))
        p = subprocess.run([CLI, "explain", model, "--input", "f32[2,8,20,20]"], capture_output=True, text=True,
                           env=env)
        assert p.returncode == 0, p.stderr
        assert "epilogue.conv_add_relu x1" in p.stdout, p.stdout
        assert (line in p.stdout) == present, p.stdout
        p = subprocess.run([CLI, "run", model, "--inputs", inputs, "--check"], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(30, 16))

    def forward(self, ids, x):
        return torch.nn.functional.embedding(ids, self.table) * x


@case("an embedding is read inside its consumer's kernel, and FUSION_JIT_DISABLE=gather runs it through ATen")
def _():
    model = os.path.join(TMP, "embed.pt")
    m = torch.jit.script(Embed().eval())
    m.save(model)
    ids, x = torch.randint(0, 30, (4, 7)), torch.randn(4, 7, 16)
    inputs = os.path.join(TMP, "in_embed.pt")
    torch.save([ids, x], inputs)
    ref = m(ids, x)
    for disable, expected, absent in (("", "    aten::embedding ", "aten: aten::embedding"),
                                      ("gather", "runs through ATen (FUSION_JIT_DISABLE=gather)", "    aten::embedding ")):
        env = dict(os.environ, FUSION_JIT_DISABLE=disable)
        p = subprocess.run([CLI, "explain", model, "--inputs", inputs], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        assert expected in p.stdout and absent not in p.stdout, p.stdout
        out = os.path.join(TMP, "out_embed.pt")
        p = subprocess.run([CLI, "run", model, "--inputs", inputs, "--check", "--save-outputs", out],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        (got,) = torch.load(out)
        torch.testing.assert_close(got, ref)


@case("missing model file")
def _():
    expect_error(["run", os.path.join(TMP, "nope.pt"), "--input", "f32[4]"], "nope.pt: no such file")


@case("not a TorchScript file")
def _():
    bad = os.path.join(TMP, "bad.pt")
    with open(bad, "w") as f:
        f.write("hello")
    expect_error(["run", bad, "--input", "f32[4]"], "not a TorchScript model")


@case("wrong input count")
def _():
    expect_error(["run", MODEL, "--input", "f32[4]"], "takes 2 inputs, 1 given")


@case("malformed SPEC")
def _():
    expect_error(["run", MODEL, "--input", "f32[4", "f32[4]"], "input 0: malformed SPEC 'f32[4'")
    expect_error(["run", MODEL, "--input", "f32[4]", "q8[4]"], "input 1: unknown dtype 'q8'")
    expect_error(["run", MODEL, "--input", "f32[4,4]{1}", "f32[4]"], "has 2 sizes but 1 strides")


@case("a dtype the model rejects")
def _():
    expect_error(["run", BITS, "--input", "f32[4]"], "rejects these inputs")


@case("a model that rejects its inputs' shapes: exit 2, one line naming the inputs and eager's message (issue 13)")
def _():
    with torch.no_grad():
        try:
            Chain8()(torch.randn(4, 4), torch.randn(5, 3), torch.randn(4, 4))
            raise AssertionError("eager accepted mismatched shapes")
        except RuntimeError as e:
            eager = str(e)
    assert "must match the size of tensor b" in eager, eager
    expect_error(["run", CHAIN8, "--input", "f32[4,4]", "f32[5,3]", "f32[4,4]"],
                 "rejects these inputs (input 0 f32[4,4], input 1 f32[5,3], input 2 f32[4,4]): " + eager)
    expect_error(["explain", CHAIN8, "--input", "f32[4,4]", "f32[5,3]", "f32[4,4]"], "rejects these inputs")
    p = cli("run", CHAIN8, "--input", "f32[4,4]", "f32[4,4]", "f32[4,4]", "--check")
    assert p.returncode == 0 and "check: pass" in p.stdout, (p.stdout, p.stderr)


@case("numbers that overflow are usage errors naming the value (issue 13)")
def _():
    expect_error(["run", MODEL, "--input", "f32[99999999999999999999]", "f32[4]"],
                 "input 0: size 99999999999999999999 in SPEC 'f32[99999999999999999999]' is too large")
    expect_error(["run", MODEL, "--input", "f32[4294967296,4294967296]", "f32[4]"],
                 "input 0: SPEC 'f32[4294967296,4294967296]' has more elements than int64_t can count")
    expect_error(["run", MODEL, "--input", "f32[3,3]{99999999999999999999,1}", "f32[3]"],
                 "input 0: stride 99999999999999999999 in SPEC")
    expect_error(["run", MODEL, "--input", "f32[3,3]{4611686018427387904,1}", "f32[3]"],
                 "spans more memory than int64_t can address")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--seed", "99999999999999999999"],
                 "--seed 99999999999999999999: too large")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--bench", "4294967296"], "--bench 4294967296: too large")
    expect_error(["cache", "prune", "--max-size", "17179869184G"], "cache prune --max-size 17179869184G: too large")
    expect_error(["cache", "prune", "--max-size", "99999999999999999999"], "--max-size 99999999999999999999: too large")
    expect_error(["fuzz", "--graph-seeds", "18446744073709551616"], "'18446744073709551616' is too large")
    env = dict(os.environ, FUSION_JIT_CACHE_MAX_MB="17592186044416")
    p = subprocess.run([CLI, "cache", "stats"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "FUSION_JIT_CACHE_MAX_MB=17592186044416: too large" in p.stderr, (p.returncode, p.stderr)
    # The largest sizes that fit still work.
    p = cli("cache", "prune", "--max-size", "8589934591G")
    assert p.returncode == 0, p.stderr


@case("the host compiler's temporary directories are removed, after a compile and after a failed one (issue 13)")
def _():
    tmpdir = tempfile.mkdtemp(prefix="fj-tmpdir-", dir=TMP)
    for cxx, cache in (("g++", "cache-tmpdir-ok"), ("false", "cache-tmpdir-fail")):
        env = dict(os.environ, TMPDIR=tmpdir, FUSION_JIT_CXX=cxx, FUSION_JIT_CACHE_DIR=os.path.join(TMP, cache))
        p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]", "--json"],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        assert j["kernels"] == (1 if cxx == "g++" else 0), j
        left = [f for f in os.listdir(tmpdir) if f.startswith("fusion_jit-")]
        assert not left, f"FUSION_JIT_CXX={cxx} left {left} in TMPDIR"


@case("FUSION_JIT_CXX with several words: each command compiles for itself, not from another's cache (issue 13)")
def _():
    cache = os.path.join(TMP, "cache-cxx-words")
    # A compiler named by a path relative to the working directory, which has a space in its name: the
    # compile runs in a directory of its own (Note [The host compile in two steps]) and still finds it.
    work = os.path.join(TMP, "work dir")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "cxx"), "w") as f:
        f.write('#!/bin/sh\nexec g++ "$@"\n')
    os.chmod(os.path.join(work, "cxx"), 0o755)
    for cxx in ("g++", "g++ -fno-plt", "env g++", "./cxx"):
        env = dict(os.environ, FUSION_JIT_CXX=cxx, FUSION_JIT_CACHE_DIR=cache)
        p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check", "--json"],
                           capture_output=True, text=True, env=env, cwd=work)
        assert p.returncode == 0, (cxx, p.stderr)
        j = json.loads(p.stdout)
        assert j["check"] == "pass" and j["compiler_invocations"] == 1, (cxx, j)
        p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]", "--json"],
                           capture_output=True, text=True, env=dict(env, FUSION_JIT_ASSERT_NO_COMPILE="1"), cwd=work)
        assert p.returncode == 0 and json.loads(p.stdout)["compiler_invocations"] == 0, (cxx, p.stderr)


@case("without HOME the kernel cache is kept in memory, never under /tmp (issue 13)")
def _():
    shared = "/tmp/.cache/fusion_jit"
    existed = os.path.exists(shared)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "FUSION_JIT_CACHE_DIR")}
    p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check", "--json"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["check"] == "pass" and j["kernels"] == 1 and j["cache"]["hits"] == 0, j
    warnings = [line for line in p.stderr.splitlines() if "kernel cache" in line]
    assert len(warnings) == 1 and "memory only" in warnings[0] and "HOME" in warnings[0], p.stderr
    assert existed or not os.path.exists(shared), f"{shared} was created"
    p = subprocess.run([CLI, "cache", "stats"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "not used" in p.stdout, p.stdout


@case("a group- or world-writable cache directory is not used: one warning with the fix (issue 13)")
def _():
    cache = os.path.join(TMP, "cache-open")
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
    run = lambda *a, **kw: subprocess.run([CLI, *a], capture_output=True, text=True, env=dict(env, **kw))  # noqa: E731
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]")
    assert p.returncode == 0 and not p.stderr, p.stderr
    os.chmod(cache, 0o777)
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["check"] == "pass" and j["compiler_invocations"] == 1 and j["cache"]["hits"] == 0, j
    warnings = [line for line in p.stderr.splitlines() if "kernel cache" in line]
    assert len(warnings) == 1 and f"chmod go-w {cache}" in warnings[0], p.stderr
    p = run("cache", "stats")
    assert "not used" in p.stdout and "group- or world-writable" in p.stdout, p.stdout
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]", "--json", FUSION_JIT_ASSERT_NO_COMPILE="1")
    assert p.returncode == 2, "the open directory's entries were not loaded"
    os.chmod(cache, 0o700)
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]", "--json", FUSION_JIT_ASSERT_NO_COMPILE="1")
    assert p.returncode == 0 and json.loads(p.stdout)["cache"]["hits"] >= 2, p.stderr


@case("--device cuda without a driver")
def _():
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--device", "cuda"], "no CUDA driver found")


@case("bad options")
def _():
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--bogus"], "unknown option --bogus")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--bench", "x"], "--bench expects an integer")
    expect_error(["run", MODEL], "give the inputs")
    expect_error(["frobnicate"], "unknown command 'frobnicate' (run, explain, compile, package, load, fuzz, cache or calibrate)")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--device", "tpu"], "unknown device")


@case("bad --inputs file")
def _():
    junk = os.path.join(TMP, "junk.pt")
    with open(junk, "wb") as f:
        f.write(b"\x00\x01junk")
    expect_error(["run", MODEL, "--inputs", junk], "not a file written by torch.save")
    expect_error(["run", MODEL, "--inputs", os.path.join(TMP, "missing.pt")], "cannot open")


@case("--save-outputs into a missing directory leaves nothing behind")
def _():
    target = os.path.join(TMP, "no", "such", "dir", "out.pt")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--save-outputs", target], "cannot write")
    assert not os.path.exists(os.path.dirname(target))


@case("unknown FUSION_JIT_ variable is rejected by name")
def _():
    env = dict(os.environ, FUSION_JIT_DUMPZ="ir")
    p = subprocess.run([CLI, "run", MODEL, "--input", "f32[4]", "f32[4]"], capture_output=True, text=True, env=env)
    assert p.returncode == 2, p
    assert "unknown environment variable FUSION_JIT_DUMPZ" in p.stderr, p.stderr


@case("a host compiler that fails: groups run through ATen with a warning, results still right")
def _():
    env = dict(os.environ, FUSION_JIT_CXX="false", FUSION_JIT_CACHE_DIR=os.path.join(TMP, "cache-cxx-false"))
    p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check", "--json"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["check"] == "pass" and j["kernels"] == 0, j
    assert sum(j["fallback_ops"].values()) == 6, j
    assert "groups fj_kernel_0 run through ATen instead" in p.stderr, p.stderr


@case("FUSION_JIT_ASSERT_NO_COMPILE turns a compile into an error")
def _():
    env = dict(os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_CACHE_DIR=os.path.join(TMP, "cache-empty"))
    p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]"], capture_output=True, text=True, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "FUSION_JIT_ASSERT_NO_COMPILE is set" in p.stderr, p.stderr


@case("FUSION_JIT_DUMP=ir,plan prints the IR after capture and the fusion plan")
def _():
    env = dict(os.environ, FUSION_JIT_DUMP="ir,plan")
    p = subprocess.run([CLI, "run", MODEL, "--input", "f32[16,8]", "f32[8]"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "== IR after capture ==" in p.stderr and "aten::sigmoid" in p.stderr, p.stderr
    assert "== fusion plan ==" in p.stderr and "group 0" in p.stderr, p.stderr


# The demo's models, for ahead-of-time CUDA compilation.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from models import make_models, MODELS  # noqa: E402

DEMO = make_models(os.path.join(TMP, "demo"))


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


@case("compile --device cuda: the demo models' kernels for sm_80 and sm_90, no spills, same files every run")
def _():
    for name, (_, specs) in MODELS.items():
        for arch in ("sm_80", "sm_90"):
            outs = []
            for run in range(2):
                out = os.path.join(TMP, f"aot-{name}-{arch}-{run}")
                p = cli("compile", DEMO[name], "--input", *specs, "--device", "cuda", "--arch", arch, "--out", out)
                assert p.returncode == 0, p.stderr
                assert f"CUDA kernels for {arch}" in p.stdout and "NVRTC" in p.stdout, p.stdout
                outs.append(out)
            j = json.loads(read(os.path.join(outs[0], "kernels.json")))
            if name == "conv_bn_relu":
                # The batch norm folded, conv + relu one cuDNN call (epilogue.cuda_conv_relu): no kernel.
                assert j["arch"] == arch and j["nvrtc_calls"] == 0 and not j["kernels"], j
                assert j["aten_ops"] == {"aten::cudnn_convolution_relu": 1}, j
                continue
            assert j["arch"] == arch and j["nvrtc_calls"] == 1 and j["kernels"], j
            for k in j["kernels"]:
                assert k["registers"] > 0 and k["spill_stores"] == 0 and k["spill_loads"] == 0, (name, arch, k)
            cubin = read(os.path.join(outs[0], "plan.cubin"), "rb")
            assert cubin[:4] == b"\x7fELF", "a CUBIN is an ELF image"
            src = read(os.path.join(outs[0], "plan.cu"))
            assert 'extern "C" __global__' in src
            assert src == read(os.path.join(outs[1], "plan.cu")), "generated source differs between runs"
            assert "registers" in read(os.path.join(outs[0], "explain.txt"))


@case("compile for compute_90 writes PTX")
def _():
    out = os.path.join(TMP, "aot-ptx")
    p = cli("compile", MODEL, "--input", "f32[64,32]", "f32[32]", "--device", "cuda", "--arch", "compute_90", "--out", out)
    assert p.returncode == 0, p.stderr
    assert ".entry fj_kernel_0" in read(os.path.join(out, "plan.ptx"))


@case("compile: bad arch, missing --out, CPU device, --out a file")
def _():
    base = ["compile", MODEL, "--input", "f32[4]", "f32[4]"]
    expect_error(base + ["--device", "cuda", "--arch", "sm_70", "--out", os.path.join(TMP, "x")], "--arch sm_70")
    expect_error(base + ["--device", "cuda", "--arch", "volta", "--out", os.path.join(TMP, "x")], "expected sm_XY")
    expect_error(base + ["--device", "cuda"], "--out DIR is required")
    expect_error(base + ["--out", os.path.join(TMP, "x")], "--device cuda is required")
    afile = os.path.join(TMP, "a-file")
    with open(afile, "w") as f:
        f.write("x")
    expect_error(base + ["--device", "cuda", "--out", afile], "not a directory")


@case("warm start of each demo model in a fresh process under FUSION_JIT_ASSERT_NO_COMPILE=1, bit-identical")
def _():
    cache = os.path.join(TMP, "cache-warm")
    for name, (_, specs) in MODELS.items():
        cold = dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
        out_cold, out_warm = os.path.join(TMP, name + "-cold.pt"), os.path.join(TMP, name + "-warm.pt")
        p = subprocess.run([CLI, "run", DEMO[name], "--input", *specs, "--check", "--json", "--save-outputs", out_cold],
                           capture_output=True, text=True, env=cold)
        assert p.returncode == 0, p.stderr
        kernels = json.loads(p.stdout)["kernels"]  # conv_bn_relu has none: one oneDNN call (issue 15)
        assert json.loads(p.stdout)["compiler_invocations"] == (1 if kernels else 0), p.stdout
        warm = dict(cold, FUSION_JIT_ASSERT_NO_COMPILE="1")
        p = subprocess.run([CLI, "run", DEMO[name], "--input", *specs, "--check", "--json", "--save-outputs", out_warm],
                           capture_output=True, text=True, env=warm)
        assert p.returncode == 0, (name, p.stderr)
        j = json.loads(p.stdout)
        assert j["check"] == "pass" and j["kernels"] == kernels and j["compiler_invocations"] == 0, j
        assert j["cache"]["hits"] >= (2 if kernels else 1) and j["cache"]["misses"] == 0, j  # the plan and its kernels
        p = subprocess.run([CLI, "explain", DEMO[name], "--input", *specs], capture_output=True, text=True, env=warm)
        assert p.returncode == 0 and "plan from the plan cache" in p.stdout, p.stdout
        a, b = torch.load(out_cold), torch.load(out_warm)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "cold and warm-from-disk results differ"


@case("conv_bn_relu: one oneDNN call by default (batch_norm folded, relu its post-op, NCHW written directly); rules, sets and channels-last plans named by explain and turned off by name (issue 15)")
def _():
    _, specs = MODELS["conv_bn_relu"]

    def explain(**env):
        p = subprocess.run([CLI, "explain", DEMO["conv_bn_relu"], "--input", *specs], capture_output=True, text=True,
                           env=dict(os.environ, **env))
        assert p.returncode == 0, (env, p.stderr)
        return p.stdout

    out = explain()
    assert "fold.conv_bn x1" in out and "epilogue.conv_relu x1" in out and "prepack.nchw_result x1" in out, out
    assert "0 kernels" in out and out.count("aten: ") == 1 and "aten: mkldnn::_convolution_pointwise " in out, out
    # (FUSION_JIT_DISABLE, FUSION_JIT_ENABLE, rules that fire, whether the conv stays aten::conv2d): the relu
    # (and the batch_norm where it is not folded) is then our kernel.
    for off, on, fired, aten_conv in (("epilogue.conv_relu", "", ["fold.conv_bn", "prepack.conv"], False),
                                      ("epilogue", "", ["fold.conv_bn", "prepack.conv"], False),
                                      ("fold,prepack", "", [], True),
                                      ("epilogue.conv_relu,prepack.conv", "", ["fold.conv_bn"], True),
                                      ("channels_last", "", ["fold.conv_bn"], True)):
        out = explain(FUSION_JIT_DISABLE=untimed(off), FUSION_JIT_ENABLE=on)
        assert "1 kernel," in out and not re.search(r"epilogue\.\w+ x\d", out), (off, out)
        # An NCHW plan: the epilogue rule says why it kept our kernel.
        assert ("declined: epilogue.conv_relu at" in out and "the result is NCHW" in out) == (off == "channels_last"), (off, out)
        assert all(rule in out for rule in fired), (off, out)
        assert ("fold.conv_bn" in out) == ("fold.conv_bn" in fired), (off, out)
        assert ("aten::conv2d" in out) == aten_conv, (off, out)
    # The default (conv_timing on; the suite runs with it off): the layout is decided by the convolution's
    # times on this machine (Note [Convolutions timed on this machine]), either way eager's results.
    out = explain(FUSION_JIT_DISABLE="")
    assert re.search(r"layout: .*gain -?[0-9.]+ us \(1 of 1 convolution\(s\) timed here: ATen's on NCHW [0-9.]+ us, "
                     r"oneDNN's on channels-last [0-9.]+ us\)", out), out
    # NCHW plans with the opt-in: the same one call.
    out = explain(FUSION_JIT_DISABLE=untimed("channels_last"), FUSION_JIT_ENABLE="onednn_nchw")
    assert "epilogue.conv_relu x1" in out and "0 kernels" in out and out.count("aten: ") == 1, out
    # epilogue,prepack: a channels-last plan whose conv is eager's on the folded weight (the folded weight
    # once came out NCHW there, and the plan stopped with an internal layout error).
    for env in ({}, {"FUSION_JIT_DISABLE": untimed("channels_last")}, {"FUSION_JIT_DISABLE": untimed("epilogue")},
                {"FUSION_JIT_DISABLE": untimed("epilogue,prepack")}, {"FUSION_JIT_DISABLE": ""}):
        p = subprocess.run([CLI, "run", DEMO["conv_bn_relu"], "--input", *specs, "--check", "--json"], capture_output=True,
                           text=True, env=dict(os.environ, **env))
        assert p.returncode == 0 and json.loads(p.stdout)["check"] == "pass", (env, p.stdout + p.stderr)
    p = subprocess.run([CLI, "explain", MODEL, "--input", "f32[4]", "f32[4]"], capture_output=True, text=True,
                       env=dict(os.environ, FUSION_JIT_ENABLE="fold"))
    assert p.returncode == 2 and "FUSION_JIT_ENABLE: unknown item 'fold' (known: onednn_nchw)" in p.stderr, p.stderr


@case("calibrate: measures, stores in the cache, cache stats shows it, later runs use it or, disabled, not (issue 65)")
def _():
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(TMP, "cache-calibrate"))
    run = lambda *a: subprocess.run([CLI, *a], capture_output=True, text=True, env=env)  # noqa: E731
    p = run("cache", "stats")
    assert p.returncode == 0 and "calibration: none" in p.stdout, p.stdout
    p = run("calibrate")
    assert p.returncode == 0, p.stderr
    assert "calibrate: stream 128.0 MB" in p.stderr and "ATen step" in p.stderr, p.stderr
    for line in ("memory bandwidth, GB/s", "kernel launch, us", "ATen step, us", "op classes", "stored in"):
        assert line in p.stdout, (line, p.stdout)
    measured = re.search(r"memory bandwidth, GB/s +([\d.]+) +44.0", p.stdout)
    assert measured and float(measured.group(1)) > 0, p.stdout
    p = run("cache", "stats")
    assert p.returncode == 0 and "calibration of" in p.stdout and "entries: " in p.stdout, p.stdout
    # A later process plans with it (explain names the calibration), and checks as before.
    p = run("explain", MODEL, "--input", "f32[16,8]", "f32[8]")
    assert p.returncode == 0 and re.search(r"cost model: host-cpu \(calibration [0-9a-f]{16}\)", p.stdout), p.stdout
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check")
    assert p.returncode == 0 and "check: pass" in p.stdout and "calibration" not in p.stderr, (p.stdout, p.stderr)
    env_off = dict(env, FUSION_JIT_DISABLE="calibration")
    p = subprocess.run([CLI, "explain", MODEL, "--input", "f32[16,8]", "f32[8]"], capture_output=True, text=True,
                       env=env_off)
    assert p.returncode == 0 and "cost model: host-cpu (defaults)" in p.stdout, p.stdout


@case("explain --json and run --profile N: every step under one name, predicted beside its measured median (issue 65)")
def _():
    specs = ["--input", "f32[64,32]", "f32[32]"]
    mlp = ["run", DEMO["mlp_block"], "--input", *MODELS["mlp_block"][1]]  # kernels and ATen steps
    p = cli("explain", *mlp[1:], "--json")
    assert p.returncode == 0, p.stderr
    ex = json.loads(p.stdout)
    assert ex["eager_fallback"] is None and ex["steps"], ex
    for s in ex["steps"]:
        assert s["kind"] in ("kernel", "aten") and s["predicted_us"] > 0, s
        assert abs(s["predicted_us"] - (s["dispatch_us"] + s["memory_us"] + s["compute_us"])) < 1e-6, s
    assert abs(ex["predicted_us"] - sum(s["predicted_us"] for s in ex["steps"])) < 1e-6, ex
    build = ex["build"]
    assert build["source_bytes"] > 1000 and build["compile_ms"] >= 0 and build["codegen_ms"] > 0, build
    p = cli(*mlp, "--profile", "5", "--json")
    assert p.returncode == 0, p.stderr
    prof = json.loads(p.stdout)["profile"]
    assert prof["calls"] == 5 and prof["time_model"] == ex["time_model"], prof
    assert [s["name"] for s in prof["steps"]] == [s["name"] for s in ex["steps"]], (prof, ex)
    assert [s["predicted_us"] for s in prof["steps"]] == [s["predicted_us"] for s in ex["steps"]]
    kernels = [s for s in prof["steps"] if s["kind"] == "kernel"]
    assert kernels and all(s["measured_us"] > 0 for s in kernels), prof
    assert prof["kernel_error"]["count"] == len(kernels), prof
    assert any(s["kind"] == "aten" and s["measured_us"] > 0 for s in prof["steps"]), prof
    # Note [Measured step times]: a later run prices each ATen step by what this one measured.
    p = cli(*mlp, "--profile", "3", "--json")
    assert p.returncode == 0, p.stderr
    again = json.loads(p.stdout)["profile"]
    before = {s["name"]: s["measured_us"] for s in prof["steps"] if s["kind"] == "aten" and s["measured_us"]}
    for s in again["steps"]:
        if s["name"] in before:
            assert s["source"] == "measured" and abs(s["predicted_us"] - before[s["name"]]) < 1e-6, (s, before)
        if s["kind"] == "kernel":
            assert s["source"] == "model", s
    assert again["aten_error"]["from_stored"] == len(before), again
    # The text form: a row per step and the error line.
    p = cli("run", MODEL, *specs, "--profile", "3")
    assert p.returncode == 0, p.stderr
    assert "predicted us" in p.stdout and "kernel time error: median" in p.stdout, p.stdout
    assert re.search(r"fj_kernel_0 +kernel +group 0", p.stdout), p.stdout
    expect_error(["run", MODEL, *specs, "--profile", "0"], "--profile")


@case("explain --measure-decisions: each accepted fusion built the other way too and both timed (issue 65)")
def _():
    # Chain8's eight ops become one kernel through seven accepted fusions.
    p = cli("explain", CHAIN8, "--input", "f32[64,32]", "f32[64,32]", "f32[64,32]", "--measure-decisions", "--calls", "3",
            "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    ds = j["decisions"]
    assert len(ds) >= 5, j
    for d in ds:
        assert "split for measurement (would fuse: est." in d["decision"], d
        assert d["verdict"] in ("agrees", "WRONG", "within5%"), d
        for k in ("predicted_fused_us", "predicted_split_us", "measured_fused_us", "measured_split_us"):
            assert d[k] > 0, (k, d)
        # The split plan runs one kernel more than the fused one: the time model prices that.
        assert d["predicted_split_us"] > d["predicted_fused_us"], d
    s = j["summary"]
    assert s["counted"] + s["within_5pct"] == len(ds) and s["agree"] <= s["counted"], s
    assert j["summary_line"].startswith(f"decisions: {s['agree']} of {s['counted']} agree ({s['within_5pct']} within 5%"), j
    assert s["kernel_error"]["count"] > 0, s
    p = cli("explain", CHAIN8, "--input", "f32[64,32]", "f32[64,32]", "f32[64,32]", "--measure-decisions", "--calls", "2")
    assert p.returncode == 0 and re.search(r"^decisions: \d+ of \d+ agree", p.stdout, re.M), p.stdout
    expect_error(["explain", CHAIN8, "--input", "f32[4]", "f32[4]", "f32[4]", "--calls", "3"], "--calls is for --measure-decisions")


@case("cache stats, ls, verify (a corrupt entry is found), prune, clear")
def _():
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(TMP, "cache-cli"))
    run = lambda *a: subprocess.run([CLI, *a], capture_output=True, text=True, env=env)  # noqa: E731
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]")
    assert p.returncode == 0, p.stderr
    p = run("cache", "stats")
    # The kernels, the plan and the plan's source (Note [Plan sources stored once]).
    assert p.returncode == 0 and "entries: 3" in p.stdout, p.stdout
    p = run("cache", "ls")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 3, p.stdout
    key = p.stdout.split()[0]
    p = run("cache", "verify")
    assert p.returncode == 0 and "3 entries checked, 0 bad" in p.stdout, p.stdout
    path = os.path.join(TMP, "cache-cli", "v1", key[:2], key + ".fjk")
    data = bytearray(read(path, "rb"))
    data[len(data) // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(data)
    p = run("cache", "verify")
    assert p.returncode == 1 and "BAD " + key in p.stdout, p.stdout
    # The corrupt entry is a miss: the run recompiles, replaces it and passes.
    p = run("run", MODEL, "--input", "f32[16,8]", "f32[8]", "--check")
    assert p.returncode == 0 and "check: pass" in p.stdout, (p.stdout, p.stderr)
    assert "corrupt" in p.stderr, p.stderr
    assert run("cache", "verify").returncode == 0
    p = run("cache", "prune", "--max-size", "0")
    assert p.returncode == 0 and "0 entries left" in p.stdout, p.stdout
    run("run", MODEL, "--input", "f32[16,8]", "f32[8]")
    p = run("cache", "clear")
    assert p.returncode == 0 and "removed 3 entries" in p.stdout, p.stdout
    expect_error(["cache", "prune", "--max-size", "lots"], "expected a size")
    expect_error(["cache", "frob"], "unknown command 'frob'")



@case("--help for the tool and each subcommand: exit 0, the subcommand's options listed")
def _():
    expected = {
        (): ["run", "explain", "compile", "fuzz", "cache"],
        ("run",): ["MODEL", "--input", "--inputs", "--device", "--seed", "--check", "--bench", "--profile", "--json",
                   "--save-outputs", "SPEC"],
        ("explain",): ["MODEL", "--input", "--inputs", "--device", "--dump-source", "--json", "--measure-decisions",
                       "--calls"],
        ("compile",): ["MODEL", "--input", "--device", "--arch", "--out", "NVRTC"],
        ("fuzz",): ["--graphs", "--minutes", "--seed", "--batch", "--out", "--device", "--nvrtc", "--graph-seeds"],
        ("cache",): ["stats", "ls", "verify", "clear", "prune"],
        ("cache", "stats"): ["stats"],
        ("cache", "ls"): ["ls"],
        ("cache", "verify"): ["verify"],
        ("cache", "clear"): ["clear"],
        ("cache", "prune"): ["--max-size"],
        ("calibrate",): ["calibrate", "cost model"],
    }
    for words, fragments in expected.items():
        # -h is CLI11's same flag: checked on the tool and on one subcommand, --help everywhere.
        for flag in ("--help", "-h") if len(words) == 0 or words == ("run",) else ("--help",):
            p = cli(*words, flag)
            assert p.returncode == 0, (words, flag, p.returncode, p.stderr)
            for f in fragments:
                assert f in p.stdout, (words, flag, f, p.stdout)
    # A subcommand's help is its own: run's does not list compile's options.
    assert "--arch" not in cli("run", "--help").stdout


@case("rejected command lines: one line naming the problem, exit 2")
def _():
    expect_error([], "missing command")
    expect_error(["cache"], "cache: missing command")
    expect_error(["cache", "stats", "extra"], "cache stats: unexpected argument 'extra'")
    expect_error(["run", MODEL, MODEL, "--input", "f32[4]", "f32[4]"], "unexpected argument")
    expect_error(["explain", MODEL, "--input", "f32[4]", "f32[4]", "--check"], "unknown option --check for explain")
    expect_error(["fuzz", "--graphs", "0"], "--graphs expects an integer >= 1")
    expect_error(["fuzz", "--bogus"], "unknown option --bogus for fuzz")
    expect_error(["run", MODEL, "--input", "f32[4]", "f32[4]", "--bench"], "--bench")


class AddsToItsInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1.0)
        return x * 2.0


@case("a model that changes its input changes it as eager does, once per call (issue 13 item 3)")
def _():
    model = os.path.join(TMP, "adds_to_input.pt")
    torch.jit.script(AddsToItsInput()).save(model)
    inputs = os.path.join(TMP, "zeros.pt")
    torch.save([torch.zeros(4)], inputs)
    saved = os.path.join(TMP, "adds_out.pt")
    p = cli("run", model, "--inputs", inputs, "--check", "--json", "--save-outputs", saved)
    assert p.returncode == 0, (p.stdout, p.stderr)
    j = json.loads(p.stdout)
    assert j["check"] == "pass", j
    assert "in-place" in (j["eager_fallback"] or ""), j
    out = torch.load(saved)
    out = out[0] if isinstance(out, (list, tuple)) else out
    assert torch.equal(out, torch.full((4,), 2.0)), out


@case("FUSION_JIT_DISABLE: an unknown name is rejected with the known ones, each documented in docs/options.md (issue 14)")
def _():
    env = dict(os.environ, FUSION_JIT_DISABLE="decompose.no_such_rule")
    p = subprocess.run([CLI, "cache", "stats"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "unknown item 'decompose.no_such_rule'" in p.stderr, (p.returncode, p.stderr)
    known = p.stderr.split("(known: ", 1)[1].rsplit(")", 1)[0].split(", ")
    assert "decompose.softmax" in known and "fusion" in known, known
    # docs/options.md's section "`FUSION_JIT_DISABLE` names": tables whose first column names each one.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "options.md")
    doc = open(path).read()
    assert "\n| `FUSION_JIT_DISABLE` |" in doc, "docs/options.md has no FUSION_JIT_DISABLE row"
    section = doc.split("\n## `FUSION_JIT_DISABLE` names\n", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            documented.update(re.findall(r"`([^`]+)`", line[1:].split("|", 1)[0]))
    missing = [name for name in known if name not in documented]
    assert not missing, f"docs/options.md's FUSION_JIT_DISABLE tables do not name {missing}"
    stale = sorted(documented - set(known))
    assert not stale, f"docs/options.md's FUSION_JIT_DISABLE tables name {stale}, which FUSION_JIT_DISABLE does not know"


# The remote tier (issue 18): a real redis-server (tests/redis_server.py), stopped when the cases are done;
# "machines" are processes with local cache directories of their own.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_server import RedisServer  # noqa: E402


def Redis():
    return RedisServer(TMP)


def run_json(model, specs, env, saved=None):
    args = [CLI, "run", model, "--input", *specs, "--check", "--json"] + (["--save-outputs", saved] if saved else [])
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


REDIS = None


def shared_redis():
    """The Redis server the remote tier's cases share, started by the first case that asks for it (cases
    may run in another process than the one before them: FJ_CLI_TEST_SHARD)."""
    global REDIS
    if REDIS is None:
        REDIS = Redis()
    return REDIS


@case("remote tier: a second machine runs each demo model from a shared Redis with no compiler, bit-identical; cache stats pings it (issue 18)")
def _():
    shared_redis()
    for name, (_, specs) in MODELS.items():
        out_a, out_b = os.path.join(TMP, name + "-a.pt"), os.path.join(TMP, name + "-b.pt")
        a, _ = run_json(DEMO[name], specs, REDIS.env(os.path.join(TMP, "machine-a")), out_a)
        assert a["check"] == "pass" and a["cache"]["remote"]["writes"] >= (2 if a["kernels"] else 1), (name, a)
        b, _ = run_json(DEMO[name], specs, REDIS.env(os.path.join(TMP, "machine-b"), FUSION_JIT_ASSERT_NO_COMPILE="1"),
                        out_b)
        assert b["check"] == "pass" and b["compiler_invocations"] == 0, (name, b)
        assert b["cache"]["remote"]["hits"] >= (2 if a["kernels"] else 1), (name, b)  # the plan and its kernels
        assert b["cache"]["remote"]["refused"] == 0 and b["cache"]["remote"]["errors"] == 0, (name, b)
        x, y = torch.load(out_a), torch.load(out_b)
        assert all(torch.equal(u, v) for u, v in zip(x, y)), f"{name}: results differ between the machines"
    p = subprocess.run([CLI, "cache", "stats"], capture_output=True, text=True, env=REDIS.env(os.path.join(TMP, "machine-b")))
    assert p.returncode == 0 and re.search(rf"remote: redis://127.0.0.1:{REDIS.port}/0, ping [0-9.]+ ms, \d+ entries", p.stdout), p.stdout


@case("remote tier: a build machine's cache pushed; a fleet machine pulls one model's entries, then compiles nothing (issue 18)")
def _():
    _, specs = MODELS["mlp_block"]
    build = os.path.join(TMP, "build-machine")
    j, _ = run_json(DEMO["mlp_block"], specs, dict(os.environ, FUSION_JIT_CACHE_DIR=build))
    assert j["compiler_invocations"] == 1, j
    fresh = Redis()
    try:
        p = subprocess.run([CLI, "cache", "push"], capture_output=True, text=True, env=fresh.env(build))
        assert p.returncode == 0 and re.search(r"pushed (\d+) of \1 entries", p.stdout), (p.stdout, p.stderr)
        j, _ = run_json(DEMO["mlp_block"], specs, fresh.env(os.path.join(TMP, "fleet-machine"), FUSION_JIT_ASSERT_NO_COMPILE="1"))
        assert j["compiler_invocations"] == 0 and j["cache"]["remote"]["hits"] >= 2, j
        # pull: the plan and kernels of one model land in the local cache; the run then needs no Redis.
        pulled = os.path.join(TMP, "pulled-machine")
        p = subprocess.run([CLI, "cache", "pull", DEMO["mlp_block"], "--input", *specs], capture_output=True, text=True,
                           env=fresh.env(pulled))
        assert p.returncode == 0 and re.search(r"pulled [2-9] entries", p.stdout), (p.stdout, p.stderr)
        j, _ = run_json(DEMO["mlp_block"], specs, dict(os.environ, FUSION_JIT_CACHE_DIR=pulled,
                                                       FUSION_JIT_ASSERT_NO_COMPILE="1"))
        assert j["compiler_invocations"] == 0 and j["cache"]["misses"] == 0, j
        # What the remote tier lacks is not compiled by pull: exit 1, naming it.
        _, other = MODELS["activation_block"]
        p = subprocess.run([CLI, "cache", "pull", DEMO["activation_block"], "--input", *other], capture_output=True,
                           text=True, env=fresh.env(os.path.join(TMP, "pull-missing")))
        assert p.returncode == 1 and "lacks what" in p.stderr and "nothing was compiled" in p.stderr, p.stderr
    finally:
        fresh.stop()
    expect_error(["cache", "push"], "cache push: no remote tier")


@case("remote tier: 8 machines cold-starting one model at once compile it once (the lease) (issue 18)")
def _():
    name = "activation_block"
    _, specs = MODELS[name]
    fresh = Redis()
    try:
        procs = [subprocess.Popen([CLI, "run", DEMO[name], "--input", *specs, "--check", "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=fresh.env(os.path.join(TMP, f"cold-{i}")))
                 for i in range(8)]
        outs = [p.communicate() for p in procs]
        assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
        js = [json.loads(o) for o, _ in outs]
        assert all(j["check"] == "pass" for j in js), js
        compiles = sum(j["compiler_invocations"] for j in js)
        print(f"    8 cold starts of {name} against one Redis: {compiles} compile(s)")
        assert compiles == 1, [j["compiler_invocations"] for j in js]
    finally:
        fresh.stop()


@case("remote tier: no key file, a key file others can read, a Redis that is down: results correct, one warning each (issue 18)")
def _():
    _, specs = MODELS["mlp_block"]
    env = shared_redis().env(os.path.join(TMP, "machine-nokey"))
    del env["FUSION_JIT_REMOTE_CACHE_KEY_FILE"]
    j, err = run_json(DEMO["mlp_block"], specs, env)
    assert j["check"] == "pass" and err.count("FUSION_JIT_REMOTE_CACHE_KEY_FILE is not set") == 1, err
    loose = os.path.join(TMP, "loose.key")
    with open(loose, "w") as f:
        f.write("fleet-secret-0123456789abcdef0123456789\n")
    os.chmod(loose, 0o644)
    j, err = run_json(DEMO["mlp_block"], specs, REDIS.env(os.path.join(TMP, "machine-loose"),
                                                          FUSION_JIT_REMOTE_CACHE_KEY_FILE=loose))
    assert j["check"] == "pass" and "chmod 600" in err and j["cache"]["remote"]["hits"] == 0, err
    REDIS.stop()
    import time
    t0 = time.perf_counter()
    j, err = run_json(DEMO["transformer_block"], MODELS["transformer_block"][1], REDIS.env(os.path.join(TMP, "machine-down")))
    assert j["check"] == "pass" and j["cache"]["remote"]["errors"] >= 1, j
    assert err.count("remote cache") == 1 and "failures in a row" in err, err
    print(f"    a run with Redis down: {time.perf_counter() - t0:.2f} s, remote {j['cache']['remote']}")
    REDIS.start()


@case("package, then load in a fresh process with no compiler, no cache and no temporary file: each demo model "
      "bit-identical to the JIT plan, which matches eager (--check)")
def _():
    for name, (_, specs) in MODELS.items():
        pkg = os.path.join(TMP, f"{name}.fjpkg")
        extra = ["--signature", "f32[64,512]"] if name == "mlp_block" else []
        p = cli("package", DEMO[name], "--input", *specs, *extra, "--out", pkg)
        assert p.returncode == 0, p.stderr
        assert f"{1 + (len(extra) > 0)} signature" in p.stdout, p.stdout
        has_code = " 0 kernels" not in p.stdout  # conv_bn_relu: one oneDNN call, as in the JIT plan
        jit_out = os.path.join(TMP, f"{name}-jit.pt")
        p = subprocess.run([CLI, "run", DEMO[name], "--input", *specs, "--check", "--save-outputs", jit_out],
                           capture_output=True, text=True)
        assert p.returncode == 0 and "check: pass " in p.stdout, p.stdout + p.stderr
        no_cache, tmpdir = os.path.join(TMP, f"no-cache-{name}"), os.path.join(TMP, f"tmp-{name}")
        os.mkdir(tmpdir)
        env = dict(os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_CACHE_DIR=no_cache, TMPDIR=tmpdir)
        pkg_out = os.path.join(TMP, f"{name}-pkg.pt")
        p = subprocess.run([CLI, "load", pkg, "--input", *specs, "--save-outputs", pkg_out, "--explain"], env=env,
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert re.search(r"loaded .* in [0-9.]+ ms", p.stdout) and ("variant native" in p.stdout) == has_code, p.stdout
        got, want = torch.load(pkg_out), torch.load(jit_out)
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), name
        assert not os.path.exists(no_cache), "loading a package made a cache directory"
        assert os.listdir(tmpdir) == [], os.listdir(tmpdir)
    p = cli("load", os.path.join(TMP, "mlp_block.fjpkg"), "--input", "f32[64,512]")
    assert p.returncode == 0, p.stderr


@case("package and load: errors named")
def _():
    pkg = os.path.join(TMP, "model.fjpkg")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "f32[4]"], "package: --out FILE is required")
    expect_error(["package", MODEL, "--out", pkg], "give the inputs with --input SPEC ..., --inputs FILE or --signature")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "--out", pkg], "takes 2 inputs, signature 0 has 1")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "f32[4]", "--cpu-variants", "native,i386", "--out", pkg],
                 "unknown CPU code variant 'i386'")
    assert not os.path.exists(pkg)
    p = cli("package", MODEL, "--input", "f32[4,4]", "f32[4]", "--cpu-variants", "x86-64-v2", "--out", pkg)
    assert p.returncode == 0, p.stderr
    p = cli("load", pkg, "--input", "f32[4,4]", "f32[4]", "--explain")
    assert p.returncode == 0 and "variant x86-64-v2" in p.stdout, p.stdout + p.stderr
    expect_error(["load", pkg, "--input", "f32[4,5]", "f32[5]"],
                 "no packaged signature matches the inputs (f32[4,5], f32[5]); the package serves (f32[4,4], f32[4])")
    expect_error(["load", MODEL], f"{MODEL}: not a fusion_jit package")
    expect_error(["load", os.path.join(TMP, "none.fjpkg")], "cannot read")
    cut = os.path.join(TMP, "cut.fjpkg")
    with open(cut, "wb") as f:
        f.write(read(pkg, "rb")[:-100])
    expect_error(["load", cut], f"{cut}: the package's checksum does not match its contents")


@case("package and load with FUSION_JIT_PACKAGE_KEY: signed when built, verified when loaded; an unsigned "
      "package, another key's, and a key file others may read are refused")
def _():
    keys = {}
    for name, text, mode in (("package", "0123456789abcdef", 0o600), ("other", "fedcba9876543210", 0o600),
                             ("loose", "0123456789abcdef", 0o644)):
        keys[name] = os.path.join(TMP, f"{name}.key")
        with open(keys[name], "w") as f:
            f.write(text * 2 + "\n")
        os.chmod(keys[name], mode)
    key, other, loose = keys["package"], keys["other"], keys["loose"]

    def with_key(k):
        return dict(os.environ, FUSION_JIT_PACKAGE_KEY=k)

    spec = ["--input", "f32[4,4]", "f32[4]"]
    signed, unsigned = os.path.join(TMP, "signed.fjpkg"), os.path.join(TMP, "unsigned.fjpkg")
    p = cli("package", MODEL, *spec, "--out", signed, env=with_key(key))
    assert p.returncode == 0 and f"signed with the key in {key}" in p.stdout, p.stdout + p.stderr
    p = cli("load", signed, *spec, "--explain", env=with_key(key))
    assert p.returncode == 0 and f"signature verified with the key in {key}" in p.stdout, p.stdout + p.stderr
    p = cli("load", signed, *spec, "--explain")
    assert p.returncode == 0 and "signed, but not verified" in p.stdout, p.stdout + p.stderr
    p = cli("package", MODEL, *spec, "--out", unsigned)
    assert p.returncode == 0 and "signed with" not in p.stdout, p.stdout + p.stderr
    expect_error(["load", unsigned, *spec], f"{unsigned}: refused: the package is not signed, and a package key is "
                                            f"configured ({key})", env=with_key(key))
    expect_error(["load", signed, *spec], f"{signed}: refused: its signature does not verify under the key in {other}",
                 env=with_key(other))
    expect_error(["load", signed, *spec], f"the package key file {loose} (FUSION_JIT_PACKAGE_KEY) cannot be used: group "
                                          "or others may read or write it (mode 644); chmod 600 it", env=with_key(loose))
    kept = os.path.join(TMP, "loose.fjpkg")
    expect_error(["package", MODEL, *spec, "--out", kept], f"package {kept}: the package key file {loose}",
                 env=with_key(loose))
    assert not os.path.exists(kept)


@case("package --device cuda: built here with no GPU (a CUBIN per --arch, newest first, then PTX); load refuses it "
      "without a GPU")
def _():
    pkg = os.path.join(TMP, "model-cuda.fjpkg")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "f32[4]", "--arch", "sm_90", "--out", pkg],
                 "package: --arch is for --device cuda")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "f32[4]", "--device", "tpu", "--out", pkg],
                 "package: --device tpu: expected cpu or cuda")
    expect_error(["package", MODEL, "--input", "f32[4,4]", "f32[4]", "--device", "cuda", "--arch", "sm_80,sm_1",
                  "--out", pkg], f"package {pkg}: --arch sm_1")
    assert not os.path.exists(pkg)
    p = cli("package", MODEL, "--input", "f32[4,4]", "f32[4]", "--device", "cuda", "--arch", "sm_80,sm_90", "--out", pkg)
    assert p.returncode == 0, p.stderr
    assert "for cuda: 1 signature" in p.stdout, p.stdout
    if not torch.cuda.is_available():
        expect_error(["load", pkg, "--input", "f32[4,4]", "f32[4]"],
                     f"{pkg}: its plans run on a GPU (cuda:0), but this machine has none")


if REDIS is not None:
    REDIS.stop()
failed = [(n, e) for n, e, _ in results if e]
for n, e, seconds in results:
    print(("FAIL " if e else "ok   ") + f"{seconds:6.1f} s  " + n + (f": {e}" if e else ""))
print(f"{len(results) - len(failed)} passed, {len(failed)} failed"
      + (f" (shard {SHARD} of {_seen} cases)" if SHARD_COUNT > 1 else ""))
sys.exit(1 if failed else 0)
