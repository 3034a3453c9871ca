"""What every command shares: the model flags, the decoding flags, prompts, records, and the flags' types.

Every number a flag takes is checked by its argparse ``type`` (:func:`integer`,
:func:`number`) against :mod:`refusion.limits` while the command line is
parsed, before anything heavy is imported: a bad value is refused in a
fraction of a second, naming the flag (``argument --port: must be an integer
in [1, 65535]; got 70000``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from refusion.config import PART_KINDS, PRESETS
from refusion.config.params import parse_param
from refusion.errors import ConfigError, unknown_name
from refusion.limits import MAX_GEN_LENGTH, MAX_TOKEN_ID
from refusion.validators import check_integer, check_number, shown

#: the largest sampling seed (a decode's generator takes 64 bits)
MAX_SEED = 2**64 - 1


def _argument_error(error: ConfigError) -> argparse.ArgumentTypeError:
    """A validator's error as argparse's (which prefixes the flag): ```value` must be ...`` -> ``must be ...``."""
    return argparse.ArgumentTypeError(str(error).removeprefix("`value` ").rstrip("."))


def integer(low: int | None = None, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]`` (either bound may be ``None``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        try:
            return check_integer("value", value, low, high, why)
        except ConfigError as exc:
            raise _argument_error(exc) from None

    parse.__name__ = "integer"
    return parse


#: suffixes of a size in bytes (``--kv-memory 8GiB``), powers of 1000 and of 1024
BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def byte_size(text: str) -> int:
    """An argparse ``type``: a positive size in bytes, plain (``8589934592``) or with a unit (``512MiB``, ``8GB``)."""
    import re
    from decimal import Decimal

    from refusion.limits import MAX_KV_MEMORY

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in BYTE_UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size: {shown(text)} (bytes, or a number with one of KB, MB, GB, KiB, MiB, GiB, TiB)"
        )
    size = Decimal(match.group(1)) * BYTE_UNITS[unit]  # exact: a float overflows on a long number
    if size > MAX_KV_MEMORY:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_KV_MEMORY} bytes (1 EiB); got {shown(text)}")
    value = int(size)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte; got {shown(text)}")
    return value


byte_size.__name__ = "size"


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, why: str = ""
) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``); NaN and
    infinities are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        try:
            return check_number("value", value, low, high, low_open=low_open, why=why)
        except ConfigError as exc:
            raise _argument_error(exc) from None

    parse.__name__ = "number"
    return parse


def part_name(kind: str) -> Callable[[str], str]:
    """An argparse ``type``: a ``kind`` name (``selector``, ``engine``, ...) or a ``"module:Class"`` path.

    An unknown name is refused while parsing, listing the known ones, when
    they can be known without importing anything (no entry-point plugin is on,
    :func:`~refusion.plugins.manager.listed_names`); else the registry refuses
    it once it is built.
    """

    def parse(text: str) -> str:
        if ":" in text:
            return text
        from refusion.plugins.manager import listed_names

        known = listed_names(kind)
        if known is None or text in known:
            return text
        raise _argument_error(unknown_name(kind.replace("_", " "), text, known))  # the registry's own words

    parse.__name__ = f"{kind} name"
    return parse


def _param(text: str) -> tuple[str, Any]:
    try:
        return parse_param(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The flags that say which model to load (``refusion.models.loading.MODEL_OPTIONS``)."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=None,
        help="checkpoint directory: LLaDA, Dream, SDAR, ReFusion, LLaDA 2.x and DiffusionGemma checkpoints are "
        "recognised from their config.json (default: the model shipped with refusion)",
    )
    group.add_argument("--device", default=None, help="torch device for the model, e.g. cuda")
    group.add_argument("--dtype", default="auto", help="model dtype: auto, float32, bfloat16, ...")
    group.add_argument(
        "--mask-token-id",
        type=integer(0, MAX_TOKEN_ID),
        default=None,
        help="mask token id, if the checkpoint does not say",
    )
    group.add_argument(
        "--eos-token-id", type=integer(0, MAX_TOKEN_ID), action="append", default=None, help="EOS id (repeatable)"
    )
    group.add_argument(
        "--adapter",
        type=part_name("model_adapter"),
        default=None,
        help="for architectures outside the supported families only: hf-causal (causal LMs), hf-mdm "
        "(bidirectional MDMs) or hf-block (block diffusion); default: recognised from config.json",
    )
    group.add_argument(
        "--logit-shift",
        type=int,
        default=None,
        choices=(0, 1),
        help="with --adapter hf-mdm: 0 = LLaDA-style, 1 = Dream-style (logits predict the next position)",
    )
    group.add_argument(
        "--model-block-length",
        type=integer(1, MAX_GEN_LENGTH),
        default=None,
        metavar="N",
        help="block length of a block-diffusion model (SDAR: config.json's block_size, else 4)",
    )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=False,
        help="run the checkpoint's own code (only for architectures outside the supported families)",
    )


def load(args: argparse.Namespace) -> Any:
    """The model the model flags describe."""
    from refusion.models.loading import MODEL_OPTIONS, load_from_options

    return load_from_options({name: getattr(args, name) for name in MODEL_OPTIONS})


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model flags, as a record stores them (``refusion reproduce`` loads the model from them)."""
    from refusion.models.loading import MODEL_OPTIONS

    return {name: getattr(args, name) for name in MODEL_OPTIONS}


