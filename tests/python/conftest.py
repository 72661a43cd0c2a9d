"""The Python suite runs strict (issue 72 item 2).

Without FUSION_JIT_STRICT a graph the backend cannot lower runs eagerly with a warning, and a test that
compares the compiled model with eager then compares eager with eager and passes whatever the backend does.
So every test runs with FUSION_JIT_STRICT=1, set here for each test however pytest is started (ctest's
python_tests, `./run python -m pytest tests/python`, one file or -k): a graph that would run eagerly raises
and fails the test that compiled it. Subprocesses a test starts inherit it.

Tests of the fallbacks themselves (a graph that runs eagerly with one warning, a template dropped and each
signature lowered, an attention matcher failure that leaves the graph as written) are marked
`@pytest.mark.fallback`: they run with FUSION_JIT_STRICT=0. Mark a test so only where the fallback is what
it tests, never to make a test pass whose graph the backend should lower.

The variable is read at each compile (fusion_jit._backend._strict parses the environment as it is then;
the C++ library's snapshot of the environment does not use it), so setting it per test is enough."""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fallback: a test of the eager fallback itself; runs with FUSION_JIT_STRICT=0 (tests/python/conftest.py)")


@pytest.fixture(autouse=True)
def strict(request, monkeypatch):
    """FUSION_JIT_STRICT=1 for the test, 0 for one marked `fallback`."""
    monkeypatch.setenv("FUSION_JIT_STRICT", "0" if request.node.get_closest_marker("fallback") else "1")
    yield
