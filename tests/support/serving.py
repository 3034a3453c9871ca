"""A ``refusion serve`` subprocess on a free loopback port, for the serving tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def one_torch_thread():
    """The offline references decode with 1 torch thread (2 spin-waiting threads on a shared machine are slow)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``refusion serve`` with ``args`` in a subprocess; ``url`` once :meth:`start` returned."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> ServerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("TRITON_INTERPRET", None)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "refusion.cli",
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--threads",
                "1",
                *self.args,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.process.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {timeout} s")

    def rss(self) -> int:
        """The server's resident memory in bytes."""
        with open(f"/proc/{self.process.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{want}}}" if labels else name):
            return float(value)
    return 0.0
