"""Bad sweep input gets a ConfigError naming the field or line; nothing here decodes."""

import json

import pytest

pytest.importorskip("optuna")

from refusion.config import load_preset, preset
from refusion.errors import ConfigError, UnknownNameError
from refusion.sweep.space import build_space
from refusion.sweep.spacefile import load_space_file
from refusion.sweep.study import open_study
from refusion.sweep.tasks import load_tasks

BASE = preset("paper")


@pytest.mark.parametrize(
    "spec, words",
    [
        (["selector=threshold,nosuch"], ["`selector`", "'nosuch'", "topk"]),
        (["slicer=fixed"], ["`slicer`", "parameters are"]),
        (["slot_threshold=0.9:0.5"], ["`slot_threshold`", "empty"]),
        (["slot_threshold=0.5:0.9:0"], ["`slot_threshold`", "step"]),
        (["selector="], ["`selector`", "empty"]),
        (["slot_threshold=a:b"], ["`slot_threshold`", "numbers"]),
        (["k=1,2"], ["`k`", "no part the space can choose"]),
        (["selector.nosuch=1"], ["`selector.nosuch`"]),
        (["slot_size=4", "slot_size=8"], ["slot_size", "more than once"]),
        (["slot_threshold"], ["NAME=VALUES"]),
    ],
)
def test_a_bad_space_names_the_field(spec, words):
    with pytest.raises(ConfigError) as info:
        build_space(BASE, spec)
    for word in words:
        assert word in str(info.value)


def test_an_unknown_part_name_is_an_unknown_name_error():
    with pytest.raises(UnknownNameError, match="Known selectors"):
        build_space(BASE, ["selector=rightmost"])


def test_a_grid_needs_a_step_for_every_range():
    space = build_space(BASE, ["slot_threshold=0.5:0.9"])
    assert space.grid_size() is None
    with pytest.raises(ConfigError, match="needs a step"):
        space.grid()


