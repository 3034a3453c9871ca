"""Every bad input is refused before any work with a message naming it (issue 14's table).

CLI rows run in-process through ``refusion.cli.main`` (exit status and
``refusion: error: ...`` on stderr, never a traceback); API rows assert the
exception type and the named input. Two subprocess runs prove that a real
shell sees no traceback either.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
import types

import pytest
import torch

import refusion
from refusion.cli import main
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, PluginError, UnknownNameError

NAN, INF = float("nan"), float("inf")

# (arguments, exit status, text the message must contain)
CLI_CASES = [
    # 1: lengths far beyond the model are refused before slots are built (the flag's range while parsing)
    (
        ["generate", "rev hello=", "--gen-length", "1000000000"],
        2,
        "`--gen-length/--max-tokens` must be an integer in [1, 65536]; got 1000000000",
    ),
    (["generate", "rev hello=", "--gen-length", "1000"], 2, "`gen_length` (1000)"),
    (["generate", "rev hello=", "--gen-length", "0"], 2, "`--gen-length/--max-tokens` must be an integer in [1, "),
    (["generate", "rev hello=", "--gen-length", "-5"], 2, "got -5"),
    (["generate", "rev hello=", "--gen-length", "four"], 2, "invalid int value: 'four'"),
    # 2: NaN / inf floats
    (["generate", "rev hello=", "--temperature", "nan"], 2, "`--temperature` must be a finite number; got nan"),
    (["generate", "rev hello=", "--temperature", "inf"], 2, "got inf"),
    (["generate", "rev hello=", "--temperature", "-1"], 2, "`temperature`"),
    (["generate", "rev hello=", "--slot-threshold", "nan"], 2, "`--slot-threshold`"),
    (["generate", "rev hello=", "--slot-threshold", "2"], 2, "`slot_threshold`"),
    (["generate", "rev hello=", "--token-threshold", "inf"], 2, "`--token-threshold`"),
    (["generate", "rev hello=", "--temperature", "1", "--top-p", "nan"], 2, "`--top-p`"),
    (["generate", "rev hello=", "--selector", "factor", "-p", "factor=nan"], 2, "`factor`"),
    (["generate", "rev hello=", "--selector", "factor", "-p", "factor=-inf"], 2, "`factor`"),
    (["generate", "rev hello=", "--slot-size", "0"], 2, "`--slot-size` must be an integer >= 1; got 0"),
    # 3: a length the partitioner cannot split is refused with the nearest allowed ones
    (
        ["generate", "rev hello=", "--slot-size", "4", "--serial-blocks", "3", "--gen-length", "16"],
        2,
        "Nearest allowed `gen_length`: 12 or 21",
    ),
    (["bench", "--method", "paper", "--gen-length", "4", "--per-task", "1"], 2, "method 'paper' cannot decode"),
    # 4: bench counts
    (
        ["bench", "--per-task", "0"],
        2,
        "`--per-task` must be an integer in [1, 1000] (held-out examples per task); got 0",
    ),
    (["bench", "--per-task", "-1"], 2, "got -1"),
    (["bench", "--gen-length", "0"], 2, "`--gen-length`"),
    # 5: characters the char tokenizer does not know
    (["generate", "Rev HelloWorld="], 2, "'R', 'H', 'W'"),
    (["generate", "HÉLLO€="], 2, "'€'"),
    (["generate", "rev hello!"], 2, "alphabet"),
    # 6: train
    (["train", "--threads", "0", "--out", "{tmp}/m"], 2, "`--threads` must be an integer in [1, 4096]; got 0"),
    (["train", "--threads", "-1", "--out", "{tmp}/m"], 2, "`--threads`"),
    (["train", "--steps", "0", "--out", "{tmp}/m"], 2, "`--steps`"),
    (["train", "--out", "{tmp}/a_file"], 2, "is an existing file"),
    # 7 and 8: models, devices, dtypes, chat templates, output paths, eval tasks
    (["generate", "x", "--model", "{tmp}"], 2, "has no config.json"),
    (["generate", "x", "--model", "/nonexistent"], 2, "'/nonexistent': no such directory"),
    (["generate", "x", "--model", "{tmp}/a_file"], 2, "is a file"),
    (
        ["generate", "x", "--device", "cuda"]
        if not torch.cuda.is_available()
        else ["generate", "x", "--device", "cuda:99"],
        2,
        "`device` 'cuda",
    ),
    (["generate", "x", "--device", "potato"], 2, "`device`"),
    (["generate", "x", "--dtype", "float17"], 2, "float17"),
    (["generate", "x", "--chat"], 2, "no chat template"),
    (["visualize", "rev hello=", "--out", "/nonexistent/dir/x.png"], 2, "'/nonexistent/dir' does not exist"),
    (["visualize", "rev hello=", "--out", "{tmp}"], 2, "must end in one of"),
    (["visualize", "rev hello=", "--out", "{tmp}/x.png", "--gif", "{tmp}/x.png"], 2, "`--gif`"),
    (["eval", "--tasks", ","], 2, "`--tasks`"),
    (["eval", "--tasks", "x", "--limit", "0"], 2, "`--limit`"),
    # 9: options that would be ignored
    (["generate", "x", "--eos-token-id", "999"], 2, "`eos_token_id` must be token ids in [0, 48)"),
    (["generate", "x", "--mask-token-id", "48"], 2, "`mask_token_id`"),
    (["generate", "x", "--logit-shift", "1"], 2, "`logit_shift` 1 applies only with adapter 'hf-mdm'"),
    (["generate", "x", "--top-p", "0.5"], 2, "`top_p` has no effect at `temperature` 0"),
    (["generate", "x", "--top-k", "3"], 2, "`top_k` has no effect"),
    # 10: visualize format, bench method before the AR baseline
    (["visualize", "rev hello=", "--out", "{tmp}/x.bmp"], 2, "must end in one of .png, .jpg"),
    (["bench", "--method", "nope"], 2, "Unknown preset 'nope'"),
    # 11: the mask token in a prompt
    (["generate", "--ids", "5,2,7"], 2, "mask token id 2 at position(s) [1]"),
    (["generate", "--ids", "5,x"], 2, "comma-separated integers"),
    (["generate", "--ids", "5,480"], 2, "`prompt_ids` must be token ids in [0, 48)"),
    # unknown names and malformed parameters
    (["generate", "x", "--selector", "nope"], 2, "Unknown selector 'nope'"),
    (["generate", "x", "--engine", "nope"], 2, "nope"),
    (["generate", "x", "-p", "nonsense=1"], 2, "Unknown parameter `nonsense`"),
    (["generate", "x", "-p", "novalue"], 2, "expected KEY=VALUE"),
    (["generate", "x", "--seed", "-1"], 2, "`--seed`"),
    (["generate", "x", "--preset", "nope"], 2, "invalid choice: 'nope'"),
    (["generate", "x", "--adapter", "nope"], 2, "Unknown model adapter 'nope'"),
    # issue 21: special-token text, text that is not Unicode, class paths that cannot be imported safely
    (["generate", "rev <|endoftext|>="], 2, "special token(s) '<|endoftext|>'"),
    (["generate", "rev ab<|mask|>="], 2, "'<|mask|>'"),
    (["generate", "rev \udcff="], 2, "is not valid text"),
    (["generate", "x", "--engine", ":X"], 2, "':X' is not a class path"),
    (["generate", "x", "--selector", ".relative:X"], 2, "'.relative:X' is not a class path"),
    (["generate", "x", "--selector", "os:path"], 2, "names a module, not a class"),
    (["generate", "x", "--selector", "no_such_module_xyz:Sel"], 2, "Cannot import 'no_such_module_xyz:Sel'"),
    (["generate", "x", "--model", "{tmp}/damaged"], 2, "could not be loaded as a checkpoint (SafetensorError"),
    (["generate", "x", "--model", "{tmp}/bad_config"], 2, "`vocab_size` must be an integer in [1, 16777216]"),
]


@pytest.fixture
def tmp(tmp_path):
    import json
    import shutil

    from refusion.models.default import default_model_path

    (tmp_path / "a_file").write_text("not a directory")
    shutil.copytree(default_model_path(), tmp_path / "damaged")
    weights = tmp_path / "damaged" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a download cut short
    shutil.copytree(default_model_path(), tmp_path / "bad_config")
    config = json.loads((tmp_path / "bad_config" / "config.json").read_text())
    (tmp_path / "bad_config" / "config.json").write_text(json.dumps({**config, "vocab_size": -5}))
    return tmp_path


@pytest.mark.parametrize("argv, status, named", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_cli_refuses_bad_input_without_a_traceback(argv, status, named, tmp, capsys, monkeypatch):
    import refusion.measure.bench

    monkeypatch.setattr(refusion.measure.bench, "measure", _no_work)  # nothing may be measured before the refusal
    code = _run([a.replace("{tmp}", str(tmp)) for a in argv])
    err = capsys.readouterr().err
    assert code == status, err
    assert named in err, err
    assert "error:" in err and "Traceback" not in err


def test_the_table_is_long_enough():
    assert len(CLI_CASES) + len(API_CASES) >= 40


def _run(argv):
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the input was checked")


# (callable, exception type, text the message must contain)
API_CASES = [
    (lambda m: refusion.generate("rev hello=", m, gen_length=10**7), ConfigError, "`gen_length` (10000000)"),
    (lambda m: refusion.generate("rev hello=", m, gen_length=2.5), ConfigError, "`gen_length` must be an integer"),
    (lambda m: refusion.generate("rev hello=", m, temperature=NAN), ConfigError, "`temperature`"),
    (lambda m: refusion.generate("rev hello=", m, temperature=1.0, top_k=0), ConfigError, "`top_k`"),
    (lambda m: refusion.generate("rev hello=", m, slot_threshold=INF), ConfigError, "`slot_threshold`"),
    (lambda m: refusion.generate("rev hello=", m, token_threshold="high"), ConfigError, "`token_threshold`"),
    (lambda m: refusion.generate("Rev Hello=", m), ConfigError, "'R', 'H'"),
    (lambda m: refusion.generate("rev hello=", m, chat=True), ConfigError, "chat template"),
    (lambda m: refusion.generate([5, 2, 7], m), ConfigError, "mask token id 2"),
    (lambda m: refusion.generate([[5, 6], [2]], m), ConfigError, "mask token id 2"),
    (
        lambda m: refusion.generate("rev hello=", m, gen_length=16, slot_size=4, serial_num_blocks=3),
        ConfigError,
        "Nearest allowed `gen_length`: 12 or 21",
    ),
    (lambda m: refusion.load_model(dtype="float17"), ConfigError, "`dtype`"),
    (lambda m: refusion.load_model("/nonexistent/model"), ConfigError, "no such directory"),
    (lambda m: refusion.load_model(eos_token_id=999), ConfigError, "`eos_token_id`"),
    (lambda m: refusion.load_model(device="nope"), ConfigError, "`device`"),
    (lambda m: Decoder.from_names(selector="factor", factor=NAN), ConfigError, "`factor`"),
    (lambda m: Decoder.from_names(partitioner="semi-ar", block_length=0), ConfigError, "`block_length`"),
    (lambda m: Decoder.from_names(selector="nope"), UnknownNameError, "Unknown selector 'nope'"),
    # issue 21
    (lambda m: refusion.generate("rev <|endoftext|>=", m), ConfigError, "special token(s) '<|endoftext|>'"),
    (lambda m: refusion.generate("rev \ud800=", m), ConfigError, "is not valid text"),
    (lambda m: refusion.generate("rev ab=", m, sample="abc"), ConfigError, "Unknown parameter `sample`"),
    (lambda m: refusion.generate("rev ab=", m, engine="os:getcwd"), ConfigError, "names a builtin_function_or_method"),
    (lambda m: refusion.generate("rev ab=", m, selector="json:"), ConfigError, "is not a class path"),
    (
        lambda m: refusion.generate("rev ab=", m, selector="tests.cli.broken_module_for_imports:X"),
        ConfigError,
        "raised RuntimeError: this module refuses to be imported",
    ),
]


@pytest.fixture(scope="module")
def shipped():
    return refusion.load_model()


@pytest.mark.parametrize("call, error, named", API_CASES, ids=[str(i) for i in range(len(API_CASES))])
def test_api_refuses_bad_input_naming_it(call, error, named, shipped):
    started = time.process_time()
    with pytest.raises(error) as info:
        call(shipped)
    assert named in str(info.value)
    assert time.process_time() - started < 2.0  # refused before any real work (10**7 tokens once took 40 GB)


def test_a_length_the_user_asks_for_is_decoded_exactly(shipped):
    for preset in ("llada", "model"):
        result = refusion.generate(
            "rev hello=", shipped, preset=None if preset == "model" else preset, gen_length=6, stop_at_eos=False
        )
        assert result.partition.gen_length == 6 and len(result.region_tokens) == 6


def test_a_preset_length_that_does_not_fit_the_shipped_model_is_fitted_with_a_note(shipped, capsys):
    with pytest.warns(refusion.errors.RefusionWarning, match="128 positions"):
        result = refusion.generate("rev hello=", shipped, preset="paper")
    assert result.partition.gen_length == 112  # the longest <= 128 - 10 whose 8-token slots split into 2 blocks
    assert main(["generate", "rev hello=", "--preset", "gsm8k"]) == 0
    err = capsys.readouterr().err
    assert "refusion: note: `gen_length` not given" in err


def test_bench_compares_every_method_at_the_same_length(shipped, monkeypatch, capsys):
    import refusion.measure.bench

    lengths = []
    real = refusion.measure.bench.decoder_method

    def spy(decoder, model, gen_length):
        lengths.append(gen_length)
        return real(decoder, model, gen_length)

    monkeypatch.setattr(refusion.measure.bench, "decoder_method", spy)
    import refusion.training.tasks as tasks

    few = tasks.held_out(1)[:2]
    monkeypatch.setattr(tasks, "held_out", lambda n, **kw: few)
    assert (
        main(["bench", "--method", "llada", "--method", "model", "--gen-length", "5", "--per-task", "1", "--json"]) == 0
    )
    rows = __import__("json").loads(capsys.readouterr().out)["rows"]  # bench --json prints a record
    assert [r["method"] for r in rows][1:] == ["llada", "model"]
    assert lengths == [5, 5]


def test_runtime_failures_exit_1_and_oserrors_2_without_a_traceback(monkeypatch, capsys):
    import refusion.api

    monkeypatch.setattr(refusion.api, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    assert main(["generate", "rev hello="]) == 1
    err = capsys.readouterr().err
    assert "refusion: error: RuntimeError: boom (run with --debug" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="boom"):
        main(["generate", "rev hello=", "--debug"])
    monkeypatch.setattr(refusion.api, "generate", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    assert main(["generate", "rev hello="]) == 2
    assert "refusion: error: offline" in capsys.readouterr().err


def test_eval_task_errors_are_reported_not_raised(monkeypatch, capsys):
    evaluation = pytest.importorskip("refusion.measure.lmeval")

    def unknown(*args, **kwargs):
        raise KeyError("Spec 'nope' is not a registered task/group/tag name")

    monkeypatch.setattr(evaluation, "evaluate", unknown)
    assert main(["eval", "--tasks", "nope"]) == 2
    assert "`--tasks` 'nope': Spec 'nope'" in capsys.readouterr().err


def test_a_misspelt_hook_is_reported_with_the_plugin_name():
    from refusion.plugins import hookimpl
    from refusion.plugins.manager import make_plugin_manager

    plugin = types.ModuleType("my_selectors")

    @hookimpl
    def register_selector(register):  # misspelt: the hook is register_selectors
        pass

    plugin.register_selector = register_selector
    with pytest.raises(PluginError, match="Plugin 'my_selectors'.*unknown hook.*register_selector.*register_selectors"):
        make_plugin_manager(entry_points=False, extra=(plugin,))


def test_visualize_writes_the_format_its_suffix_names(shipped, tmp_path):
    pytest.importorskip("matplotlib")
    from refusion.viz.plot import render_png

    result = refusion.generate("rev hello=", shipped, gen_length=8)
    jpg = render_png(result, tmp_path / "x.jpg", tokenizer=shipped.tokenizer)
    assert jpg.read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not PNG bytes
    png = render_png(result, tmp_path / "x.png", tokenizer=shipped.tokenizer)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_partitioner_that_changes_the_length_is_a_plugin_error():
    import attrs

    from refusion.decoding.types import Partition, Slot
    from refusion.strategies.base import SlotPartitioner

    @attrs.frozen
    class RoundsUp(SlotPartitioner):
        name = "rounds-up"

        def partition(self, gen_length):
            return Partition(8, tuple(Slot(i, i, 1, 0) for i in range(8)), (tuple(range(8)),))

    decoder = Decoder.from_names(partitioner=RoundsUp())
    with pytest.raises(PluginError, match="honour `gen_length` exactly"):
        decoder.partition(5)


def test_an_unfinite_float_of_a_plugin_part_is_refused_even_without_its_own_validator():
    import attrs

    from refusion.plugins.registry import registry
    from refusion.strategies.base import SlotSelector

    @attrs.frozen
    class Lax(SlotSelector):
        name = "lax"
        weight: float = 1.0

        def select(self, plan):
            return [0]

    with pytest.raises(ConfigError, match="`selector.weight` must be a finite number"):
        registry().build("selector", Lax, weight=math.nan)


@pytest.mark.parametrize("argv", [["generate", "HÉLLO€="], ["bench", "--per-task", "0"]])
def test_a_shell_user_sees_one_error_line(argv):
    done = subprocess.run([sys.executable, "-m", "refusion.cli", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("refusion: error: ") and "Traceback" not in done.stderr


def test_special_token_text_is_read_as_special_only_when_the_caller_opts_in(shipped, capsys):
    eos = shipped.tokenizer.eos_token_id
    from refusion.prompts import encode_prompt

    ids = encode_prompt("rev ab<|endoftext|>=", shipped.tokenizer, None, allow_special=True)
    assert eos in ids  # what the caller opted into: the text becomes the special id
    result = refusion.generate("rev ab<|endoftext|>=", shipped, allow_special=True, gen_length=4)
    assert result.prompt_length == len(ids) == len("rev ab") + 2  # the special text is one id
    assert _run(["generate", "rev ab<|endoftext|>=", "--allow-special-tokens", "--gen-length", "4"]) == 0
