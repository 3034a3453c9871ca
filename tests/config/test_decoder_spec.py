"""One value describes a decoder: every sampler and option survives generate, traces, records and sweeps."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.config import DECODER_OPTIONS, PRESETS, SPEC_PARAMS, DecoderSpec, SamplerSpec
from refusion.decoding.decoder import Decoder
from refusion.decoding.sampling import SAMPLERS, BlockMultinomial, GumbelMax, Sampling
from refusion.errors import ConfigError
from refusion.measure.trace import read_trace
from refusion.sweep.space import build_space

#: a value for every decoder option, different from its default
OPTION_VALUES = {
    "engine": "repeat",
    "seed": 7,
    "stop_at_eos": False,
    "cfg_scale": 0.0,
    "calls_per_token": 5,
    "batch_invariant": True,
}
#: each registered sampler with its parameters set
SAMPLER_VALUES = {
    "categorical": {"temperature": 0.7, "top_k": 5},
    "gumbel": {"temperature": 0.5},
    "block-multinomial": {"temperature": 0.9, "top_k": 3, "top_p": 0.8},
}


def test_every_registered_sampler_and_option_is_covered_here():
    assert set(SAMPLER_VALUES) == set(SAMPLERS) and set(OPTION_VALUES) == set(DECODER_OPTIONS)


@pytest.mark.parametrize("sampler", sorted(SAMPLER_VALUES))
def test_every_sampler_and_option_survives_generate_trace_and_reproduction(tmp_path, sampler):
    path = tmp_path / "trace.jsonl"
    params = {"sampler": sampler, **SAMPLER_VALUES[sampler], **OPTION_VALUES}
    if sampler == "block-multinomial":  # draws per model block: any model works, it draws per row otherwise
        params["engine"] = "repeat"
    result = refusion.generate("rev hello=", preset="paper", gen_length=16, trace=path, **params)
    header = json.loads(path.read_text().splitlines()[0])
    spec = DecoderSpec.from_dict(header["decoder"])
    assert spec.sampler.name == sampler
    assert {k: spec.sampler.params[k] for k in SAMPLER_VALUES[sampler]} == SAMPLER_VALUES[sampler]
    assert {name: getattr(spec, name) for name in OPTION_VALUES} == {**OPTION_VALUES, "engine": params["engine"]}
    again = refusion.generate("rev hello=", preset=spec, gen_length=16)
    assert again.tokens.tolist() == result.tokens.tolist()
    assert read_trace(path)[0].tokens.tolist() == result.tokens.tolist()


def test_fast_dllm_with_a_temperature_traces_its_gumbel_sampler(tmp_path):
    """Was: 'sample GumbelMax(...) cannot be recorded' after decoding, and a 0-byte trace."""
    path = tmp_path / "trace.jsonl"
    refusion.generate("rev hello=", preset="fast-dllm", temperature=0.5, trace=path, gen_length=16)
    spec = DecoderSpec.from_dict(json.loads(path.read_text().splitlines()[0])["decoder"])
    assert spec.sampler == SamplerSpec("gumbel", {"temperature": 0.5, "precision": "float64"})  # Fast-dLLM's
    assert isinstance(Decoder.from_spec(spec).sample, GumbelMax)


def test_a_preset_sampler_is_the_same_in_generate_and_in_a_sweep():
    """Was: generate built GumbelMax for llada + temperature, a sweep built Sampling (it dropped `sampler`)."""
    from refusion.api import build_decoder

    decoder, _ = build_decoder(None, preset="llada", temperature=0.5)
    space = build_space(PRESETS["llada"], ["temperature=0.5,0.7"])
    swept = Decoder.from_spec(space.preset({"temperature": 0.5}))
    assert isinstance(decoder.sample, GumbelMax) and swept.sample == decoder.sample


@pytest.mark.parametrize(
    "dimension",
    [
        "cfg_scale=0,1",
        "sampler=categorical,gumbel",
        "stop_at_eos=true,false",
        "calls_per_token=4,6",
        "seed=0,1",
        "engine=branch,repeat",
        "top_p=0.5,0.9",
    ],
)
def test_a_sweep_varies_every_option_a_decoder_takes(dimension):
    base = PRESETS["paper"]
    space = build_space(base, [dimension, "temperature=0.5"] if dimension.startswith("top_p") else [dimension])
    name = dimension.partition("=")[0]
    decoders = [Decoder.from_spec(space.preset(p)) for p in space.grid()]
    values = {
        getattr(d, name)
        if name in DECODER_OPTIONS
        else (type(d.sample).__name__ if name == "sampler" else getattr(d.sample, name))
        for d in decoders
    }
    assert len(values) == 2, values


def test_every_spec_parameter_is_taken_by_the_spec_itself():
    spec = PRESETS["paper"]
    for name in SPEC_PARAMS:
        value = {
            **OPTION_VALUES,
            "seed": 3,
            "stop_at_eos": "block",
            "calls_per_token": 6,
            "sampler": "categorical",
            "temperature": 0.5,
            "top_k": 4,
            "top_p": 0.9,
            "precision": "float64",
            "argmax": "probabilities",
            "confidence_top_k": 50,
            "confidence_top_p": 0.9,
        }[name]
        changed = spec.with_params({name: value})
        assert changed != spec or name == "cfg_scale", name


@settings(max_examples=20)
@given(
    name=st.sampled_from(sorted(PRESETS)),
    seed=st.integers(0, 2**31),
    stop=st.sampled_from([True, False, "block"]),
    temperature=st.sampled_from([None, 0.5]),
)
def test_presets_round_trip_as_json_with_overrides(name, seed, stop, temperature):
    params = {"seed": seed, "stop_at_eos": stop, **({"temperature": temperature} if temperature else {})}
    spec = PRESETS[name].with_params(params)
    again = DecoderSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and Decoder.from_spec(again) == Decoder.from_spec(spec)


def test_one_merge_rule_a_replaced_part_loses_its_parameters_the_options_stay():
    spec = PRESETS["fast-dllm"].with_params({"seed": 4, "temperature": 0.3})
    swapped = spec.merged({"selector": "topk"}, {"k": 2})
    assert swapped.selector.name == "topk" and dict(swapped.selector.params) == {"k": 2}
    assert swapped.partitioner == spec.partitioner and swapped.seed == 4 and swapped.sampler == spec.sampler
    kept = spec.merged({"selector": "threshold"})  # the same part: its parameters stay
    assert kept.selector == spec.selector


def test_errors_carry_the_parameter():
    with pytest.raises(ConfigError) as err:
        Decoder.from_spec(PRESETS["paper"].with_params({"slot_threshold": 2}))
    assert err.value.param == "slot_threshold"
    with pytest.raises(ConfigError) as err:
        PRESETS["paper"].with_params({"slot_treshold": 0.5})
    assert err.value.param == "slot_treshold" and "slot_threshold" in str(err.value)
    with pytest.raises(ConfigError) as err:
        DecoderSpec.from_dict({"format": "refusion.decoder/1", "selector": {"name": "topk"}, "slots": 3})
    assert err.value.param == "slots"


def test_samplers_are_built_by_name():
    assert isinstance(Decoder.from_names(sampler="block-multinomial", temperature=1.0).sample, BlockMultinomial)
    assert isinstance(Decoder.from_names(temperature=0.5).sample, Sampling)


# -- spec files: unknown part parameters and damaged files are refused when read, naming the file and field ----------


def _paper_with(kind, params):
    data = PRESETS["paper"].to_dict()
    data[kind]["params"].update(params)
    return data


@pytest.mark.parametrize(
    "data",
    [
        _paper_with("selector", {"slot_treshold": 0.9}),  # the one JSON format
        {"gen_length": 32, "selector": {"name": "threshold", "params": {"slot_treshold": 0.9}}},  # written by hand
    ],
)
def test_a_misspelt_part_parameter_in_a_preset_file_is_refused_when_read(tmp_path, data):
    """Was: read without a word; the part refused it only when a decoder was built (or never, for a plugin
    taking **kwargs), with an error naming neither the file nor the field."""
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        refusion.load_preset(path)
    assert err.value.param == "selector.params.slot_treshold"
    message = str(err.value)
    assert str(path) in message and "`selector.params.slot_treshold`" in message and "slot_threshold" in message


def test_unknown_parameters_and_names_are_refused_in_every_spec_format():
    record_format = {
        "sample": "greedy",
        "partitioner": {"name": "fixed", "params": {"slot_sise": 4}},
        "selector": {"name": "threshold"},
        "infiller": {"name": "parallel-ar"},
        "reorderer": {"name": "commit-order"},
    }
    with pytest.raises(ConfigError) as err:
        DecoderSpec.from_dict(record_format)
    assert err.value.param == "partitioner.params.slot_sise" and "slot_size" in str(err.value)
    sampler = PRESETS["paper"].to_dict()
    sampler["sampler"] = {"name": "categorical", "params": {"typical_p": 0.5}}
    with pytest.raises(ConfigError) as err:
        DecoderSpec.from_dict(sampler)
    assert err.value.param == "sampler.params.typical_p" and "top_p" in str(err.value)
    unknown = PRESETS["paper"].to_dict()
    unknown["infiller"]["name"] = "parallel-arr"
    with pytest.raises(ConfigError, match="known infillers: .*parallel-ar") as err:
        DecoderSpec.from_dict(unknown)
    assert err.value.param == "infiller"


def test_a_module_path_part_is_not_imported_to_check_its_parameters():
    data = PRESETS["paper"].to_dict()
    data["selector"] = {"name": "no_such_module_anywhere:Selector", "params": {"anything": 1}}
    spec = DecoderSpec.from_dict(data)  # read; importing (and its checks) waits for the build
    assert spec.selector.name == "no_such_module_anywhere:Selector"


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"gen_length": 32, "description": "caf\xe9"}', ["line 1: not UTF-8"]),
        (b"[" * 100_000 + b"]" * 100_000, ["nested"]),
        (b'{"gen_length": ' + b"9" * 5000 + b"}", ["number cannot be read"]),
    ],
)
def test_a_damaged_preset_file_is_refused_naming_it(tmp_path, content, words):
    path = tmp_path / "preset.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        refusion.load_preset(path)
    assert err.value.param == "preset_file" and str(path) in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "data", [{"gen_length": 10**9, "params": {}}, {**PRESETS["paper"].to_dict(), "gen_length": 10**9}]
)
def test_a_preset_file_asking_for_a_billion_tokens_is_refused(tmp_path, data):
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"`gen_length` must be an integer in \[1, 65536\]") as err:
        refusion.load_preset(path)
    assert err.value.param == "gen_length"
