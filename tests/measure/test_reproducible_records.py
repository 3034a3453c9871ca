"""Bench and eval results carry their environment and decoder spec; `refusion reproduce` re-runs them."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.cli import main
from refusion.config import PRESETS, DecoderSpec
from refusion.decoding.decoder import Decoder
from refusion.decoding.sampling import Sampling
from refusion.errors import ConfigError
from refusion.measure.records import check_record, environment, load_record, model_source


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_decoder_survives_its_spec_as_json(name):
    decoder = Decoder.from_spec(PRESETS[name])
    assert Decoder.from_spec(DecoderSpec.from_dict(json.loads(json.dumps(decoder.spec.to_dict())))) == decoder


@settings(max_examples=15)
@given(
    temperature=st.sampled_from([0.0, 0.5, 1.3]),
    top_k=st.sampled_from([None, 3]),
    seed=st.integers(0, 2**31),
    engine=st.sampled_from([None, "branch", "repeat"]),
    stop=st.sampled_from([True, False, "block"]),
    k=st.integers(1, 4),
)
def test_decoder_specs_round_trip(temperature, top_k, seed, engine, stop, k):
    top_k = top_k if temperature > 0 else None  # top_k without sampling is refused
    decoder = Decoder.from_names(
        selector="topk", k=k, sample=Sampling(temperature, top_k), seed=seed, engine=engine, stop_at_eos=stop
    )
    assert Decoder.from_spec(DecoderSpec.from_dict(json.loads(json.dumps(decoder.spec.to_dict())))) == decoder


def test_a_spec_that_names_no_decoder_is_refused_naming_the_field():
    spec = Decoder.from_names().spec.to_dict()
    del spec["selector"]["name"]
    with pytest.raises(ConfigError, match=r"field `selector` must be an object with a `name`") as err:
        DecoderSpec.from_dict(spec)
    assert err.value.param == "selector"
    spec = Decoder.from_names().spec.to_dict()
    spec["infiller"]["params"]["token_threshold"] = 7
    with pytest.raises(ConfigError, match=r"token_threshold") as err:
        Decoder.from_spec(DecoderSpec.from_dict(spec))
    assert err.value.param == "token_threshold"
    spec = Decoder.from_names().spec.to_dict()
    spec["sampler"] = {"name": "categorical", "params": {"temperature": 1.0, "typical_p": 0.5}}
    with pytest.raises(ConfigError, match=r"sampler 'categorical' takes"):
        Decoder.from_spec(DecoderSpec.from_dict(spec))


def test_the_environment_names_versions_threads_and_the_model_source():
    import refusion

    env = environment(refusion.load_model(None), engine="branch", seeds=[3])
    assert {"refusion", "torch", "transformers", "python", "device", "dtype", "torch_threads"} <= set(env)
    assert env["engine"] == "branch" and env["seeds"] == [3] and env["dtype"] == "torch.float32"
    assert env["model"]["shipped"] and len(env["model"]["sha256"]) == 64
    assert model_source(None) == {
        "path": None,
        "shipped": False,
        "git_revision": None,
        "git_dirty": None,
        "sha256": None,
    }


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_reproduce_round_trips_a_bench_record_and_flags_a_changed_token(tmp_path, capsys, one_thread):
    path = tmp_path / "bench.json"
    assert main(["bench", "--per-task", "1", "--method", "model", "--json", "--record", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    record = load_record(path)
    assert printed == record and record["kind"] == "bench"
    assert [r["method"] for r in record["rows"]] == ["AR: transformers generate", "model"]
    assert record["rows"][0]["decoder"] is None and record["rows"][1]["decoder"]["partitioner"]["name"] == "fixed"
    assert all(r["examples"] == 6 == len(r["outputs"]) and r["forwards"] > 0 for r in record["rows"])
    assert record["environment"]["torch_threads"] == 1 and record["rows"][1]["engine"] == "branch"

    assert main(["reproduce", str(path), "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)
    assert outcome["matches"] and outcome["differences"] == [] and len(outcome["timings"]) == 2

    record["rows"] = record["rows"][1:]  # the ReFusion row alone, one token changed
    record["rows"][0]["outputs"][2][0] += 1
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(record))
    assert main(["reproduce", str(changed)]) == 1
    report = capsys.readouterr().out
    assert "NOT reproduced" in report and "model: tokens of 1 example(s) differ (first: example 2)" in report


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.pop("environment"), "field `environment` is missing"),
        (lambda r: r.update(kind="sweep"), "field `kind` must be one of 'bench', 'eval'"),
        (lambda r: r.update(schema="other"), "field `schema` must be 'refusion-record'"),
        (lambda r: r["settings"].pop("per_task"), "field `settings.per_task` is missing"),
        (lambda r: r["rows"][0].update(forwards="many"), "field `rows\\[0\\].forwards` must be an integer"),
        (lambda r: r["rows"][0].pop("decoder"), "field `rows\\[0\\].decoder` is missing"),
        (lambda r: r.update(rows=[]), "field `rows` is empty"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(edit, message):
    record = {
        "schema": "refusion-record",
        "version": 1,
        "kind": "bench",
        "environment": {},
        "settings": {"per_task": 1, "gen_length": 32, "methods": ["model"]},
        "rows": [
            {
                "method": "model",
                "examples": 6,
                "correct": 6,
                "forwards": 9,
                "tokens": 30,
                "seconds": 0.5,
                "outputs": [],
                "decoder": None,
            }
        ],
    }
    check_record(record)
    edit(record)
    with pytest.raises(ConfigError, match=message):
        check_record(record)


def test_reproduce_refuses_unreadable_and_non_json_files(tmp_path, capsys):
    assert main(["reproduce", str(tmp_path / "missing.json")]) == 2
    assert "cannot be read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{rows: 1")
    assert main(["reproduce", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_an_eval_record_carries_the_environment_decoder_and_settings(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    from tests.support.lmeval_task import write_task

    write_task(tmp_path, monkeypatch)
    path = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--tasks",
                "refusion_synthetic",
                "--include-path",
                str(tmp_path),
                "--model-args",
                "selector=topk,k=2",
                "--record",
                str(path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    record = load_record(path)
    assert (
        record["kind"] == "eval" and record["generations"] == 2 and record["decoder"]["selector"]["params"] == {"k": 2}
    )
    assert record["environment"]["engine"] == "branch" and record["settings"]["torch_random_seed"] == 1234
    assert record["results"]["refusion_synthetic"]["exact_match,none"] == 1.0


def test_reproducing_an_eval_record_compares_every_metric_and_the_texts(monkeypatch):
    import refusion.measure.lmeval as evaluation
    from refusion.measure.reproduce import reproduce

    env = {"refusion": "0.1.0", "torch": "2.13.0", "torch_threads": 1}
    record = {
        "schema": "refusion-record",
        "version": 1,
        "kind": "eval",
        "environment": env,
        "decoder": None,
        "settings": {"tasks": ["t"], "model_args": "k=2", "limit": None, "torch_random_seed": 7},
        "results": {"t": {"exact_match,none": 1.0, "exact_match_stderr,none": float("nan")}},
        "outputs_sha256": "a" * 64,
        "generations": 2,
    }
    calls = []

    def rerun(tasks, **kwargs):  # what the re-run gives: the same metrics, the texts changed, a newer torch
        calls.append((tasks, kwargs))
        return {}, {**record, "environment": {**env, "torch": "2.14.0"}, "outputs_sha256": "b" * 64}

    monkeypatch.setattr(evaluation, "evaluate_with_record", rerun)
    outcome = reproduce(record)
    assert calls == [(["t"], {"model_args": "k=2", "include_path": None, "limit": None, "torch_random_seed": 7})]
    assert not outcome.matches and outcome.differences == (
        "generated texts differ (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)",
    )
    assert outcome.environment_changes == ("torch: 2.13.0 -> 2.14.0",)  # NaN stderr counts as equal


# -- every field of a record checked when it is read; "module:Class" names only with --allow-imports ------------------


def _bench_record(**settings):
    return {
        "schema": "refusion-record",
        "version": 1,
        "kind": "bench",
        "environment": {"torch_threads": 1},
        "settings": {"per_task": 1, "gen_length": 32, "methods": ["model"], **settings},
        "rows": [
            {
                "method": "model",
                "examples": 6,
                "correct": 6,
                "forwards": 9,
                "tokens": 30,
                "seconds": 0.5,
                "outputs": [[1, 2]],
                "decoder": PRESETS["paper"].to_dict(),
            }
        ],
    }


@pytest.mark.parametrize(
    "edit, param",
    [
        (lambda r: r["settings"].update(per_task=100_000), "settings.per_task"),  # 600,000 examples
        (lambda r: r["settings"].update(gen_length="abc"), "settings.gen_length"),
        (lambda r: r["settings"].update(gen_length=[32]), "settings.gen_length"),
        (lambda r: r["settings"].update(gen_length=10**9), "settings.gen_length"),
        (lambda r: r["settings"].update(methods="model"), "settings.methods"),
        (lambda r: r["settings"].update(cost_model="qwen3-8b@tpu"), "settings.cost_model"),
        (lambda r: r["settings"].update(model={"mask_token_id": [1]}), "settings.model.mask_token_id"),
        (lambda r: r["settings"].update(model={"dtype": 16}), "settings.model.dtype"),
        (lambda r: r["settings"].update(model={"pretrained": "x"}), "settings.model.pretrained"),
        (lambda r: r["settings"].update(per_tasks=1), "settings.per_tasks"),
        (lambda r: r.update(comment="hi"), "comment"),
        (lambda r: r["environment"].update(torch_threads="many"), "environment.torch_threads"),
        (lambda r: r["environment"].update(gpu="x"), "environment.gpu"),
        (lambda r: r["rows"][0].update(examples=[6]), "rows[0].examples"),
        (lambda r: r["rows"][0].update(examples=600_000), "rows[0].examples"),
        (lambda r: r["rows"][0].update(correct=7), "rows[0].correct"),
        (lambda r: r["rows"][0].update(seconds=float("nan")), "rows[0].seconds"),
        (lambda r: r["rows"][0].update(outputs=[["a"]]), "rows[0].outputs[0]"),
        (lambda r: r["rows"][0].update(forward=9), "rows[0].forward"),
        (
            lambda r: r["rows"][0]["decoder"]["selector"]["params"].update(slot_treshold=0.9),
            "rows[0].decoder.selector.params.slot_treshold",
        ),
    ],
)
def test_a_record_with_a_wrong_field_is_refused_naming_the_file_and_field(tmp_path, edit, param):
    record = _bench_record()
    check_record(record)
    edit(record)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as err:
        load_record(path)
    named = f"`{param}`" if not param.startswith("rows[0].decoder.") else "`selector.params.slot_treshold`"
    assert err.value.param == param and str(path) in str(err.value) and named in str(err.value)


@pytest.mark.parametrize(
    "edit, param",
    [
        (lambda r: r["settings"].update(limit=10**9), "settings.limit"),
        (lambda r: r["settings"].update(tasks="t"), "settings.tasks"),
        (lambda r: r["settings"].update(torch_random_seed=-1), "settings.torch_random_seed"),
        (lambda r: r.update(outputs=[]), "outputs"),
    ],
)
def test_an_eval_record_with_a_wrong_field_is_refused(edit, param):
    record = {
        "schema": "refusion-record",
        "version": 1,
        "kind": "eval",
        "environment": {},
        "decoder": None,
        "settings": {"tasks": ["t"], "model_args": "", "limit": None},
        "results": {"t": {}},
    }
    check_record(record)
    edit(record)
    with pytest.raises(ConfigError) as err:
        check_record(record)
    assert err.value.param == param


def test_a_record_file_that_is_not_utf8_or_too_deep_is_refused(tmp_path):
    path = tmp_path / "run.json"
    path.write_bytes(b'{"schema": "refusion-record",\n "kind": "b\xe9nch"}')
    with pytest.raises(ConfigError, match="line 2: not UTF-8") as err:
        load_record(path)
    assert err.value.param == "RECORD"
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(ConfigError, match="nested"):
        load_record(path)


@pytest.fixture
def no_model(monkeypatch):
    """Loading the record's model raises a marker: a test sees whether reproduce got that far."""
    import refusion.measure.reproduce as reproduction

    class Loaded(Exception):
        pass

    def load_model_from(settings):
        raise Loaded()

    monkeypatch.setattr(reproduction, "load_model_from", load_model_from)
    return Loaded


