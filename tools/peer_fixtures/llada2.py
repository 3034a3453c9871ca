#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/llada2: a tiny LLaDA2-MoE built by the authors' class, its logits and
the tokens of the authors' LLaDA 2.1 ``generate`` (token-to-token editing).

Run with a transformers-4.57 interpreter (the authors' code needs a 4.x newer than 4.52); it never imports
`refusion`:

    python3 -m venv tf457 && tf457/bin/pip install torch==2.13.0 transformers==4.57.6 safetensors numpy
    git clone https://github.com/ZHZisZZ/dllm
    tf457/bin/python tools/peer_fixtures/llada2.py --dllm dllm --out tests/fixtures/peers/llada2 [--check]

The authors' modeling code is published on the Hugging Face hub only (inclusionAI/LLaDA2.0-mini,
LLaDA2.1-mini); ZHZisZZ/dllm vendors it: `dllm/pipelines/llada2/models/{configuration,modeling}_llada2_moe.py`
(LLaDA 2.0) and `dllm/pipelines/llada21/models/{configuration,modeling}_llada21_moe.py` (LLaDA 2.1, with the
editing `generate`). The checkpoint (seeded; hidden 64, 2 layers, the second an MoE layer: 8 experts, 2 per
token, 1 shared, n_group 4 / topk_group 2, sigmoid scores with a random expert_bias, routed_scaling_factor 2.5,
qk-norm, partial_rotary_factor 0.5; norm weights and biases randomised; the mask id's output row zeroed so the
mask never wins, as in the other folders) is built and saved by the 2.0 class in float32, with the char-level
tokenizer of the other folders (mask 3, EOS 1, pad 0). `logits.safetensors`: the authors' logits in float32
and bfloat16 on fixed inputs under the block-causal mask their generate builds. `golden.json`: the tokens of
LLaDA 2.0's `generate` (greedy and seeded sampling with `temperature`, `top_k`, `top_p`;
`torch.manual_seed(seed)` before the call) and of LLaDA 2.1's (greedy and seeded sampling; several thresholds,
editing thresholds and `max_post_steps`), both in bfloat16 (they build a bfloat16 mask, so float32 fails), with
their forwards. One process, 1 torch thread; cpu.json records the CPU kernel family (bf16 tokens depend on it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: tests.support.kernels

FILES = {
    "llada2": "dllm/pipelines/llada2/models",
    "llada21": "dllm/pipelines/llada21/models",
}
SEED = 1234
BLOCK = 8
PROMPTS = ("Hi", "The sky is", "2+2=")
#: (prompt index, gen_length, threshold, editing_threshold, max_post_steps); prompt (with bos) + gen_length is a
#: multiple of the block, so the authors' padded last block ends where the answer does
#: LLaDA 2.0: (prompt index, gen_length, steps, threshold, temperature, top_k, top_p, seed)
CASES_20 = (
    (0, 13, 8, 0.95, 0.0, None, None, 0),
    (1, 21, 4, 0.95, 0.0, None, None, 0),
    (2, 19, 3, 0.5, 0.0, None, None, 0),
    (0, 29, 8, 0.3, 0.0, None, None, 0),
    (1, 13, 8, 0.9, 0.8, None, None, 1),
    (2, 19, 4, 0.7, 1.0, 5, None, 2),
    (0, 13, 2, 0.95, 0.6, None, 0.9, 3),
    (1, 21, 8, 0.5, 1.3, 20, 0.95, 4),
    (0, 29, 8, 0.3, 0.0, None, None, 0, 2),  # an EOS (id 2 here) ends the answer after its block
    (1, 21, 4, 0.7, 1.0, None, None, 5, 7),
)
CASES = (
    (0, 13, 0.95, 0.9, 16),
    (1, 21, 0.95, 0.9, 16),
    (2, 19, 0.5, 0.5, 4),
    (0, 29, 0.3, 0.0, 2),
    (1, 13, 0.8, 0.7, 0),
    (2, 11, 0.2, 0.3, 8),
    (1, 21, 0.95, 0.9, 16, {"eos_id": 13}),  # an EOS (id 13 here): every block decoded, the answer cut after it
    (0, 13, 0.7, 0.5, 16, {"temperature": 0.8, "seed": 1}),  # sampled: edits take the step's draws too
    (1, 21, 0.5, 0.3, 4, {"temperature": 1.0, "top_k": 10, "seed": 2}),
    (2, 19, 0.9, 0.6, 8, {"temperature": 1.2, "top_p": 0.9, "seed": 3}),
)

#: later cases, each the authors' call as a researcher writes it (every keyword passed as given, the prompt's bos
#: included): prompt + gen_length off the block grid (the authors decode the padded last block and return
#: `x[:, :prompt_length + gen_length]`), `minimal_topk`, more steps than the block, `eos_early_stop`, another
#: `block_length` than the loaded model's, sampling with `top_p` (exact ties between confidences); appended after
#: the cases above so that their indices stay (cpu.json)
EXTRA_20 = (
    dict(prompt=0, seed=0, gen_length=10, steps=8, threshold=0.95),
    dict(prompt=1, seed=6, gen_length=12, steps=4, threshold=0.9, temperature=0.8, top_k=5),
    dict(prompt=2, seed=0, gen_length=20, steps=8, threshold=0.3, eos_id=2),
    dict(prompt=1, seed=0, gen_length=16, steps=8, threshold=0.95, minimal_topk=4),
    dict(prompt=0, seed=0, gen_length=13, steps=12, threshold=0.95),
    dict(prompt=0, seed=0, gen_length=30, block_length=16, minimal_topk=2, steps=32, threshold=0.95),
    dict(prompt=0, seed=0, gen_length=13, steps=8, threshold=0.95, eos_id=7, eos_early_stop=True),
    dict(
        prompt=0,
        seed=0,
        gen_length=30,
        block_length=16,
        minimal_topk=2,
        steps=32,
        threshold=0.95,
        eos_id=7,
        eos_early_stop=True,
    ),
    dict(prompt=1, seed=8, gen_length=14, steps=8, threshold=1.0, temperature=0.8, top_p=0.9),
)
EXTRA_21 = (
    dict(prompt=0, seed=0, gen_length=10, threshold=0.95, editing_threshold=0.9, max_post_steps=16),
    dict(prompt=2, seed=0, gen_length=9, threshold=0.5, editing_threshold=0.5, max_post_steps=4),
    dict(
        prompt=1,
        seed=4,
        gen_length=12,
        threshold=0.7,
        editing_threshold=0.6,
        max_post_steps=8,
        temperature=1.0,
        top_p=0.9,
    ),
    dict(
        prompt=0,
        seed=5,
        gen_length=20,
        threshold=0.8,
        editing_threshold=0.7,
        max_post_steps=8,
        temperature=1.0,
        top_p=0.9,
    ),
    dict(
        prompt=2,
        seed=6,
        gen_length=15,
        threshold=0.9,
        editing_threshold=0.9,
        max_post_steps=16,
        temperature=1.0,
        top_p=0.9,
    ),
    dict(
        prompt=1,
        seed=0,
        gen_length=21,
        threshold=0.95,
        editing_threshold=0.9,
        max_post_steps=16,
        eos_id=13,
        eos_early_stop=True,
    ),
    dict(
        prompt=0,
        seed=0,
        gen_length=30,
        block_length=16,
        minimal_topk=2,
        steps=32,
        threshold=0.95,
        editing_threshold=0.9,
        max_post_steps=16,
        eos_id=7,
        eos_early_stop=True,
    ),
    # threshold 1.0: no mask is ever above it, so each step falls back to torch.topk over the block, where the
    # top_p filter leaves many confidences exactly 1.0 (ties broken by the authors' topk, not by position)
    dict(
        prompt=0,
        seed=5,
        gen_length=14,
        threshold=1.0,
        editing_threshold=0.9,
        max_post_steps=4,
        temperature=0.8,
        top_p=0.9,
    ),
    dict(
        prompt=0,
        seed=12,
        gen_length=14,
        threshold=1.0,
        editing_threshold=0.9,
        max_post_steps=4,
        temperature=0.8,
        top_p=0.9,
    ),
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dllm", required=True, help="checkout of ZHZisZZ/dllm (the vendored LLaDA 2.x code)")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/llada2")
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare")
    return ap.parse_args(argv)


def import_authors(dllm: str):
    from pf_common import synth_package

    classes = {}
    for package, folder in FILES.items():
        synth_package(package, os.path.join(dllm, folder))
        name = "llada2_moe" if package == "llada2" else "llada21_moe"
        configuration = __import__(f"{package}.configuration_{name}", fromlist=["x"])
        modeling = __import__(f"{package}.modeling_{name}", fromlist=["x"])
        classes[package] = (configuration.LLaDA2MoeConfig, modeling.LLaDA2MoeModelLM)
    return classes


def build(out: str, classes) -> None:
    import torch
    from pf_tokenizer import EOS, MASK, PAD, VOCAB, save_tokenizer

    config_cls, model_cls = classes["llada2"]
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        use_qkv_bias=False,
        use_qk_norm=True,
        use_bias=False,
        rms_norm_eps=1e-6,
        norm_head=False,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        rope_theta=600000.0,
        pad_token_id=PAD,
        eos_token_id=EOS,
        mask_token_id=MASK,
        num_experts=8,
        num_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        partial_rotary_factor=0.5,
    )
    torch.manual_seed(SEED)
    model = model_cls(config).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():  # nothing trivially 0 or 1: norms in [0.5, 1.5), unit-scale weights, a random expert_bias
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif "word_embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 if "lm_head" in name else 1.0) / math.sqrt(p.shape[1]))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
        # mask never wins (as in the other folders): a trained checkpoint never predicts the mask id, the authors'
        # loops would "transfer" it (the position stays masked) where refusion's drafts never choose it
        model.lm_head.weight[MASK].zero_()
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer("llada", out)


