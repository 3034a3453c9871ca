"""The command line and ``refusion.generate`` on a tiny checkpoint saved to disk."""

import json
from pathlib import Path

import pytest

import refusion
from refusion.api import generate
from refusion.cli import main
from refusion.config import PRESETS
from refusion.models.tiny import tiny_qwen3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_qwen3(vocab_size=24, seed=5, logit_scale=6.0, dtype=__import__("torch").float32).save_pretrained(path)
    return str(path)


def test_generate_with_ids_prints_json(checkpoint, capsys):
    code = main(
        [
            "generate",
            "1,2,3",
            "--ids",
            "--model",
            checkpoint,
            "--gen-length",
            "8",
            "--slot-size",
            "4",
            "--serial-blocks",
            "1",
            "--slot-threshold",
            "0.5",
            "--token-threshold",
            "0.5",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"]) == 8 and out["forwards"] >= 2
    assert out["tokens_per_forward"] == pytest.approx(8 / out["forwards"])


def test_cli_reports_bad_input_without_a_traceback(checkpoint, capsys):
    code = main(["generate", "1,2", "--ids", "--model", checkpoint, "--slot-size", "0"])
    assert code == 2
    assert "`--slot-size` must be an integer >= 1; got 0" in capsys.readouterr().err


def test_cli_accepts_generic_parameters(checkpoint, capsys):
    code = main(
        [
            "generate",
            "1,2",
            "--ids",
            "--model",
            checkpoint,
            "--selector",
            "topk",
            "-p",
            "k=2",
            "--gen-length",
            "8",
            "-p",
            "slot_size=2",
            "--json",
        ]
    )
    assert code == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert len(steps[0]["selected"]) == 2


def test_python_api_with_preset_and_overrides(checkpoint):
    result = refusion.generate([1, 2, 3], checkpoint, preset="ar", gen_length=8, slot_size=2, record=True)
    assert len(result.tokens) == 8
    assert [s.selected for s in result.iterations] == [(0,), (1,), (2,), (3,)]  # leftmost: left to right


def test_presets_hold_the_reference_settings():
    gsm8k = PRESETS["gsm8k"]
    assert dict(gsm8k.partitioner.params) == dict(slot_size=32, serial_num_blocks=4)
    assert dict(gsm8k.selector.params) == dict(slot_threshold=0.9, ties="slots")  # the reference's torch.topk
    assert dict(gsm8k.sampler.params) == dict(precision="logits")  # and its softmax in the logits' dtype
    assert dict(gsm8k.infiller.params) == dict(token_threshold=0.4, precision="logits")
    assert PRESETS["arc-c"].partitioner.params["serial_num_blocks"] == 64
    reference = ("gsm8k", "mbpp", "humaneval", "math", "gpqa", "arc-c", "mmlu-pro")
    assert all(PRESETS[name].gen_length == 512 for name in reference)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_decodes(name, checkpoint):
    from refusion.models.block import tiny_block_diffusion
    from refusion.models.hf import HFCausalLM
    from refusion.models.mdm import tiny_bidirectional

    preset = PRESETS[name]
    if name == "diffusion-gemma":  # a canvas-denoising model: the fixture built by transformers' own class
        from refusion.models.loading import load_model

        fixture = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "diffusion_gemma"
        adapter = load_model(str(fixture))
        result = generate([4, 45], adapter, preset=name, max_denoising_steps=2)
        # named, the preset takes the checkpoint's generation_config.json length as the default does
        assert result.partition.gen_length == adapter.preset.gen_length >= len(result.tokens)  # cut after an EOS
        return
    if preset.selector.name == "sdar-steps" or name in ("llada2", "llada2.1", "fast-dllm-v2"):
        block = 4 if name == "sdar" else 32
        shift = int(name == "fast-dllm-v2")  # Fast-dLLM v2's token shift
        model = tiny_block_diffusion(
            vocab_size=24, max_positions=1024, block_length=block, layout="absolute", logit_shift=shift
        )
    elif (
        preset.reorderer.name in ("dual-cache", "prefix-cache")
        or preset.reviser.name == "wino"
        or name in ("credit", "d3llm", "d3llm-kv", "dkv", "d2f", "d2f-dream")
    ):
        shift = int(name in ("fast-dllm-dream", "d2f-dream"))
        model = tiny_bidirectional(vocab_size=24, max_positions=1024, logit_shift=shift)
    else:
        model = HFCausalLM(tiny_qwen3(vocab_size=24, max_positions=1024, logit_scale=6.0))
    result = generate([1, 2], model, preset=name, record=True)
    block = {"sdar": 4, "llada2": 32, "llada2.1": 32}.get(name)  # whole model blocks decoded, as SDAR's and LLaDA 2.x's
    padded = -(-(2 + preset.gen_length) // block) * block - 2 if block else preset.gen_length
    assert result.partition.gen_length == padded
    assert len(result.tokens) == preset.gen_length  # the answer cut at gen_length, the padding never returned


def test_overriding_a_part_drops_the_presets_parameters_for_it(checkpoint):
    # The paper preset sets slot_threshold for the threshold selector; topk does not take it.
    result = generate([1, 2], checkpoint, selector="topk", k=2, gen_length=32, record=True)
    assert len(result.iterations[0].selected) == 2


def test_unknown_preset(checkpoint):
    with pytest.raises(refusion.errors.UnknownNameError, match="Unknown preset 'gsm9k'"):
        generate([1], checkpoint, preset="gsm9k", record=True)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["1,,2", "--ids"], "comma-separated integers"),
        (["1,2", "--ids", "--dtype", "float33"], "`dtype` must be 'auto', a torch.dtype"),
    ],
)
def test_cli_input_errors_are_explained(checkpoint, capsys, argv, message):
    assert main(["generate", *argv, "--model", checkpoint]) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_without_tokenizer_files_has_no_tokenizer(checkpoint):
    assert refusion.load_model(checkpoint).tokenizer is None
    with pytest.raises(refusion.errors.ConfigError, match="`prompt` is text but the model has no tokenizer"):
        generate("hello", checkpoint, record=True)


def test_several_prompts_are_decoded_as_a_batch(checkpoint, capsys):
    assert main(["generate", "1,2", "3,4,5,6", "--ids", "--model", checkpoint, "--gen-length", "16", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(lines) == 2 and all(len(line["tokens"]) == 16 for line in lines)
    batch = generate([[1, 2], [3, 4, 5, 6]], checkpoint, gen_length=16, record=True)
    assert [r.tokens.tolist() for r in batch] == [line["tokens"] for line in lines]


def test_cli_train_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["train", "--out", str(out), "--steps", "2", "--batch-size", "2", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["parameters"] > 0
    model = refusion.load_model(str(out))
    assert model.preset.gen_length == 32 and model.tokenizer is not None
    assert len(generate("copy ab=", model, record=True).tokens) >= 1


def test_cli_parameters_may_name_parts_and_lengths(capsys):
    from refusion.cli import main

    assert main(["generate", "copy abcd=", "-p", "selector=topk", "-p", "k=2", "-p", "gen_length=16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["steps"][0]["selected"]) == 2
    assert main(["generate", "copy ab=", "--selector", "topk", "-p", "selector=leftmost"]) == 2
    assert "`selector` is given twice" in capsys.readouterr().err
