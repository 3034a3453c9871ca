"""Every command checks its flags while the command line is parsed, before torch, transformers or FastAPI is
imported (issue 30: a bad `--port` took 3-8 s to refuse); one meaning per flag name (`--max-tokens` is the answer's
length everywhere); `module:Class` parts are found in the current directory, as `python -m` finds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refusion.cli import main

ROOT = Path(__file__).resolve().parents[2]

# (argv, the flag the one-line error names)
BAD_FLAGS = [
    (["serve", "--port", "70000"], "`--port` must be an integer in [1, 65535]; got 70000"),
    (["serve", "--host", "256.1.1.1"], "`--host` '256.1.1.1' is not an IP address"),
    (["serve", "--max-rows", "0"], "`--max-rows`"),
    (["serve", "--threads", "5000"], "`--threads`"),
    (["serve", "--shutdown-timeout", "nan"], "`--shutdown-timeout` must be a finite number"),
    (["serve", "--replicas", "0"], "`--replicas`"),
    (["serve", "--kv-memory", "lots"], "`--kv-memory`: invalid size: 'lots' (bytes, or a number with one of KB"),
    (["batch", "in.jsonl", "--out", "o.jsonl", "--kv-memory", "0GiB"], "`--kv-memory` must be at least 1 byte"),
    (["batch", "in.jsonl", "--out", "o.jsonl", "--max-batch-tokens", "0"], "`--max-batch-tokens`"),
    (
        ["batch", "in.jsonl", "--out", "o.jsonl", "--cpus-per-worker", "0"],
        "`--cpus-per-worker` must be a finite number > 0",
    ),
    (["generate", "x", "--gen-length", "-1"], "`--gen-length/--max-tokens` must be an integer in [1, 65536]"),
    (["generate", "x", "--max-tokens", "0"], "`--gen-length/--max-tokens`"),
    (["generate", "x", "--temperature", "inf"], "`--temperature` must be a finite number"),
    (["generate", "x", "--eos-token-id", "-2"], "`--eos-token-id`"),
    (["visualize", "x", "--sequence", "-1"], "`--sequence`"),
    (["bench", "--per-task", "0"], "`--per-task`"),
    (["eval", "--tasks", "x", "--num-fewshot", "-1"], "`--num-fewshot`"),
    (["eval", "--tasks", "x", "--batch-size", "auto"], "`--batch-size`: invalid int value: 'auto'"),
    (
        ["generate", "x", "--selector", "nope"],
        "`--selector`: Unknown selector 'nope'. Known selectors: credit, d2f, d3llm, dream-blocks",
    ),
    (["serve", "--infiller", "nope"], "`--infiller`: Unknown infiller 'nope'. Known infillers: denoise, draft"),
    (["visualize", "x", "--engine", "nope"], "`--engine`: Unknown engine 'nope'. Known engines: block,"),
    (["generate", "x", "--adapter", "nope"], "`--adapter`: Unknown model adapter 'nope'. Known model adapters: hf"),
    (["sweep", "--trials", "0"], "`--trials`"),
    (["sweep", "--minutes", "0"], "`--minutes` must be a finite number in (0, 43200]"),
    (["train", "--out", "x", "--steps", "0"], "`--steps`"),
]


@pytest.mark.parametrize("argv, named", BAD_FLAGS, ids=[" ".join(a[:3]) for a, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_naming_it(capsys, argv, named):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("refusion: error: ") and err.count("\n") == 1 and named in err, err


def test_no_bad_flag_imports_torch_transformers_or_fastapi():
    probe = (
        "import json, sys\nfrom refusion.cli import main\n"
        f"codes = [main(argv) for argv in {[argv for argv, _ in BAD_FLAGS]!r}]\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn', 'lm_eval', 'optuna', 'ray')"
        " if m in sys.modules)\nprint(json.dumps([codes, heavy]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    codes, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == [2] * len(BAD_FLAGS) and heavy == [], (codes, heavy)


def test_generate_takes_max_tokens_as_the_openai_spelling_of_gen_length(capsys):
    assert main(["generate", "rev helloworld=", "--max-tokens", "8", "--json"]) == 0
    by_alias = json.loads(capsys.readouterr().out)
    assert main(["generate", "rev helloworld=", "--gen-length", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == by_alias["tokens"]
    assert len(by_alias["commit_step"]) == 8


def test_a_part_in_a_module_of_the_current_directory_is_found(tmp_path):
    """`refusion generate --infiller jacobi_infiller:OneStepJacobi` run in examples/, as the docs show: the console
    script puts no directory on sys.path (a script file stands for it here, not `python -c`, which would)."""
    script = tmp_path / "refusion_command.py"
    script.write_text("import sys\nfrom refusion.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "generate",
            "rev helloworld=",
            "--infiller",
            "jacobi_infiller:OneStepJacobi",
            "--gen-length",
            "8",
        ],
        cwd=ROOT / "examples",
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "Cannot import" not in done.stderr


def test_the_current_directory_never_shadows_an_installed_module(tmp_path, monkeypatch):
    from refusion.cli import search_current_directory

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    search_current_directory()
    assert sys.path[-1] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1


def test_the_part_names_known_while_parsing_are_the_ones_the_built_ins_register():
    from refusion.plugins.manager import BUILTIN_NAMES, listed_names, make_plugin_manager
    from refusion.plugins.registry import Registry

    built = Registry(make_plugin_manager(entry_points=False))
    assert {kind: sorted(names) for kind, names in BUILTIN_NAMES.items()} == {
        kind: sorted(built.names(kind)) for kind in built.kinds()
    }
    assert listed_names("selector") == BUILTIN_NAMES["selector"]  # no entry-point plugin in the test environment


def test_a_part_name_while_parsing_is_left_to_the_registry_when_an_entry_point_plugin_is_on(monkeypatch):
    import importlib.metadata

    from refusion.plugins import manager

    class Dist:
        metadata = {"Name": "refusion-extra"}
        entry_points = [importlib.metadata.EntryPoint("extra", "refusion_extra", manager.ENTRY_POINT_GROUP)]

    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [Dist()])
    assert manager.listed_names("selector") is None  # its selectors are known only once it is imported
    monkeypatch.setenv(manager.DISABLE_ENV, "extra")
    assert manager.listed_names("selector") == manager.BUILTIN_NAMES["selector"]
