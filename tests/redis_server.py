"""A redis-server for tests and benchmarks of the cache's remote tier: Debian's package (installed by ./run),
on a free localhost port with its own data directory and log, no persistence; and a key file for the
entries' signatures (mode 600).

    r = RedisServer(tmpdir)        # started; r.url, r.key_file, r.env(cache_dir, **more)
    r.stop(); r.start()            # a Redis that goes away and comes back, on the same port
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time


def available():
    return shutil.which("redis-server") is not None


class RedisServer:
    def __init__(self, tmp):
        assert available(), "redis-server is not installed (./run installs Debian's package)"
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.dir = tempfile.mkdtemp(dir=tmp, prefix="redis-")
        self.url = f"redis://127.0.0.1:{self.port}"
        self.key_file = os.path.join(self.dir, "key")
        with open(os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("fleet-secret-0123456789abcdef0123456789\n")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir, "--logfile",
                                      os.path.join(self.dir, "log")])
        for _ in range(500):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.01)
        raise AssertionError(f"redis-server did not start on port {self.port}")

    def flush(self):
        """Removes every key (FLUSHALL)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as c:
            c.sendall(b"FLUSHALL\r\n")
            assert c.recv(16).startswith(b"+OK")

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def env(self, cache_dir, **more):
        """The environment of a machine with its own local cache directory and this Redis as its remote tier."""
        env = dict(os.environ, FUSION_JIT_CACHE_DIR=cache_dir, FUSION_JIT_REMOTE_CACHE=self.url,
                   FUSION_JIT_REMOTE_CACHE_KEY_FILE=self.key_file)
        env.update(more)
        return env
