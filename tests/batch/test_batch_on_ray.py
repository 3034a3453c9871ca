"""``refusion batch --ray``: rows on a Ray Data actor pool give the embedded run's rows, a killed worker is replaced
and its rows retried (every id once), bad rows are error rows, and without Ray ``--ray`` says how to install it.

One local Ray for the module (2 CPUs, no dashboard) and one Ray run, the command line's (2 workers loading the
shipped model, one of them killed mid-run), which the tests below read; the workers use 1 torch thread each.
"""

import json
import socket
import sys

import pytest

ray = pytest.importorskip("ray")  # a guard only: CI installs the [ray] extra, so these run there
pytest.importorskip("ray.data")

from refusion.batch import ray_data  # noqa: E402
from refusion.batch.embedded import run_batch  # noqa: E402
from refusion.batch.ray_data import check_reachable, check_room, dataset_lines, run_on_ray  # noqa: E402
from refusion.cli import main  # noqa: E402
from refusion.errors import ConfigError, RefusionWarning  # noqa: E402

PROMPTS = ["rev hello=", "copy abc=", "add 12+34=", "sort dcba=", "rev abcdef=", "copy xyz=", "add 3+4=", "sort cab="]
#: every other row samples, so a row's tokens depend on its seed
OPTIONS = [{}, {"seed": 3, "temperature": 0.8}, {"gen_length": 8}, {"seed": 5, "temperature": 1.0, "top_k": 5}]
BAD = [
    '{"id": "bad-prompt", "prompt": 5}',
    '{"id": "bad-length", "prompt": "rev ab=", "gen_length": 0}',
    "this line is not json",
]
ROWS = 64


