"""An lm-evaluation-harness task over a JSON Lines file of the shipped model's tasks (``data``: its path)."""

TASK = """\
task: refusion_synthetic
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 32
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder, monkeypatch, tasks=("copy", "reverse"), per_task=1):
    """The task above over ``per_task`` held-out examples of each of ``tasks``, written to ``folder`` (its include
    path), with the datasets library kept offline and its cache under ``folder``; returns ``folder``."""
    import json

    from refusion.training.tasks import held_out

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(folder / "cache"))
    data = folder / "synthetic.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in held_out(per_task) if e.task in tasks
        )
    )
    (folder / "refusion_synthetic.yaml").write_text(TASK.format(data=data))
    return folder
