"""`refusion sweep` end to end on the shipped model: grid, optuna, resume after an interruption, the preset it
writes."""

import csv
import json

import pytest
import torch

pytest.importorskip("optuna")

import refusion
from refusion.api import load_model
from refusion.cli import main
from refusion.sweep import run_sweep as sweep
from refusion.sweep.evaluate import evaluate_preset
from refusion.sweep.outputs import aup_front
from refusion.sweep.space import point_key
from refusion.sweep.study import completed, open_study
from refusion.sweep.tasks import load_tasks

PAIRS = [("rev abcde=", "edcba"), ("copy hello=", "hello"), ("rep 2 ab=", "abab")]
SPACE = ["selector=threshold,topk", "slot_threshold=0.5:0.9:0.4", "k=1,2"]  # 2 threshold + 2 topk points


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(None, dtype=torch.float32)


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in PAIRS))
    return str(path)


def test_grid_sweep_evaluates_every_point_once_and_writes_csv_png_preset(model, tasks, tmp_path):
    result = sweep(SPACE, tasks, model=model, out=tmp_path / "out", progress=False)
    assert result.mode == "grid" and result.new_trials == 4
    points = {point_key(r.point) for r in result.records}
    assert points == {
        point_key(p)
        for p in (
            {"selector": "threshold", "slot_threshold": 0.5},
            {"selector": "threshold", "slot_threshold": 0.9},
            {"selector": "topk", "k": 1},
            {"selector": "topk", "k": 2},
        )
    }
    assert result.ar["examples"] == 3 and result.ar["accuracy"] == 1.0
    for r in result.records:
        assert r["examples"] == 3 and r["forward_ratio"] == pytest.approx(result.ar["forwards"] / r["forwards"])
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert len(rows) == 5 and rows[0]["label"].startswith("AR")
    assert result.files["png"].stat().st_size > 0
    assert result.chosen in result.front and result.chosen["accuracy"] >= result.ar["accuracy"]
    # topk k=1 commits one slot per iteration: more forwards than the threshold points, never on the front
    assert all(r.point.get("k") != 1 for r in result.front)
    # the preset file decodes with exactly the chosen point's parts and parameters
    loaded = refusion.load_preset(result.files["preset"])
    assert loaded == result.preset
    again = evaluate_preset(model, loaded, load_tasks(tasks))
    assert again.forwards == result.chosen["forwards"] and again.correct == result.chosen["correct"]
    # its AUP is d3LLM's over the (tokens per forward, accuracy) front from AR's point
    score, curve = aup_front(result.records, result.ar)
    assert (
        result.aup == score and curve and all(r["tokens_per_forward"] > result.ar["tokens_per_forward"] for r in curve)
    )
    assert result.aup > 100 * result.ar["tokens_per_forward"]  # more parallel than AR at AR's accuracy
    # running it again resumes: nothing left to evaluate
    assert sweep(SPACE, tasks, model=model, out=tmp_path / "out", progress=False).new_trials == 0


def test_optuna_sweep_stops_at_the_trial_budget_and_resumes_to_a_larger_one(model, tasks, tmp_path):
    space = ["slot_size=2,4,8", "slot_threshold=0.3:0.95", "token_threshold=0.3:0.95"]
    first = sweep(space, tasks, model=model, mode="optuna", trials=3, out=tmp_path, progress=False, plot=False)
    assert first.mode == "optuna" and len(first.records) == 3
    second = sweep(space, tasks, model=model, mode="optuna", trials=5, out=tmp_path, progress=False, plot=False)
    assert second.new_trials == 2 and len(second.records) == 5
    assert len({point_key(r.point) for r in second.records}) == 5


def test_an_interrupted_sweep_keeps_finished_trials_and_resumes_without_duplicates(model, tasks, tmp_path):
    calls = []

    def stop_at_the_third(adapter, preset, taskset):
        calls.append(preset)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return evaluate_preset(adapter, preset, taskset)

    result = sweep(SPACE, tasks, model=model, out=tmp_path, progress=False, evaluate=stop_at_the_third)
    assert result.interrupted and len(result.records) == 2
    study = open_study(tmp_path / "sweep.db", "refusion-sweep", _signature_of(tmp_path))
    assert len(completed(study)) == 2  # persisted, not just returned
    resumed = sweep(SPACE, tasks, model=model, out=tmp_path, progress=False)
    assert not resumed.interrupted and resumed.new_trials == 2 and len(resumed.records) == 4
    assert len({point_key(r.point) for r in resumed.records}) == 4


