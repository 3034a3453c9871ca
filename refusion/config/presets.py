"""From names and flat parameters to part instances, and the paper's named presets.

``build_parts(selector="topk", params={"k": 2, "slot_size": 4})`` sends each
parameter to the part that declares it (to each, when several do: the
partitioner's and the selector's ``block_length`` are the same blocks);
``"selector.k"`` names one part explicitly. An unknown parameter is an error
listing what each part accepts.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from refusion.errors import ConfigError, unknown_name
from refusion.plugins.registry import Registration, registry as default_registry

PART_KINDS = ("partitioner", "selector", "infiller", "reorderer")


@attrs.frozen
class Preset:
    """A named decoding configuration: part names, their parameters and a generation length.

    ``params`` may also hold the decoder's own options (``stop_at_eos``,
    ``sampler``, ``temperature``, ``cfg_scale``, ...). ``peer`` names the
    published function the preset reproduces (:mod:`refusion.peers`), so the
    preset takes that function's own arguments (``threshold=None``,
    ``denoising_steps=``, ``max_new_tokens=`` ...).
    """

    description: str
    gen_length: int
    params: Mapping[str, Any]
    partitioner: str = "fixed"
    selector: str = "threshold"
    infiller: str = "parallel-ar"
    reorderer: str = "commit-order"
    peer: str | None = None

    def parts(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in PART_KINDS}


def _paper(task: str, slot_size: int, blocks: int, slot_t: float, token_t: float) -> Preset:
    return Preset(
        description=f"ReFusion public eval setting for {task}: slot_size={slot_size}, serial_num_blocks={blocks}, "
        f"slot_threshold={slot_t}, token_threshold={token_t}, gen_length=512",
        gen_length=512,
        params=dict(slot_size=slot_size, serial_num_blocks=blocks, slot_threshold=slot_t, token_threshold=token_t),
        peer="refusion.generate_refusion",
    )


#: The reference's per-task settings (ML-GSAI/ReFusion eval scripts), plus its function defaults.
PRESETS: dict[str, Preset] = {
    "paper": Preset(
        description="defaults of the reference generate_refusion: slot_size=8, serial_num_blocks=2, "
        "slot_threshold=0.9, token_threshold=0.9, gen_length=128",
        gen_length=128,
        params=dict(slot_size=8, serial_num_blocks=2, slot_threshold=0.9, token_threshold=0.9),
        peer="refusion.generate_refusion",
    ),
    "gsm8k": _paper("GSM8K", 32, 4, 0.9, 0.4),
    "mbpp": _paper("MBPP", 32, 4, 0.9, 0.3),
    "humaneval": _paper("HumanEval", 32, 4, 0.9, 0.4),
    "math": _paper("MATH", 32, 8, 0.8, 0.6),
    "gpqa": _paper("GPQA", 8, 32, 0.8, 0.2),
    "arc-c": _paper("ARC-C", 8, 64, 0.8, 0.1),
    "mmlu-pro": _paper("MMLU-Pro", 16, 4, 0.9, 0.4),
    "llada": Preset(
        description="LLaDA (arXiv 2502.09992, generate.py): semi-AR blocks of `block_length` 32, `steps` 128 spread "
        "evenly over blocks and masks, `remasking` low_confidence (or random), Gumbel-max `temperature`, "
        "`cfg_scale`; every position decoded, the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(block_length=32, slot_size=1, steps=128, remasking="low_confidence", sampler="gumbel",
                    stop_at_eos=False),
        partitioner="semi-ar",
        selector="llada-steps",
        infiller="draft",
        reorderer="no-cache",
        peer="llada.generate",
    ),
    "dream": Preset(
        description="Dream (arXiv 2508.15487, diffusion_generate): one block over the answer, `steps` 128 on the "
        "timesteps linspace(1, `eps` 1e-3), `alg` entropy (origin / maskgit_plus / topk_margin / entropy), "
        "`temperature`/`top_p`/`top_k`; for models with logit shift 1; the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(slot_size=1, serial_num_blocks=1, steps=128, eps=1e-3, alg="entropy", stop_at_eos=False),
        partitioner="fixed",
        selector="dream-steps",
        infiller="draft",
        reorderer="no-cache",
        peer="dream.diffusion_generate",
    ),
    "fast-dllm": Preset(
        description="Fast-dLLM (arXiv 2505.22618, generate with `threshold`): blocks of `block_length` 32, every "
        "token with confidence >= `threshold` 0.9 per step (else the best), no cache on bidirectional models "
        "(exact prefix cache on causal ones); the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(block_length=32, slot_size=1, slot_threshold=0.9, inclusive=True, sampler="gumbel",
                    stop_at_eos=False),
        partitioner="semi-ar",
        infiller="draft",
        peer="fast_dllm.generate",
    ),
    "fast-dllm-dream": Preset(
        description="Fast-dLLM's block decoder for Dream (generation_utils_block.py): blocks of `block_length` 32, "
        "each starting with its first token, then every token with confidence >= `threshold` 0.9 (`alg` "
        "confidence_threshold) or Dream's entropy schedule over `steps`; prefix cache (`dual_cache=True`: dual); "
        "for models with logit shift 1; the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(block_length=32, slot_size=1, alg="confidence_threshold", threshold=0.9, steps=128,
                    prefix_at_block=True, stop_at_eos=False),
        partitioner="semi-ar",
        selector="dream-blocks",
        infiller="draft",
        reorderer="prefix-cache",
        peer="fast_dllm.dream_block_generate",
    ),
    "sdar": Preset(
        description="SDAR (block_diffusion_generate): the model's blocks (4) from position 0, `denoising_steps` 4 per "
        "block, `remasking_strategy` low_confidence_dynamic (`confidence_threshold` 0.85), multinomial sampling at "
        "`temperature` 1.0 as SDAR; stops after the block with an EOS (`stopping_criteria_idx`, as SDAR's script)",
        gen_length=128,
        params=dict(block_length=4, slot_size=1, align="absolute", denoising_steps=4,
                    remasking_strategy="low_confidence_dynamic", confidence_threshold=0.85,
                    sampler="block-multinomial", temperature=1.0, stop_at_eos="block"),
        partitioner="semi-ar",
        selector="sdar-steps",
        infiller="draft",
        peer="sdar.block_diffusion_generate",
    ),
    "ar": Preset(
        description="left-to-right lossless decoding: equals greedy autoregressive decoding",
        gen_length=128,
        params=dict(slot_size=8, serial_num_blocks=1),
        selector="leftmost",
        infiller="greedy-verify",
    ),
}


PRESETS["fast-dllm-prefix"] = attrs.evolve(
    PRESETS["fast-dllm"],
    description="Fast-dLLM threshold decoding with its prefix cache (generate_with_prefix_cache), for bidirectional "
    "models",
    reorderer="prefix-cache",
    peer="fast_dllm.generate_with_prefix_cache",
)
PRESETS["fast-dllm-dual"] = attrs.evolve(
    PRESETS["fast-dllm"],
    description="Fast-dLLM threshold decoding with its dual cache (generate_with_dual_cache), for bidirectional models",
    reorderer="dual-cache",
    peer="fast_dllm.generate_with_dual_cache",
)


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise unknown_name("preset", name, PRESETS)
    return PRESETS[name]


def route_params(registrations: Mapping[str, Registration], params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split flat ``params`` into per-part keyword arguments."""
    routed: dict[str, dict[str, Any]] = {kind: {} for kind in registrations}
    accepted = {kind: set(reg.parameters()) for kind, reg in registrations.items()}
    for key, value in params.items():
        if "." in key:
            kind, _, field = key.partition(".")
            if kind not in registrations:
                raise ConfigError(f"`{key}`: unknown part {kind!r}; parts are {', '.join(registrations)}.")
            if field not in accepted[kind]:
                raise ConfigError(
                    f"`{key}`: {kind} {registrations[kind].name!r} has no parameter {field!r}; "
                    f"it accepts: {', '.join(sorted(accepted[kind])) or 'none'}."
                )
            routed[kind][field] = value
            continue
        owners = [kind for kind in registrations if key in accepted[kind]]
        if not owners:
            listing = "; ".join(
                f"{kind} {reg.name!r}: {', '.join(sorted(accepted[kind])) or 'none'}" for kind, reg in registrations.items()
            )
            raise ConfigError(f"Unknown parameter `{key}`. Parameters by part: {listing}.")
        for kind in owners:  # a parameter several parts declare (e.g. `block_length`) means the same to each
            routed[kind][key] = value
    return routed


