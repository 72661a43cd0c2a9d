"""The cache's remote tier on Redis (issue 18): two "machines" (processes with local cache directories of
their own) share one redis-server, started here on a free localhost port with its own data directory.
The second machine runs each model with no compiler and no fallback, its result bit-identical to the
first's. The first sets the tier through the environment, the second through the backend's options."""

import os
import random
import subprocess
import sys
import time

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import redis_server  # noqa: E402


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    if not redis_server.available():
        pytest.skip("redis-server is not installed (./run installs Debian's redis-server)")
    r = redis_server.RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield r.url, r.key_file
    r.stop()


def counters(stdout):
    return dict(item.split("=") for item in stdout.split())


def _day_seed():
    """FJ_TEST_SEED, else the day's number (days since 1970-01-01, UTC), as the C++ corpora take it."""
    return int(os.environ.get("FJ_TEST_SEED") or time.time() // 86400)


def test_second_machine_compiles_nothing(redis, tmp_path):
    """Three models of the Python tests, a sample that changes daily (FJ_TEST_SEED picks it; every model
    compiles and runs in test_backend.py), all in one process per machine: what is checked is how the
    entries travel, the same for every model, and each model's cold compile is most of this test's time."""
    from models import MODELS
    url, key = redis
    script = os.path.join(HERE, "warm_start.py")
    seed = _day_seed()
    names = sorted(random.Random(seed).sample(sorted(MODELS), 3))
    print(f"models {names} (FJ_TEST_SEED={seed})")
    models = ",".join(names)
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=str(tmp_path / "machine-a"), FUSION_JIT_REMOTE_CACHE=url,
               FUSION_JIT_REMOTE_CACHE_KEY_FILE=key)
    first = subprocess.run([sys.executable, script, models, "--save", str(tmp_path / "a.pt")], env=env,
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert counters(first.stdout)["compiles"] != "0", first.stdout
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=str(tmp_path / "machine-b"), FUSION_JIT_ASSERT_NO_COMPILE="1",
               FUSION_JIT_STRICT="1")
    env.pop("FUSION_JIT_REMOTE_CACHE", None)
    second = subprocess.run([sys.executable, script, models, "--save", str(tmp_path / "b.pt"), "--remote", url, key],
                            env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    c = counters(second.stdout)
    assert c["compiles"] == "0" and c["eager_graphs"] == "0", second.stdout
    assert int(c["remote_hits"]) > 0 and c["remote_refused"] == "0" and c["remote_errors"] == "0", second.stdout
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert list(a) == names, (list(a), seed)
    for name in names:
        assert torch.equal(a[name], b[name]), f"{name}: the machines' results differ (FJ_TEST_SEED={seed})"


def test_remote_cache_options_are_checked():
    import fusion_jit._backend as b
    with pytest.raises(ValueError, match="go together"):
        b.Options({"remote_cache": "redis://localhost"})
    with pytest.raises(TypeError):
        b.Options({"remote_cache": 6379, "remote_cache_key_file": "k"})


def test_bad_remote_cache_url_or_key_file_is_a_value_error(tmp_path):
    from fusion_jit import _native
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123\n")
    os.chmod(key, 0o600)
    with pytest.raises(ValueError, match="unknown scheme"):
        _native.ops.use_remote_cache("http://cache:6379", str(key))
    os.chmod(key, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        _native.ops.use_remote_cache("redis://cache:6379", str(key))


def test_remote_cache_url_errors_never_show_the_password(tmp_path):
    """Issue 63: redis://PASSWORD@host (the password-only form) with any other mistake printed the password."""
    from fusion_jit import _native
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123\n")
    os.chmod(key, 0o600)
    for url in ("redis://hunter2@cache:99999", "redis://admin:hunter2@cache:99999", "redis:/hunter2@cache",
                "redis://hunter2@cache/x"):
        with pytest.raises(ValueError) as e:
            _native.ops.use_remote_cache(url, str(key))
        assert "hunter2" not in str(e.value) and "***@cache" in str(e.value), str(e.value)
