"""Bad sweep input gets a ConfigError naming the field or line; nothing here decodes."""

import json

import pytest

pytest.importorskip("optuna")

from refusion.config import load_preset, preset  # noqa: E402
from refusion.errors import ConfigError, UnknownNameError  # noqa: E402
from refusion.search.space import build_space  # noqa: E402
from refusion.search.spacefile import load_space_file  # noqa: E402
from refusion.search.study import open_study  # noqa: E402
from refusion.search.tasks import load_tasks  # noqa: E402

BASE = preset("paper")


@pytest.mark.parametrize("spec, words", [
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
])
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


@pytest.mark.parametrize("text, suffix, words", [
    ("space:\n  selector: [threshold\n", ".yaml", ["not valid YAML", "line"]),
    ("space = 3\n", ".toml", ["`space` must be a non-empty table"]),
    ("space:\n  slot_threshold: {low: 0.9, high: 0.5}\n", ".yaml", ["`space.slot_threshold`", "empty"]),
    ("space:\n  slot_size: [4]\nrounds: 3\n", ".yaml", ["unknown field(s) rounds"]),
    ("space:\n  slot_size: [4]\ngen_length: -1\n", ".yaml", ["`gen_length`"]),
    ("[space]\nslot_size = [4]\n", ".json", ["must end in .yaml"]),
])
def test_a_bad_space_file_names_the_file_and_field(tmp_path, text, suffix, words):
    path = tmp_path / f"space{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_space_file(path)
    for word in words:
        assert word in str(info.value)


def test_a_toml_space_file_reads_ranges_lists_and_tables(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text('preset = "paper"\ngen_length = 32\n[space]\nselector = ["threshold", "topk"]\n'
                    'slot_threshold = "0.5:0.9:0.2"\nk = { values = [1, 2] }\n'
                    'token_threshold = { low = 0.1, high = 0.3, step = 0.1 }\n')
    file = load_space_file(path)
    assert file.preset == "paper" and file.gen_length == 32
    space = build_space(BASE, file.dimensions)
    assert [d.grid() for d in space.dimensions] == [("threshold", "topk"), (0.5, 0.7, 0.9), (1, 2), (0.1, 0.2, 0.3)]


@pytest.mark.parametrize("data, field", [
    ({"params": {}}, "gen_length"),
    ({"gen_length": 32, "params": [1]}, "params"),
    ({"gen_length": 32, "selector": 3}, "selector"),
    ({"gen_length": 32, "slots": 3}, "slots"),
])
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