def build_parts(*, params: Mapping[str, Any] | None = None, registry: Any = None, **specs: Any) -> dict[str, Any]:
    """Instances of the four parts from ``partitioner=``, ``selector=``, ``infiller=``, ``reorderer=`` specs."""
    reg = registry or default_registry()
    regs: dict[str, Registration] = {}
    for kind in PART_KINDS:
        spec = specs[kind]
        if isinstance(spec, str) and ":" not in spec:
            regs[kind] = reg.entry(kind, spec)
        else:
            cls = spec if isinstance(spec, type) else type(spec) if not isinstance(spec, str) else reg.build(kind, spec).__class__
            regs[kind] = Registration(kind, getattr(cls, "name", cls.__name__), cls, "local", "local")
    routed = route_params(regs, params or {})
    return {kind: reg.build(kind, specs[kind], **routed[kind]) for kind in PART_KINDS}


PRESET_FIELDS = ("description", "gen_length", "params", *PART_KINDS)


def load_preset(path: Any) -> Preset:
    """A :class:`Preset` from a JSON file: the format of a checkpoint's ``refusion.json`` and of the
    ``preset.json`` that ``refusion sweep`` writes (``gen_length``, ``params``, optional part names and
    ``description``). Errors name the file and the field."""
    import json
    from pathlib import Path

    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"`preset file` {str(file)!r} cannot be read: {exc.strerror}.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"`preset file` {str(file)!r} is not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    where = f"`preset file` {str(file)!r}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object with `gen_length` and `params`.")
    unknown = sorted(set(data) - set(PRESET_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(PRESET_FIELDS)}.")
    length = data.get("gen_length")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ConfigError(f"{where}: field `gen_length` must be an integer >= 1; got {length!r}.")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: field `params` must be an object of name: value; got {params!r}.")
    for kind in PART_KINDS:
        if kind in data and not isinstance(data[kind], str):
            raise ConfigError(f"{where}: field `{kind}` must be a part name; got {data[kind]!r}.")
    return Preset(description=str(data.get("description", f"from {file}")), gen_length=length, params=dict(params),
                  **{k: data[k] for k in PART_KINDS if k in data})