#: decoding flags that set a spec parameter: flag, parameter, argparse keywords
PARAMETER_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--slot-size", "slot_size", dict(type=integer(1), help="tokens per slot (partitioner `slot_size`)")),
    (
        "--serial-blocks",
        "serial_num_blocks",
        dict(type=integer(1), help="serial blocks (partitioner `serial_num_blocks`)"),
    ),
    ("--slot-threshold", "slot_threshold", dict(type=number(), help="selector `slot_threshold` in [0, 1]")),
    ("--token-threshold", "token_threshold", dict(type=number(), help="infiller `token_threshold` in [0, 1]")),
    ("--temperature", "temperature", dict(type=number(), help="sampling temperature for drafts (0 = greedy)")),
    ("--top-k", "top_k", dict(type=integer(0), help="sample among the k most likely tokens")),
    ("--top-p", "top_p", dict(type=number(), help="sample within the top-p probability mass")),
    (
        "--seed",
        "seed",
        dict(type=integer(0, MAX_SEED), help="seed of the sampling (each prompt has its own generator)"),
    ),
    (
        "--engine",
        "engine",
        dict(
            type=part_name("engine"),
            help="what runs the model calls: branch (batched, shared-prefix branches), repeat "
            "(the reference's), canvas (bidirectional models), block (block diffusion); "
            "default: the best for the model",
        ),
    ),
)


def add_decoding_options(parser: argparse.ArgumentParser) -> None:
    """The flags that describe the decoder: preset, parts, parameters (see ``refusion plugins``)."""
    group = parser.add_argument_group("decoding (see `refusion plugins` for every part and parameter)")
    group.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help="named configuration (default: the checkpoint's refusion.json, else its family's own: llada, "
        "dream, sdar, llada2 or llada2.1, diffusion-gemma, with the checkpoint's generation defaults; paper "
        "otherwise)",
    )
    group.add_argument(
        "--preset-file",
        default=None,
        metavar="FILE",
        help="a decoder spec file, e.g. the preset.json `refusion sweep` writes (instead of --preset)",
    )
    group.add_argument(
        "--gen-length",
        "--max-tokens",
        dest="gen_length",
        type=integer(1, MAX_GEN_LENGTH),
        default=None,
        help="the most tokens the answer may hold: it is cut at the first EOS, else after this many tokens "
        "(the last slot or block may be shorter; a length the partitioner cannot split is refused with the "
        "nearest allowed ones); --max-tokens is the same flag under OpenAI's and vLLM's name. Default: the "
        "preset's, shortened to fit the model's positions (the shipped model has 128) with a note",
    )
    for kind in PART_KINDS:
        group.add_argument(
            f"--{kind}", type=part_name(kind), default=None, help=f"{kind} name (`refusion plugins` lists them)"
        )
    for flag, _, options in PARAMETER_FLAGS:
        group.add_argument(flag, default=None, **options)
    group.add_argument(
        "-p",
        "--param",
        type=_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any part parameter or decoder option, e.g. -p k=2 or -p selector.k=2 (repeatable)",
    )
    group.add_argument(
        "--no-stop-at-eos",
        dest="stop_at_eos",
        action="store_false",
        default=None,
        help="decode every position even after an EOS (the answer is still cut at the first EOS)",
    )
    group.add_argument(
        "--chat", dest="chat", action="store_true", default=None, help="apply the tokenizer's chat template"
    )
    group.add_argument("--no-chat", dest="chat", action="store_false", help="feed the prompt as is")


#: ``-p`` keys that are options of their own
NAMED = ("gen_length", "preset", "chat", *PART_KINDS)


def decoding_params(args: argparse.Namespace) -> dict[str, Any]:
    """The spec parameters the decoding flags and ``-p`` give (a key given both ways is refused).

    ``-p selector=topk`` means ``--selector topk``: such keys are moved onto ``args``.
    """
    params = dict(args.param)
    for key in NAMED:
        if key in params:
            if getattr(args, key, None) is not None:
                raise ConfigError(f"`{key}` is given twice (as an option and as -p {key}=...); keep one.", param=key)
            setattr(args, key, params.pop(key))
    args.param = list(params.items())  # moved keys are options now: a second call sees them once
    flags = [(flag.lstrip("-").replace("-", "_"), key) for flag, key, _ in PARAMETER_FLAGS]
    for dest, key in [*flags, ("stop_at_eos", "stop_at_eos")]:
        if getattr(args, dest, None) is not None:
            if key in params:
                raise ConfigError(f"`{key}` is given twice (as an option and as -p {key}=...); keep one.", param=key)
            params[key] = getattr(args, dest)
    return params