def block_mask(length: int, dtype):
    import torch

    blocks = length // BLOCK
    mask = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return mask[None, None].log().to(dtype)


def logits(out: str, classes) -> dict:
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, 100, (1, 3 * BLOCK), generator=g)
    ids[0, 12:] = 3  # the answer after a 12-token prompt is masked ...
    ids[0, 17:19] = torch.tensor([40, 41])  # ... but for two decoded tokens in the open block
    found = {"ids": ids}
    for dtype in ("float32", "bfloat16"):
        model = classes["llada2"][1].from_pretrained(out, torch_dtype=getattr(torch, dtype)).eval()
        with torch.no_grad():
            out_logits = model(
                ids, attention_mask=block_mask(ids.shape[1], getattr(torch, dtype)), position_ids=torch.arange(24)[None]
            ).logits
        found[dtype] = out_logits.float()
    return found


def generate_all(out: str, classes) -> list:
    import torch
    from pf_tokenizer import BOS, EOS, MASK, encode_chars

    model, forwards = counting(classes["llada21"][1].from_pretrained(out, torch_dtype=torch.bfloat16).eval())
    calls = generate_20(out, classes)
    model_20, forwards_20 = counting(classes["llada2"][1].from_pretrained(out, torch_dtype=torch.bfloat16).eval())
    for prompt_index, gen_length, threshold, editing, post, *more in CASES:
        extra = dict(more[0]) if more else {}
        eos_id = extra.pop("eos_id", EOS)
        seed = extra.pop("seed", 0)
        sampling = dict(temperature=extra.get("temperature", 0.0), top_k=extra.get("top_k"), top_p=extra.get("top_p"))
        ids = [BOS, *encode_chars(PROMPTS[prompt_index])]
        assert (len(ids) + gen_length) % BLOCK == 0, (ids, gen_length)
        forwards[0] = 0
        torch.manual_seed(seed)
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([ids]),
                **sampling,
                block_length=BLOCK,
                gen_length=gen_length,
                threshold=threshold,
                editing_threshold=editing,
                max_post_steps=post,
                eos_id=eos_id,
                mask_id=MASK,
            )
        calls.append(
            dict(
                function="llada21.generate",
                dtype="bfloat16",
                prompt=PROMPTS[prompt_index],
                prompt_ids=ids,
                seed=seed,
                kwargs=dict(
                    block_length=BLOCK,
                    gen_length=gen_length,
                    threshold=threshold,
                    editing_threshold=editing,
                    max_post_steps=post,
                    eos_id=eos_id,
                    **sampling,
                ),
                tokens=tokens[0].tolist(),
                forwards=forwards[0],
            )
        )
    for function, model_, forwards_, cases in (
        ("llada2.generate", model_20, forwards_20, EXTRA_20),
        ("llada21.generate", model, forwards, EXTRA_21),
    ):
        for case in cases:
            calls.append(authors_call(function, model_, forwards_, dict(case)))
    return calls


