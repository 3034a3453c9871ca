"""The lm-evaluation-harness adapter, offline, on a small local task built from the held-out set."""

import json

import pytest

pytest.importorskip("lm_eval")

from refusion.training.tasks import held_out
from tests.support.lmeval_task import TASK


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
    requests = [
        SimpleNamespace(args=(p, {"until": ["\n"], "max_gen_toks": 100}))
        for p in ("copy abc=", "rev abcd=", "copy xyzw=")
    ]
    assert lm.generate_until(requests) == ["abc", "dcba", "xyzw"]


def test_the_eval_command_takes_lm_evals_flags_and_prints_its_table(task_dir, tmp_path, monkeypatch, capfd):
    """`--num-fewshot`, `--batch-size`, `--output-path`, `--log-samples` as lm-eval has them; lm-eval's table on
    stdout; nothing from git on stderr outside a git checkout (issue 30)."""
    from refusion.cli import main

    yaml = task_dir / "refusion_synthetic.yaml"  # few-shot examples joined by a space (the model knows no newline)
    yaml.write_text(yaml.read_text() + 'fewshot_delimiter: " "\n')
    monkeypatch.chdir(tmp_path)  # not a git checkout: lm-eval's `git describe` fails here
    out = tmp_path / "results"
    assert (
        main(
            [
                "eval",
                "--tasks",
                "refusion_synthetic",
                "--include-path",
                str(task_dir),
                "--limit",
                "2",
                "--num-fewshot",
                "1",
                "--batch-size",
                "2",
                "--output-path",
                str(out),
                "--log-samples",
            ]
        )
        == 0
    )
    captured = capfd.readouterr()
    assert "|refusion_synthetic|" in captured.out and "exact_match" in captured.out  # lm-eval's markdown table
    assert "fatal" not in captured.err and "not a git repository" not in captured.err, captured.err
    written = [p.name for p in out.rglob("*") if p.is_file()]
    assert any(n.startswith("results_") for n in written) and any(n.startswith("samples_") for n in written)
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    assert results["configs"]["refusion_synthetic"]["num_fewshot"] == 1


def test_batch_size_auto_is_refused_rather_than_read_as_1(task_dir, capsys):
    from refusion.cli import main

    assert (
        main(
            [
                "eval",
                "--tasks",
                "refusion_synthetic",
                "--include-path",
                str(task_dir),
                "--model-args",
                "batch_size=auto",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "`batch_size` must be a positive integer" in err and "auto" in err
    assert main(["eval", "--tasks", "refusion_synthetic", "--log-samples"]) == 2
    assert "`--log-samples` needs `--output-path`" in capsys.readouterr().err


def test_apply_chat_template_wraps_the_prompts_in_the_tokenizers_template(task_dir, tmp_path, capsys):
    import shutil

    from refusion.cli import main
    from refusion.models.default import default_model_path

    checkpoint = tmp_path / "chat-model"
    shutil.copytree(default_model_path(), checkpoint)
    settings = json.loads((checkpoint / "tokenizer_config.json").read_text())
    settings["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(settings))
    record = tmp_path / "record.json"
    assert (
        main(
            [
                "eval",
                "--tasks",
                "refusion_synthetic",
                "--include-path",
                str(task_dir),
                "--limit",
                "2",
                "--apply-chat-template",
                "--model-args",
                f"pretrained={checkpoint}",
                "--json",
                "--record",
                str(record),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["refusion_synthetic"]["exact_match,none"] >= 0.5
    assert json.loads(record.read_text())["settings"]["apply_chat_template"] is True
    assert (
        main(
            [
                "eval",
                "--tasks",
                "refusion_synthetic",
                "--include-path",
                str(task_dir),
                "--limit",
                "1",
                "--apply-chat-template",
            ]
        )
        == 2
    )  # the shipped tokenizer has no chat template
    assert "no chat template" in capsys.readouterr().err