def chosen_preset(args: argparse.Namespace) -> Any:
    """``--preset NAME`` or the spec read from ``--preset-file FILE`` (not both)."""
    if getattr(args, "preset_file", None) is None:
        return args.preset
    if args.preset is not None:
        raise ConfigError("Give either `--preset` or `--preset-file`, not both.", param="preset_file")
    from refusion.config import load_preset

    return load_preset(args.preset_file)


def prompts(args: argparse.Namespace) -> list[Any]:
    """The prompt arguments: texts, or token ids with ``--ids``."""
    given: list[Any] = list(args.prompt)
    if getattr(args, "ids", False):
        try:
            given = [[int(t) for t in p.split(",")] for p in given]
        except ValueError:
            raise ConfigError(
                f"`prompt` with --ids must be comma-separated integers; got {args.prompt!r}.", param="prompt"
            ) from None
    return given


def check_decoding(args: argparse.Namespace) -> None:
    """Build the decoder the decoding flags describe, without a model, so that a bad part name, parameter or
    ``--gen-length`` is refused before the model loads. Under ``--preset`` (or ``--preset-file``), else the
    checkpoint's own preset (a local checkpoint's ``refusion.json``, read without loading the model). Without
    either, the decoder depends on the model (a hub checkpoint's files, its family's default), and so does a
    peer's preset (``--preset sdar`` translates its arguments against the model): those are checked once the
    model is loaded."""
    from refusion.api import build_decoder
    from refusion.config import preset as named_preset
    from refusion.models.loading import read_model_preset

    params = decoding_params(args)
    parts = {kind: getattr(args, kind) for kind in PART_KINDS if getattr(args, kind, None) is not None}
    preset = chosen_preset(args)
    if preset is None and Path(model_path(args)).is_dir():
        preset = read_model_preset(model_path(args), trust_remote_code=getattr(args, "trust_remote_code", False))
    spec = named_preset(preset) if isinstance(preset, str) else preset
    if spec is None or spec.peer is not None:
        return
    decoder, _ = build_decoder(None, preset=preset, **parts, **params)
    if getattr(args, "gen_length", None) is not None:
        decoder.partition(args.gen_length)


def model_path(args: argparse.Namespace) -> str:
    """The checkpoint directory ``--model`` names (default: the shipped model's)."""
    from refusion.models.default import default_model_path

    return args.model if getattr(args, "model", None) is not None else str(default_model_path())


def decode(args: argparse.Namespace, texts: list[Any], model: Any, *, record: bool = False) -> list[Any]:
    """Decode ``texts`` with the decoder the decoding flags describe (``record``: keep the iteration records)."""
    from refusion.api import generate

    params = decoding_params(args)
    parts = {kind: getattr(args, kind) for kind in PART_KINDS}
    return generate(
        texts,
        model,
        gen_length=args.gen_length,
        preset=chosen_preset(args),
        chat=args.chat,
        trace=getattr(args, "trace", None),
        record=record,
        allow_special=getattr(args, "allow_special_tokens", False),
        **parts,
        **params,
    )


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """The flags about how prompt text is read: ``--ids`` and ``--allow-special-tokens``."""
    parser.add_argument("--ids", action="store_true", help="the prompts are comma-separated token ids, not text")
    parser.add_argument(
        "--allow-special-tokens",
        action="store_true",
        default=False,
        help="let prompt text name special tokens (e.g. <|endoftext|>), which become their ids; refused by default",
    )


def add_trust_options(parser: Any, *, what: str) -> None:
    """``--allow-imports`` and ``--allow-special-tokens`` for a command reading untrusted ``what`` (rows, requests).

    Both default to off: a ``module:Class`` name imports and runs that module,
    and special-token text becomes special ids.
    """
    parser.add_argument(
        "--allow-imports",
        action="store_true",
        default=False,
        help=f"let {what} name parts and the engine by 'module:Class' path, which imports and runs "
        "that module; only for trusted input (refused by default)",
    )
    parser.add_argument(
        "--allow-special-tokens",
        action="store_true",
        default=False,
        help=f"let the text of {what} name special tokens (e.g. <|endoftext|>), which become their "
        "ids (refused by default)",
    )


def add_kv_cache_options(parser: Any, *, what: str) -> None:
    """``--no-prefix-cache`` and ``--kv-memory`` for a command decoding many ``what`` (rows, requests) on one
    engine: prefix reuse across them (on by default) and the memory their keys/values may take."""
    parser.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_const",
        const=False,
        default=None,
        help=f"compute every prompt in full (default: {what} reuse the keys/values of prompt prefixes they share)",
    )
    parser.add_argument(
        "--kv-memory",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help=f"memory keys/values may take, e.g. 8GiB ({what} wait for room beyond it; default: 40%% of the free "
        "GPU memory, or half the host's available memory)",
    )


def write_record(record: dict, path: str | None, to_stdout: bool) -> None:
    """Print ``record`` as JSON and/or write it to ``path``."""
    text = json.dumps(record)
    if to_stdout:
        print(text)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            raise ConfigError(f"`--record` file {path!r} could not be written: {exc}", param="--record") from exc