def authors_call(function: str, model, forwards, case: dict) -> dict:
    """One call of the authors' ``generate`` with the case's keywords as given (``mask_id=3``, the fixture's),
    greedy unless a temperature is given, after ``torch.manual_seed(seed)``. LLaDA 2.0's ``eos_early_stop`` path
    returns the prompt too (``x[:, :eos_pos + 1]``): the record's ``tokens`` are the answer after it, and
    ``returned_prompt`` says so."""
    import torch
    from pf_tokenizer import BOS, EOS, MASK, encode_chars

    prompt_index, seed = case.pop("prompt"), case.pop("seed")
    ids = [BOS, *encode_chars(PROMPTS[prompt_index])]
    kwargs = dict(block_length=BLOCK, eos_id=EOS)  # the authors' default eos_id (156892) is outside this vocabulary
    kwargs.update(case)
    forwards[0] = 0
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), mask_id=MASK, **kwargs)[0].tolist()
    returned_prompt = bool(
        kwargs.get("eos_early_stop") and len(out) > len(ids) and out[: len(ids)] == ids and out[-1] == kwargs["eos_id"]
    )
    record = dict(
        function=function,
        dtype="bfloat16",
        prompt=PROMPTS[prompt_index],
        prompt_ids=ids,
        seed=seed,
        kwargs=dict(mask_id=MASK, **kwargs),
        tokens=out[len(ids) :] if returned_prompt else out,
        forwards=forwards[0],
    )
    if returned_prompt:
        record["returned_prompt"] = True
    return record