def test_a_malformed_task_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "copy ab=", "answer": "ab"}\n\n{"prompt": "rev ab="\n')
    with pytest.raises(ConfigError, match="line 3: not valid JSON"):
        load_tasks(str(path))
    path.write_text('{"prompt": "copy ab=", "answer": "ab"}\n{"prompt": "rev ab=", "answer": 5}\n')
    with pytest.raises(ConfigError, match="line 2: field `answer` must be text"):
        load_tasks(str(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match="line 1: expected an object"):
        load_tasks(str(path))
    path.write_text("\n")
    with pytest.raises(ConfigError, match="no examples"):
        load_tasks(str(path))
    with pytest.raises(ConfigError, match="cannot be read"):
        load_tasks(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ConfigError, match="held-out:N"):
        load_tasks("gsm8k")


def test_an_unreadable_storage_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "trials.db"
    path.write_bytes(b"these are not optuna trials\n" * 10)
    with pytest.raises(ConfigError, match="`storage`.*not an SQLite database"):
        open_study(path, "s", {"space": []})
    assert path.read_bytes().startswith(b"these are not")
    with pytest.raises(ConfigError, match="`storage`"):
        open_study(tmp_path, "s", {"space": []})  # a directory


def test_resuming_a_study_with_another_space_is_refused(tmp_path):
    open_study(tmp_path / "s.db", "study", {"space": ["slot_size=4,8"], "tasks": "held-out"})
    with pytest.raises(ConfigError, match="different sweep.*differs in: space"):
        open_study(tmp_path / "s.db", "study", {"space": ["slot_size=4"], "tasks": "held-out"})
    open_study(tmp_path / "s.db", "other", {"space": ["slot_size=4"], "tasks": "held-out"})  # another name is fine


@pytest.mark.parametrize(
    "text, suffix, words",
    [
        ("space:\n  selector: [threshold\n", ".yaml", ["not valid YAML", "line"]),
        ("space = 3\n", ".toml", ["`space` must be a non-empty table"]),
        ("space:\n  slot_threshold: {low: 0.9, high: 0.5}\n", ".yaml", ["`space.slot_threshold`", "empty"]),
        ("space:\n  slot_size: [4]\nrounds: 3\n", ".yaml", ["unknown field(s) rounds"]),
        ("space:\n  slot_size: [4]\ngen_length: -1\n", ".yaml", ["`gen_length`"]),
        ("[space]\nslot_size = [4]\n", ".json", ["must end in .yaml"]),
    ],
)
def test_a_bad_space_file_names_the_file_and_field(tmp_path, text, suffix, words):
    path = tmp_path / f"space{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_space_file(path)
    for word in words:
        assert word in str(info.value)


def test_a_toml_space_file_reads_ranges_lists_and_tables(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text(
        'preset = "paper"\ngen_length = 32\n[space]\nselector = ["threshold", "topk"]\n'
        'slot_threshold = "0.5:0.9:0.2"\nk = { values = [1, 2] }\n'
        "token_threshold = { low = 0.1, high = 0.3, step = 0.1 }\n"
    )
    file = load_space_file(path)
    assert file.preset == "paper" and file.gen_length == 32
    space = build_space(BASE, file.dimensions)
    assert [d.grid() for d in space.dimensions] == [("threshold", "topk"), (0.5, 0.7, 0.9), (1, 2), (0.1, 0.2, 0.3)]


@pytest.mark.parametrize(
    "data, field",
    [
        ({"params": {}}, "gen_length"),
        ({"gen_length": 32, "params": [1]}, "params"),
        ({"gen_length": 32, "selector": 3}, "selector"),
        ({"gen_length": 32, "slots": 3}, "slots"),
    ],
)
def test_a_bad_preset_file_names_the_field(tmp_path, data, field):
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"`preset file`.*{field}"):
        load_preset(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_preset(path)


def test_preset_and_preset_file_together_are_refused(tmp_path, capsys):
    from refusion.cli import main

    path = tmp_path / "preset.json"
    path.write_text(json.dumps({"gen_length": 8, "params": {"slot_size": 4}}))
    assert main(["generate", "rev ab=", "--preset", "paper", "--preset-file", str(path)]) == 2
    assert "`--preset-file`" in capsys.readouterr().err


# -- every option, value and file checked before a model loads or a study is created ----------------------------


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the refusals below come before it."""
    import refusion.api
    import refusion.cli.sweep

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(refusion.api, "load_model", load_model)
    monkeypatch.setattr(refusion.cli.sweep, "load", load_model)


@pytest.mark.parametrize(
    "options, param",
    [
        ({"gen_length": 0}, "gen_length"),
        ({"gen_length": 10**9}, "gen_length"),
        ({"max_accuracy_drop": float("nan")}, "max_accuracy_drop"),
        ({"max_accuracy_drop": -0.1}, "max_accuracy_drop"),
        ({"trials": 0}, "trials"),
        ({"trials": 10**9}, "trials"),
        ({"minutes": float("inf")}, "minutes"),
        ({"seed": -1}, "seed"),
        ({"warmup": -1}, "warmup"),
        ({"tasks": "held-out:100000000"}, "tasks"),
        ({"tasks": "held-out:" + "9" * 5000}, "tasks"),
        ({"space": ["slot_threshold=nan,0.5"]}, "slot_threshold"),
        ({"space": ["slot_threshold=0:inf:0.1"]}, "slot_threshold"),
        ({"space": ["slot_size=1:1000000000:1"], "mode": "grid"}, "slot_size"),
        ({"space": ["slot_threshold=0.1:0.9:1e-12"]}, "slot_threshold"),
        ({"out": "{file}"}, "out"),  # an existing file: a raw FileExistsError before (issue 30)
        ({"mode_of_search": "grid"}, "mode_of_search"),  # not an option of a sweep
    ],
)
def test_a_bad_sweep_option_is_refused_before_the_model_loads(no_model, tmp_path, options, param):
    from refusion.sweep import run_sweep as sweep

    (tmp_path / "a_file").write_text("not a directory")
    options = {k: tmp_path / "a_file" if v == "{file}" else v for k, v in options.items()}
    kwargs = {"space": ["slot_threshold=0.5,0.9"], "out": tmp_path, "progress": False, **options}
    with pytest.raises(ConfigError) as info:
        sweep(**kwargs)
    assert info.value.param == param
    assert not (tmp_path / "sweep.db").exists()  # no study was created


@pytest.mark.parametrize(
    "spec, param, words",
    [
        (["slot_threshold=nan,0.5"], "slot_threshold", ["finite"]),
        (["slot_threshold=0.5,2"], "slot_threshold", ["value 2", "[0, 1]"]),
        (["slot_size=0:4:1"], "slot_size", ["value 0", ">= 1"]),
        (["selector=topk", "k=0,2"], "k", ["value 0"]),
        (["temperature=-1,0.5"], "temperature", ["value -1"]),
        (["seed=-1,3"], "seed", ["value -1"]),
        (["engine=branch,nosuch"], "engine", ["'nosuch'", "Known engines"]),
        (["sampler=gumbel,nosuch"], "sampler", ["'nosuch'"]),
    ],
)
def test_a_value_no_point_could_use_is_refused_not_dropped(spec, param, words):
    """Was: every point with the value failed its trial and was left out of the results without a word."""
    with pytest.raises(ConfigError) as info:
        build_space(BASE, spec)
    assert info.value.param == param
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        {"low": float("nan"), "high": 1.0},
        {"low": 0.0, "high": float("inf"), "step": 0.1},
        {"low": 0.0, "high": 1.0, "step": float("nan")},
        [0.5, float("nan")],
        {"low": "a", "high": 1},
        {"values": "abc"},
        {"values": [1], "low": 0},
        [[0.5, 0.6]],
        {"low": 0, "high": 10**30},
    ],
)
def test_nan_and_malformed_values_from_python_are_refused(spec):
    from refusion.sweep.space import dimension

    with pytest.raises(ConfigError) as info:
        build_space(BASE, [dimension("slot_threshold", spec)])
    assert info.value.param == "slot_threshold"


def test_a_huge_grid_is_counted_not_listed():
    huge = build_space(BASE, ["slot_size=1:1000000000:1"])
    assert huge.grid_size() == 10**9
    with pytest.raises(ConfigError, match="1000000000 grid points.*at most 100000") as info:
        huge.grid()
    assert info.value.param == "space"
    # many small dimensions multiply: 10**10 points, each dimension fine alone
    product = build_space(
        BASE,
        [
            "slot_threshold=0.01:1:0.01",
            "token_threshold=0.01:1:0.01",
            "serial_num_blocks=1:100:1",
            "slot_size=1:100:1",
            "seed=1:100:1",
        ],
    )
    assert product.grid_size() == 10**10
    with pytest.raises(ConfigError, match="grid points"):
        product.grid()
    with pytest.raises(ConfigError, match="at most 100000 points") as info:
        huge.dimensions[0].grid()
    assert info.value.param == "slot_size"


def test_a_grid_counts_repeated_values_once():
    space = build_space(BASE, ["selector=topk,topk,threshold", "k=1,1,2", "slot_threshold=0.5,0.5000000000001"])
    assert space.grid_size() == len(space.grid()) == 3


def test_lm_eval_limits_are_range_checked():
    from refusion.sweep.harness import parse_harness

    for limit in (0, 10**9, True, "5"):
        with pytest.raises(ConfigError) as info:
            parse_harness("lm-eval:gsm8k", limit=limit)
        assert info.value.param == "limit"


@pytest.mark.parametrize(
    "text, suffix, param",
    [
        ("space:\n  slot_threshold: [.nan, 0.5]\n", ".yaml", "slot_threshold"),
        ("[space]\nslot_threshold = [nan, 0.5]\n", ".toml", "slot_threshold"),
        ("space:\n  slot_threshold: {low: 0.1, high: 0.9, stepp: 0.1}\n", ".yaml", "slot_threshold"),
        ("space:\n  k: {values: [1], low: 0}\n", ".yaml", "k"),
        ("space:\n  slot_size: [4]\ngen_length: 1000000000\n", ".yaml", "gen_length"),
        ("space:\n  k: [" + "9" * 5000 + "]\n", ".yaml", "space_file"),
        ("[space]\nk = [" + "9" * 5000 + "]\n", ".toml", "space_file"),
        ("space:\n  k: " + "[" * 200 + "]" * 200 + "\n", ".yaml", "space_file"),
        ("[space]\nk = " + "[" * 5000 + "]" * 5000 + "\n", ".toml", "space_file"),
        (
            "a: &a [1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 8)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
            + "space:\n  k: [*i]\n",
            ".yaml",
            "a",
        ),
    ],
)
def test_a_bad_space_file_value_is_refused_with_the_file_and_field(tmp_path, text, suffix, param):
    path = tmp_path / f"space{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_space_file(path)
    assert info.value.param == param and str(path) in str(info.value)


def test_a_space_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_bytes(b"space:\n  k: [1]\n# caf\xe9\n")
    with pytest.raises(ConfigError, match="line 3: not UTF-8") as info:
        load_space_file(path)
    assert info.value.param == "space_file"


@pytest.fixture(scope="module")
def shipped():
    from refusion.api import load_model

    return load_model(None)


def test_a_task_file_the_tokenizer_cannot_read_is_refused_before_any_trial(shipped, tmp_path):
    """Was: an unknown character was read as the unknown token and every decoder scored 0% without a word."""
    from refusion.sweep import run_sweep as sweep

    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps({"prompt": "rev ab=", "answer": "ba"})
        + "\n"
        + json.dumps({"prompt": "rev \u00e9t\u00e9=", "answer": "\u00e9t\u00e9"})
        + "\n"
    )
    with pytest.raises(ConfigError, match=r"line 2: field `prompt` has characters .* does not know: '\u00e9'") as info:
        sweep(["slot_threshold=0.5,0.9"], str(path), model=shipped, out=tmp_path / "out", progress=False)
    assert info.value.param == "tasks" and not (tmp_path / "out" / "sweep.db").exists()


def test_a_prompt_with_no_room_for_the_generation_is_refused_before_any_trial(shipped, tmp_path):
    from refusion.sweep import run_sweep as sweep

    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps({"prompt": "rev ab=", "answer": "ba"})
        + "\n"
        + json.dumps({"prompt": "copy " + "ab" * 60 + "=", "answer": "ab"})
        + "\n"
    )
    with pytest.raises(ConfigError, match=r"line 2 \(\d+ tokens\) exceeds the model's 128 positions") as info:
        sweep(["slot_threshold=0.5,0.9"], str(path), model=shipped, out=tmp_path / "out", progress=False, gen_length=32)
    assert info.value.param == "gen_length" and not (tmp_path / "out" / "sweep.db").exists()


def test_a_bad_value_in_a_space_file_names_the_file(shipped, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("space:\n  slot_threshold: [0.5, 2]\n")
    from refusion.sweep import run_sweep as sweep

    with pytest.raises(
        ConfigError, match=r"`space file` '.*space.yaml', field `space.slot_threshold`.*value 2"
    ) as info:
        sweep(space_file=path, model=shipped, out=tmp_path / "out", progress=False)
    assert info.value.param == "slot_threshold"


def test_the_cli_checks_a_sweep_before_loading_the_model(no_model, tmp_path, capsys):
    from refusion.cli import main

    assert main(["sweep", "-s", "slot_size=1:1000000000:1", "--mode", "grid", "--out", str(tmp_path)]) == 2
    assert "at most 100000" in capsys.readouterr().err
    assert main(["sweep", "-s", "slot_size=4,8", "--gen-length", "1000000000", "--out", str(tmp_path)]) == 2
    assert "`--gen-length`" in capsys.readouterr().err
    assert main(["sweep", "-s", "slot_size=4,8", "--tasks", "lm-eval:x", "--limit", "0", "--out", str(tmp_path)]) == 2
    assert "`--limit`" in capsys.readouterr().err
