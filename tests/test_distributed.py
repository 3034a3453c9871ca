"""Data-parallel generation over 2 CPU processes (gloo), started by torchrun, equals one process."""

import json
import os
import subprocess
import sys

import refusion
from refusion.training.tasks import held_out


def test_two_gloo_ranks_return_every_result_in_order(tmp_path):
    prompts = [e.prompt for e in held_out(1)] + ["copy abc=", "rev abcdefg=", "rep 2 xy="]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    import socket

    with socket.socket() as sock:  # a free loopback port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port),
           "-m", "refusion.distributed", "--prompts", str(tmp_path / "prompts.txt"), "--out", str(out),
           "--backend", "gloo"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == prompts
    assert {r["rank"] for r in rows} == {0, 1}
    alone = refusion.generate(prompts, None)
    assert [r["tokens"] for r in rows] == [a.tokens.tolist() for a in alone]


def test_generate_distributed_needs_a_process_group():
    import pytest

    from refusion.distributed import generate_distributed
    from refusion.errors import ConfigError

    with pytest.raises(ConfigError, match="not initialised"):
        generate_distributed(["copy ab="])
    with pytest.raises(ConfigError, match="non-empty list"):
        generate_distributed([])