def counting(model):
    """``model`` with its ``forward`` counted in the returned one-item list (generate calls ``self.forward``, so
    no module hook would see the calls)."""
    forwards = [0]
    network_forward = model.forward

    def counted(*args, **kwargs):
        forwards[0] += 1
        return network_forward(*args, **kwargs)

    model.forward = counted
    return model, forwards


def generate_20(out: str, classes) -> list:
    """The LLaDA 2.0 class's ``generate`` on the same weights (bfloat16), greedy and seeded sampling."""
    import torch
    from pf_tokenizer import BOS, EOS, MASK, encode_chars

    model, forwards = counting(classes["llada2"][1].from_pretrained(out, torch_dtype=torch.bfloat16).eval())
    calls = []
    for prompt_index, gen_length, steps, threshold, temperature, top_k, top_p, seed, *eos in CASES_20:
        eos_id = eos[0] if eos else EOS
        ids = [BOS, *encode_chars(PROMPTS[prompt_index])]
        assert (len(ids) + gen_length) % BLOCK == 0, (ids, gen_length)
        forwards[0] = 0
        torch.manual_seed(seed)
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([ids]),
                temperature=temperature,
                block_length=BLOCK,
                steps=steps,
                gen_length=gen_length,
                top_k=top_k,
                top_p=top_p,
                threshold=threshold,
                eos_id=eos_id,
                mask_id=MASK,
            )
        kwargs = dict(block_length=BLOCK, gen_length=gen_length, steps=steps, threshold=threshold)
        kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id)
        calls.append(
            dict(
                function="llada2.generate",
                dtype="bfloat16",
                prompt=PROMPTS[prompt_index],
                prompt_ids=ids,
                seed=seed,
                kwargs=kwargs,
                tokens=tokens[0].tolist(),
                forwards=forwards[0],
            )
        )
    return calls


def make(a, out: str) -> None:
    import torch
    from pf_common import file_record, versions
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(out, exist_ok=True)
    classes = import_authors(a.dllm)
    build(out, classes)
    found = logits(out, classes)
    save_file({k: v.contiguous() for k, v in found.items()}, os.path.join(out, "logits.safetensors"))
    golden = dict(
        peer="LLaDA 2.0 and 2.1 generate (inclusionAI, vendored by ZHZisZZ/dllm)",
        peer_files={
            p: file_record(
                a.dllm,
                f"{folder}/modeling_{'llada2_moe' if p == 'llada2' else 'llada21_moe'}.py",
                "ZHZisZZ/dllm",
                "--dllm",
            )
            for p, folder in FILES.items()
        },
        made_with=versions(),
        block_length=BLOCK,
        calls=generate_all(out, classes),
    )
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(golden, indent=1) + "\n")
    from tests.support.kernels import cpu_kernel_family

    with open(os.path.join(out, "cpu.json"), "w", encoding="utf-8") as f:
        note = "cpu_kernel_family() (tests/support/kernels.py) of the machine that made golden.json; bf16 tokens vary"
        f.write(json.dumps({"made_on": cpu_kernel_family(), "note": note}, indent=2) + "\n")


def check(a) -> int:
    import torch
    from safetensors.torch import load_file

    temp = tempfile.mkdtemp(prefix="llada2-fixture-")
    try:
        make(a, temp)
        problems = []
        for name in ("model.safetensors", "logits.safetensors"):
            old, new = load_file(os.path.join(a.out, name)), load_file(os.path.join(temp, name))
            if old.keys() != new.keys() or any(not torch.equal(old[k], new[k]) for k in old):
                problems.append(f"{name} differs")
        old = json.load(open(os.path.join(a.out, "golden.json")))["calls"]
        new = json.load(open(os.path.join(temp, "golden.json")))["calls"]
        problems += [f"call {i} differs" for i, (x, y) in enumerate(zip(old, new)) if x != y]
        for p in problems:
            print("DIFF", p)
        print("ok" if not problems else f"{len(problems)} difference(s)")
        return 1 if problems else 0
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.check:
        return check(a)
    make(a, a.out)
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