@pytest.mark.parametrize(
    "decoder, field",
    [
        ({**PRESETS["paper"].to_dict(), "selector": {"name": "no_such_module_xyz:Selector", "params": {}}}, "selector"),
        ({**PRESETS["paper"].to_dict(), "engine": "no_such_module_xyz:Engine"}, "engine"),
        ({"gen_length": 32, "params": {}, "infiller": "no_such_module_xyz:Infiller"}, "infiller"),  # earlier format
    ],
)
def test_reproduce_refuses_module_paths_unless_allowed(no_model, decoder, field):
    from refusion.measure.reproduce import reproduce

    record = _bench_record()
    record["rows"][0]["decoder"] = decoder
    with pytest.raises(ConfigError, match="--allow-imports") as err:
        reproduce(record)
    assert err.value.param == f"rows[0].decoder.{field}"
    with pytest.raises(no_model):  # allowed: on to loading the model (nothing was imported before)
        reproduce(record, allow_imports=True)


def test_reproduce_refuses_module_paths_in_eval_model_args(no_model, monkeypatch):
    import refusion.measure.reproduce as reproduction

    record = {
        "schema": "refusion-record",
        "version": 1,
        "kind": "eval",
        "environment": {},
        "decoder": None,
        "settings": {"tasks": ["t"], "model_args": "selector=no_such_module_xyz:Selector,k=2"},
        "results": {"t": {}},
    }
    with pytest.raises(ConfigError, match="--allow-imports") as err:
        reproduction.reproduce(record)
    assert err.value.param == "settings.model_args.selector"