def _signature_of(out):
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'sweep.db'}")
    return optuna.load_study(study_name="refusion-sweep", storage=storage).user_attrs["signature"]


def test_cli_sweep_from_a_space_file_and_generate_with_its_preset(model, tasks, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("space:\n  slot_threshold: [0.5, 0.9]\n  slot_size: [4]\n")
    out = tmp_path / "cli"
    assert main(["sweep", "--space-file", str(space), "--tasks", tasks, "--out", str(out), "--json", "--no-plot"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trials"] == 2 and report["chosen"]["point"]["slot_size"] == 4 and report["aup"] > 0
    assert main(["generate", "rev abcde=", "--preset-file", str(out / "preset.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "edcba"


def test_a_sweep_on_a_local_lm_eval_task_scores_with_the_task_metric(model, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from refusion.sweep.harness import HarnessTasks

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in PAIRS))
    (tmp_path / "pairs_task.yaml").write_text(
        f"task: pairs_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 32\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    tasks = HarnessTasks(("pairs_task",), include_path=str(tmp_path), metric="exact_match")
    result = sweep(["slot_threshold=0.5,0.9"], tasks, model=model, out=tmp_path / "out", progress=False, plot=False)
    assert result.ar["examples"] == 3 and result.ar["accuracy"] == 1.0 and result.ar["tokens"] > 0
    assert len(result.records) == 2
    for r in result.records:
        assert r["accuracy"] == 1.0 and 0 < r["forwards"] < result.ar["forwards"]


def test_bench_measures_a_preset_file_next_to_ar(tmp_path, capsys):
    path = tmp_path / "preset.json"
    path.write_text(
        json.dumps({"gen_length": 32, "selector": "topk", "params": {"slot_size": 4, "k": 2, "serial_num_blocks": 1}})
    )
    assert main(["bench", "--per-task", "1", "--preset-file", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]  # bench --json prints a record
    assert [r["method"] for r in rows] == ["AR: transformers generate", f"file {path}"]
    assert rows[1]["forwards"] < rows[0]["forwards"] and rows[1]["examples"] == 6


def test_a_sweep_searches_multi_block_thresholds_and_selector_memory_and_reports_aup(model, tasks, tmp_path):
    """d3LLM's blocks in flight (when a block is added) and CreditDecoding's memory (its decay) are dimensions
    like any other; the sweep's AUP is that of the front it found."""
    multi_block = [
        "selector=d3llm",
        "partitioner=fixed",
        "slot_size=1",
        "serial_num_blocks=1",
        "block_size=4",
        "infiller=draft",
        "threshold=0.5,1.0",
        "block_add_threshold=0.1,1.0",
    ]
    result = sweep(multi_block, tasks, model=model, out=tmp_path / "d3llm", progress=False, plot=False)
    assert result.new_trials == 4 and {r.point["block_add_threshold"] for r in result.records} == {0.1, 1.0}
    assert result.aup == aup_front(result.records, result.ar)[0] and result.aup > 0
    credit = ["selector=credit", "partitioner=semi-ar", "slot_size=1", "block_length=8", "decay_beta=0.0,0.8"]
    result = sweep(credit, tasks, model=model, out=tmp_path / "credit", progress=False, plot=False)
    assert result.new_trials == 2 and result.aup is not None


def test_a_sweep_searches_cache_policies_and_their_delays_on_a_bidirectional_model(tasks, tmp_path):
    """The reorderer is a dimension like the selector: ``no-cache`` against d3LLM's ``periodic`` cache at two
    delays, on the tiny LLaDA fixture (random weights: the forwards move, not the accuracy)."""
    from pathlib import Path

    llada = load_model(str(Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "llada"), dtype=torch.float32)
    space = ["block_size=8", "reorderer=no-cache,periodic", "cache_delay_iter=0,2"]
    result = sweep(space, tasks, model=llada, out=tmp_path / "cache", progress=False, plot=False, preset="d3llm-kv")
    points = sorted((r.point["reorderer"], r.point.get("cache_delay_iter", -1)) for r in result.records)
    assert points == [("no-cache", -1), ("periodic", 0), ("periodic", 2)]
    assert all(r["forwards"] > 0 for r in result.records) and (tmp_path / "cache" / "preset.json").exists()
