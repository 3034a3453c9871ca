"""The lm-evaluation-harness adapter, offline, on a small local task built from the held-out set."""

import json

import pytest

pytest.importorskip("lm_eval")

from refusion.training.tasks import held_out  # noqa: E402
from tests.support.lmeval_task import TASK  # noqa: E402




@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "synthetic.jsonl"
    examples = [e for e in held_out(3) if e.task in ("copy", "reverse", "repeat")]
    data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in examples))
    (tmp_path / "refusion_synthetic.yaml").write_text(TASK.format(data=data))
    return tmp_path


@pytest.mark.parametrize("model_args", ["", "selector=topk,k=2,slot_size=4,serial_num_blocks=1,gen_length=32"])
def test_generation_task_runs_offline_with_any_strategy(task_dir, model_args):
    import refusion.measure.lmeval as ev

    results = ev.evaluate(["refusion_synthetic"], model_args=model_args, include_path=str(task_dir))
    score = results["results"]["refusion_synthetic"]["exact_match,none"]
    assert score >= 0.8  # the shipped model solves these tasks


def test_loglikelihood_prefers_the_right_answer():
    from types import SimpleNamespace

    from refusion.measure.lmeval import RefusionLM

    lm = RefusionLM()
    (right, greedy), (wrong, _) = lm.loglikelihood(
        [SimpleNamespace(args=("copy abcd=", "abcd")), SimpleNamespace(args=("copy abcd=", "dcba"))]
    )
    assert right > wrong and greedy


def test_eval_adapter_rounds_task_lengths_and_batches():
    from types import SimpleNamespace

    pytest.importorskip("lm_eval")
    from refusion.measure.lmeval import RefusionLM

    lm = RefusionLM(preset="paper", batch_size=2)  # slot 8 x 2 blocks: 100 tokens is no valid length
    requests = [SimpleNamespace(args=(p, {"until": ["\n"], "max_gen_toks": 100}))
                for p in ("copy abc=", "rev abcd=", "copy xyzw=")]
    assert lm.generate_until(requests) == ["abc", "dcba", "xyzw"]