def test_reproduce_on_the_command_line_takes_allow_imports(no_model, tmp_path, capsys, monkeypatch):
    import refusion.measure.reproduce as reproduction

    record = _bench_record()
    record["rows"][0]["decoder"]["selector"]["name"] = "no_such_module_xyz:Selector"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    assert main(["reproduce", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--allow-imports" in err and str(path) in err and "rows[0].decoder" in err
    monkeypatch.setattr(reproduction, "_bench", lambda record, progress: reproduction.Reproduction("bench", (), ()))
    assert main(["reproduce", str(path), "--allow-imports"]) == 0


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["bench", "--per-task", "100000"], "--per-task"),
        (["bench", "--gen-length", "1000000000"], "--gen-length"),
        (["bench", "--mask-token-id", "-1"], "--mask-token-id"),
        (["bench", "--eos-token-id", "99999999999"], "--eos-token-id"),
        (["bench", "--model-block-length", "0"], "--model-block-length"),
        (["eval", "--tasks", "x", "--limit", "1000000000"], "--limit"),
    ],
)
def test_bench_and_eval_numbers_are_range_checked_before_the_model_loads(monkeypatch, capsys, argv, flag):
    import refusion.cli.measure as command

    monkeypatch.setattr(command, "load", lambda args: (_ for _ in ()).throw(AssertionError("model loaded")))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"`{flag}` must be" in err