def good_rows(count=ROWS):
    return [{"id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)], **OPTIONS[i % len(OPTIONS)]} for i in range(count)]


def read_rows(path):
    """The result rows by key (their id, or their line when they have none), each written once."""
    lines = path.read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    keys = [row["id"] if row["id"] is not None else row["line"] for row in rows]
    assert len(keys) == len(set(keys)), "a row was written twice"
    return dict(zip(keys, rows))


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for this module (or the one this process is already connected to, left running)."""
    if ray.is_initialized():
        yield
        return
    # OMP_NUM_THREADS=1 (tests/conftest.py) reaches the workers through Ray's processes; each sets 1 torch thread
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def input_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "in.jsonl"
    lines = [json.dumps(row) for row in good_rows()]
    for i, bad in enumerate(BAD):  # spread through the file
        lines.insert(10 + 20 * i, bad)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def embedded(input_file):
    """The embedded run of the same file: what every Ray run must write, row for row."""
    out = input_file.parent / "embedded.jsonl"
    run_batch(input_file, out, gen_length=16, progress=False)
    return read_rows(out)


@pytest.fixture(scope="module")
def command_line(local_ray, input_file):
    """``refusion batch IN --out OUT --ray --workers 2 --max-rows 2`` (9 batches of 8 rows) through ``main``, one
    worker killed with ``ray.kill`` (Ray restarts it) as soon as the first rows are back: its status, its rows, the
    killed worker and the worker processes of the run."""
    out = input_file.parent / "ray.jsonl"
    seen = {}

    def run_and_kill(*args, **kwargs):
        run = run_on_ray(*args, **kwargs)
        seen["run"] = run
        for row in run:
            yield row
            if "killed" not in seen:  # the first rows are back: kill the worker that has done the least
                seen["killed"] = min(run.workers(), key=lambda w: w.rows)
                ray.kill(seen["killed"].handle, no_restart=False)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_data, "run_on_ray", run_and_kill)
        status = main(
            [
                "batch",
                str(input_file),
                "--out",
                str(out),
                "--ray",
                "--workers",
                "2",
                "--max-rows",
                "2",
                "--gen-length",
                "16",
                "--no-progress",
                "--json",
            ]
        )
    return status, read_rows(out), seen["killed"], seen["run"].workers()


def test_the_command_line_runs_on_ray(command_line):
    status, rows, _, _ = command_line
    assert status == 0
    assert len(rows) == ROWS + len(BAD)


def test_two_workers_write_the_embedded_rows(command_line, embedded):
    _, rows, _, workers = command_line
    assert set(rows) == set(embedded)
    for row_id, row in embedded.items():
        assert rows[row_id] == row, row_id  # tokens, text, forwards, errors: the same seeds give the same rows
    assert all(rows[f"r{i}"]["tokens"] for i in range(1, ROWS, 2))  # the sampled rows
    assert sum(w.rows for w in workers) >= ROWS + len(BAD) and all(w.peak_rss > 0 for w in workers)


def test_bad_rows_are_error_rows_naming_the_field(command_line):
    _, rows, _, _ = command_line
    assert rows["bad-prompt"]["error"].startswith("prompt: ")
    assert rows["bad-length"]["error"].startswith("gen_length: ")
    unreadable = [row for key, row in rows.items() if isinstance(key, int)]
    assert len(unreadable) == 1 and "JSON" in unreadable[0]["error"] and unreadable[0]["id"] is None
    for row_id in ("bad-prompt", "bad-length", unreadable[0]["line"]):
        assert rows[row_id]["tokens"] is None and rows[row_id]["text"] is None
    assert sum(row["error"] is not None for row in rows.values()) == len(BAD)


def test_a_killed_worker_is_replaced_and_every_row_written_once(command_line, embedded):
    _, rows, killed, workers = command_line  # read_rows checked that no id is written twice
    assert set(rows) == set(embedded)
    pids = [w.pid for w in workers]
    assert killed.pid in pids and len(set(pids)) == 3, workers  # 2 workers, then the killed one's replacement
    replacement = [w for w in workers if w.handle == killed.handle and w.pid != killed.pid]
    assert replacement and replacement[0].rows > 0  # it ran the retried rows


def test_dataset_rows_become_numbered_json_lines(local_ray, tmp_path):
    """Rows of a Dataset: one text column (``line``, or ``text`` from ``read_text``) as it is, row objects as JSON
    (Arrow's numpy arrays as lists, the nulls of columns a row lacks left out)."""
    line = '{"id": "a", "prompt": "rev ab="}'
    assert list(dataset_lines(ray.data.from_items([{"line": line}]))) == [(1, line)]
    (tmp_path / "in.jsonl").write_text(line + "\n")
    assert list(dataset_lines(ray.data.read_text(str(tmp_path / "in.jsonl")))) == [(1, line)]
    rows = ray.data.from_items([{"id": "b", "prompt": [5, 6, 7], "seed": 2}, {"id": "c", "prompt": [8]}])
    assert [(n, json.loads(t)) for n, t in dataset_lines(rows)] == [
        (1, {"id": "b", "prompt": [5, 6, 7], "seed": 2}),
        (2, {"id": "c", "prompt": [8]}),
    ]


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ConfigError) as error:
        run_on_ray(None, None, [], address=None)
    assert error.value.param == "ray" and "pip install 'refusion[ray]'" in str(error.value)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "rev ab="}\n')
    assert main(["batch", str(source), "--out", str(tmp_path / "out.jsonl"), "--ray", "--no-progress"]) == 2
    assert "pip install 'refusion[ray]'" in capsys.readouterr().err


def test_a_worker_no_node_can_hold_is_refused_instead_of_waiting_forever():
    """On a Ray the run started (it cannot grow) an error naming the resource; on a cluster joined, a warning."""

    class Cluster:
        def nodes(self):
            return [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 8, "GPU": 1}}]

    check_room(Cluster(), 2, 0, started=True)
    with pytest.raises(ConfigError) as error:
        check_room(Cluster(), 1, 1, started=True)
    assert error.value.param == "gpus_per_worker" and "most on one node: 0" in str(error.value)
    with pytest.raises(ConfigError, match="`cpus_per_worker`"):
        check_room(Cluster(), 4, 0, started=True)
    with pytest.warns(RefusionWarning, match="waits until the cluster has such a node"):
        check_room(Cluster(), 1, 1, started=False)


def test_an_address_no_cluster_answers_at_is_refused_at_once():
    """Ray would retry an unreachable head for minutes; the run says so at once, naming ``ray``."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match="no Ray cluster answers") as error:
            check_reachable(address)
        assert error.value.param == "ray"


def test_a_run_that_starts_its_own_ray_prints_none_of_rays_notes(tmp_path):
    """``--ray`` in a fresh process: the summary and nothing of Ray's own (its core worker's C++ log lines, e.g.
    ray-project/ray#53727's ``E ... core_worker.cc`` note about every actor pool), as docs/scaling.md says."""
    import os
    import subprocess

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": "rev ab=", "gen_length": 4}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_BACKEND_LOG_LEVEL"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "refusion.cli",
            "batch",
            str(source),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--ray",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("1 row written"), done.stderr
