"""Each family's fixture checkpoint (tests/fixtures/peers) loaded onto the device and decoded there.

In float32 the logits must stay within 1e-4 of the authors' own class (CPU, float32) and the tokens of the
peers' functions are compared with the goldens; in bfloat16 the tokens are compared with the same decode on
the CPU in bfloat16. docs/models.md promises the peers' tokens in float32 on the CPU only, so agreement on
the device is recorded; a call that fails to run fails the test. ``device_map`` loading puts every parameter
on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import refusion
from refusion.peers import peer_functions
from tests.models.test_peer_checkpoints import FAMILIES, FIXTURES, golden, peer_arguments

#: golden calls decoded per family (each peer function at least once, as far as the first calls reach)
CALLS_PER_FAMILY = 8


def chosen_calls(family: str) -> list[dict]:
    calls, seen = [], set()
    for call in golden(family)["calls"]:  # one per function first, then the rest in order
        if call["function"] not in seen:
            seen.add(call["function"])
            calls.append(call)
    calls += [c for c in golden(family)["calls"] if c not in calls]
    return calls[:CALLS_PER_FAMILY]


def decode(model, family: str, call: dict) -> list[int]:
    prompt = golden(family)["prompts"][call["prompt"]]
    args = peer_arguments(call, prompt)
    if isinstance(args.get("attention_mask"), torch.Tensor):
        args["attention_mask"] = args["attention_mask"].to(model.device)
    if call.get("seed") is not None:
        args["seed"] = call["seed"]
    return refusion.generate(prompt, model, preset=peer_functions()[call["function"]].preset, **args).region_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_and_peer_tokens_on_the_device(device, family, record):
    model = refusion.load_model(str(FIXTURES / family), dtype=torch.float32, device=str(device))
    assert next(model.model.parameters()).device.type == device.type
    from safetensors.torch import load_file

    expected = golden(family)["logits"]
    tensors = load_file(str(FIXTURES / family / expected["file"]))
    worst = 0.0
    for case in expected["cases"]:
        worst = max(worst, float((forward_logits_on(model, case["input_ids"]) - tensors[case["key"]]).abs().max()))
    record("float32_max_logit_difference_from_the_authors_class", worst)
    assert worst < 1e-4
    calls = chosen_calls(family)
    same = sum(decode(model, family, call) == call["tokens"] for call in calls)
    record("float32_calls_with_the_peers_tokens", f"{same}/{len(calls)}")


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_tokens_on_the_device_and_on_the_cpu(device, family, record):
    cpu = refusion.load_model(str(FIXTURES / family), dtype=torch.bfloat16)
    here = refusion.load_model(str(FIXTURES / family), dtype=torch.bfloat16, device=str(device))
    calls = chosen_calls(family)
    same = sum(decode(here, family, call) == decode(cpu, family, call) for call in calls)
    record("bfloat16_calls_with_the_cpus_tokens", f"{same}/{len(calls)}")


@pytest.mark.parametrize("family", FAMILIES)
def test_device_map_loading_places_every_parameter_on_the_device(device, on_gpu, family):
    if not on_gpu:
        pytest.skip("device_map needs an accelerator")
    model = refusion.load_model(str(FIXTURES / family), dtype=torch.bfloat16, device_map="auto")
    assert {p.device.type for p in model.model.parameters()} == {"cuda"}
    assert model.device.type == "cuda"
    call = chosen_calls(family)[0]
    assert len(decode(model, family, call)) == len(call["tokens"])


def forward_logits_on(model, ids: list[int]) -> torch.Tensor:
    """tests/models/test_peer_checkpoints.py's ``forward_logits`` with the inputs on the model's device."""
    x = torch.tensor([ids], device=model.device)
    positions = torch.arange(len(ids), device=model.device)
    mask = model.block_mask(positions, positions, len(ids)) if hasattr(model, "block_mask") else torch.ones_like(x)
    with torch.no_grad():
        return model.forward(x, positions[None], mask, None)[0].float().cpu()