def test_run_bench_checks_the_length_against_the_model_before_decoding():
    import refusion
    from refusion.measure.bench import measure, run_bench
    from refusion.training.tasks import held_out

    model = refusion.load_model(None)
    with pytest.raises(ConfigError, match="exceeds the model's 128 positions") as err:
        run_bench(model, held_out(1), [("AR", None)], 1000)
    assert err.value.param == "gen_length"
    with pytest.raises(ConfigError) as err:
        run_bench(model, held_out(1), [("AR", None)], 10**9)
    assert err.value.param == "gen_length"
    with pytest.raises(ConfigError) as err:
        measure("AR", None, model, held_out(1), warmup=-1)
    assert err.value.param == "warmup"


def test_an_eval_record_with_an_include_path_is_reproduced_only_when_imports_are_allowed(monkeypatch):
    import refusion.measure.lmeval as evaluation
    from refusion.measure.reproduce import reproduce

    env = {"refusion": "0.1.0", "torch": "2.13.0", "torch_threads": 1}
    record = {
        "schema": "refusion-record",
        "version": 1,
        "kind": "eval",
        "environment": env,
        "decoder": None,
        "settings": {
            "tasks": ["t"],
            "model_args": "k=2",
            "limit": None,
            "torch_random_seed": 7,
            "include_path": "/somewhere/tasks",
        },
        "results": {"t": {"exact_match,none": 1.0}},
        "outputs_sha256": "a" * 64,
        "generations": 2,
    }
    monkeypatch.setattr(evaluation, "evaluate_with_record", lambda tasks, **kw: ({}, record))
    with pytest.raises(ConfigError) as info:
        reproduce(record)
    assert info.value.param == "settings.include_path" and "--allow-imports" in str(info.value)
    assert reproduce(record, allow_imports=True).matches


def test_a_part_named_by_an_object_with_a_class_path_is_seen_as_an_import():
    from refusion.config.trust import import_paths

    assert import_paths({"selector": {"name": "evil.module:Sel", "params": {}}, "engine": "branch"}) == {
        "selector": "evil.module:Sel"
    }
    assert import_paths({"params": {"engine": "x.y:Z"}}) == {"params.engine": "x.y:Z"}


@pytest.mark.parametrize(
    "decoder, field",
    [
        ({"gen_length": 32, "params": {"slot_threshold": 0.5}, "selector": "record_marker_mod:Selector"}, "selector"),
        ({"gen_length": 32, "params": {"engine": "record_marker_mod:Engine"}}, "params.engine"),
        (
            {
                "sample": "greedy",
                **{k: {"name": n} for k, n in (("partitioner", "fixed"), ("infiller", "parallel-ar"))},
                **{k: {"name": n} for k, n in (("reorderer", "commit-order"), ("reviser", "none"))},
                "selector": {"name": "threshold", "class": "record_marker_mod:Selector"},
            },
            "selector",
        ),
    ],
)
def test_a_record_naming_a_module_imports_nothing_when_read_or_refused(no_model, decoder, field, tmp_path, monkeypatch):
    """The module is importable (on sys.path) and writes a marker when imported: reading the record and refusing it
    import nothing, in every form a recorded decoder may name a class."""
    import sys

    from refusion.errors import ImportRefused
    from refusion.measure.reproduce import reproduce

    (tmp_path / "record_marker_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(tmp_path / 'imported')!r}).write_text('x')\nclass Selector:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    record = _bench_record()
    record["rows"][0]["decoder"] = decoder
    check_record(record)
    with pytest.raises(ImportRefused, match="--allow-imports") as err:
        reproduce(record)
    assert err.value.param == f"rows[0].decoder.{field}"
    assert not (tmp_path / "imported").exists() and "record_marker_mod" not in sys.modules
