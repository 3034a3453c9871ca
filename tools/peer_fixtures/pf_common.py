"""Shared helpers for make.py: importing peer files by path, provenance, mask guards, JSON layout."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HERE, "stubs")  # flash_attn CPU stand-in (SDAR worker only)
IMPORT_ONLY = os.path.join(HERE, "stubs", "import_only")  # triton import-only stand-in (one import only)


class FixtureError(RuntimeError):
    """A fixture could not be made as specified (fail loudly)."""


class MaskWins(RuntimeError):
    """A guard saw the mask id (or another forbidden id) win at a still-masked position."""


# --------------------------------------------------------------------------- importing peer code by path
def synth_package(name: str, path: str):
    """Register an empty package `name` whose __path__ is [path]; its __init__.py (if any) never runs."""
    if name in sys.modules:
        return sys.modules[name]
    if not os.path.isdir(path):
        raise FixtureError(f"peer folder not found: {path}")
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod = importlib.util.module_from_spec(spec)
    mod.__path__ = [path]
    sys.modules[name] = mod
    return mod


def alias_module(alias: str, module) -> None:
    sys.modules[alias] = module
    parent, _, child = alias.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def load_file(name: str, path: str):
    if not os.path.isfile(path):
        raise FixtureError(f"peer file not found: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def triton_import_only():
    """Make the import-only `triton` stand-in importable for one import, then purge it.

    torch >= 2.x treats an importable `triton` as a real install (torch._dynamo reads triton.language.dtype), so
    torch._dynamo and transformers.modeling_utils are imported first and torch's has_triton_package() is evaluated
    (and cached as False) before the stand-in becomes visible."""
    import torch._dynamo  # noqa: F401
    import torch.utils._triton as torch_triton

    torch_triton.has_triton_package()
    import transformers.modeling_utils  # noqa: F401

    if any(k == "triton" or k.startswith("triton.") for k in sys.modules):
        raise FixtureError("a real `triton` is already imported; the import-only stand-in would shadow nothing")
    sys.path.insert(0, IMPORT_ONLY)
    try:
        yield
    finally:
        sys.path.remove(IMPORT_ONLY)
        for k in [k for k in sys.modules if k == "triton" or k.startswith("triton.")]:
            del sys.modules[k]
        importlib.invalidate_caches()


# --------------------------------------------------------------------------- provenance
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def git_head(folder: str):
    """HEAD commit if `folder` itself is the top of a git work tree, else None (read-only git calls)."""
    try:
        top = subprocess.run(
            ["git", "-C", folder, "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30
        )
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(folder):
            return None
        head = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        return head.stdout.strip() if head.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def file_record(checkout: str, relpath: str, repo: str, option: str) -> dict:
    path = os.path.join(checkout, relpath)
    if not os.path.isfile(path):
        raise FixtureError(f"peer file not found: {path}")
    return {
        "repo": repo,
        "checkout_option": option,
        "path": relpath,
        "sha256": sha256_file(path),
        "commit": git_head(checkout),
    }


def versions() -> dict:
    import platform

    import safetensors
    import tokenizers
    import transformers

    return {
        "script": "tools/peer_fixtures/make.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


# --------------------------------------------------------------------------- guards
def _input_ids(args, kwargs):
    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    return ids


def record_fed(model, mask_id: int) -> list[tuple[int, int]]:
    """A list that a read-only forward pre-hook on ``model`` fills with ``(tokens fed, masks among them)`` per
    forward (clear it between calls)."""
    fed: list[tuple[int, int]] = []

    def hook(_module, args, kwargs):
        ids = _input_ids(args, kwargs)
        fed.append((int(ids.shape[1]), int((ids == mask_id).sum())))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return fed


class MaskGuard:
    """Read-only observer of a peer model and of the peer decoder's token choices.

    * forward hook: remembers the last input_ids and counts forwards; in greedy mode it checks that the argmax of
      the logits at every still-masked input position is not a forbidden id (Dream: on the shifted logits,
      cat(logits[:, :1], logits[:, :-1]) over the forward's own window, as its decoders do);
    * check_decision(scores): argmax of the scores a decoder picks from (LLaDA's add_gumbel_noise output), rows
      = the last forward's input;
    * check_draws(tokens): tokens drawn by torch.multinomial, one per row of the last forward's input (SDAR).
    Nothing is modified: hooks return None and the wrappers return the wrapped function's own result."""

    def __init__(self, model, mask_id: int, forbidden=None, shift: bool = False):
        self.mask_id = mask_id
        self.forbidden = torch.tensor(sorted(set(forbidden or [mask_id])))
        self.shift = shift
        self.greedy = False
        self.forwards = 0
        self.last_input = None
        self.violations: list[str] = []
        self.model = model
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def reset(self, greedy: bool) -> None:
        self.greedy, self.forwards, self.last_input, self.violations = greedy, 0, None, []

    def _bad(self, picked, ids):
        return (ids == self.mask_id) & torch.isin(picked, self.forbidden)

    def _hook(self, module, args, kwargs, output):
        ids = _input_ids(args, kwargs)
        self.forwards += 1
        self.last_input = ids.detach().clone() if ids is not None else None
        if not self.greedy or ids is None:
            return None
        logits = output.logits if hasattr(output, "logits") else output[0]
        if self.shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        bad = self._bad(logits.argmax(-1), ids)
        if bad.any():
            self.violations.append(
                f"forward {self.forwards}: argmax in {self.forbidden.tolist()} at masked "
                f"positions {bad.nonzero().tolist()} (input length {ids.shape[-1]})"
            )
        return None

    def check_decision(self, scores) -> None:
        ids = self.last_input
        if ids is None:
            return
        ids = ids[: scores.shape[0]]
        if ids.shape != scores.shape[:-1]:
            raise FixtureError(f"guard: scores {tuple(scores.shape)} do not match the last input {tuple(ids.shape)}")
        bad = self._bad(scores.argmax(-1), ids)
        if bad.any():
            self.violations.append(
                f"after forward {self.forwards}: decision argmax in {self.forbidden.tolist()} "
                f"at masked positions {bad.nonzero().tolist()}"
            )

    def check_draws(self, tokens) -> None:
        ids = self.last_input
        if ids is None:
            return
        flat = ids.reshape(-1)
        if tokens.shape[0] != flat.shape[0]:
            raise FixtureError(f"guard: {tokens.shape[0]} draws for an input of {flat.shape[0]} positions")
        bad = self._bad(tokens[:, 0], flat)
        if bad.any():
            self.violations.append(
                f"after forward {self.forwards}: sampled {tokens[:, 0][bad].tolist()} at masked "
                f"rows {bad.nonzero().flatten().tolist()}"
            )


@contextlib.contextmanager
def wrap_attr(owner, name: str, make_wrapper):
    """Temporarily replace owner.name by make_wrapper(original); the wrapper must return the original's result."""
    original = getattr(owner, name)
    setattr(owner, name, make_wrapper(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


# --------------------------------------------------------------------------- JSON layout
def _scalar(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def dumps(obj, indent: int = 0) -> str:
    """json with indent 2, but lists of scalars and small flat dicts on one line (token lists stay readable)."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        flat = json.dumps(obj, ensure_ascii=False)
        if (
            all(_scalar(v) or (isinstance(v, list) and all(_scalar(i) for i in v)) for v in obj.values())
            and len(flat) + indent <= 118
        ):
            return flat
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent + 2)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(_scalar(i) for i in obj):
            return json.dumps(list(obj), ensure_ascii=False)
        return "[\n" + ",\n".join(inner + dumps(i, indent + 2) for i in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps(obj) + "\n")


def rewrite_config_json(path: str, extra: dict, drop=()) -> dict:
    """Add published-only fields to a config.json, in the layout PretrainedConfig.to_json_string uses."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    cfg = json.loads(text)
    if json.dumps(cfg, indent=2, sort_keys=True) + "\n" != text:
        raise FixtureError(f"{path} is not in transformers' config layout; refusing to rewrite it")
    for k in drop:
        cfg.pop(k, None)
    cfg.update(extra)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


def write_or_check(name: str, golden: dict, out: str, check: bool) -> int:
    """Write ``golden`` as ``out``/golden.json and this CPU's kernel family as ``out``/cpu.json (its bfloat16 tokens
    hold on that family); with ``check``, compare with the golden.json there instead. Returns the exit status."""
    path = os.path.join(out, "golden.json")
    if check:
        with open(path, encoding="utf-8") as fh:
            same = fh.read() == dumps(golden) + "\n"
        print(f"{name}: same" if same else f"{name}: DIFFERENT")
        return 0 if same else 1
    os.makedirs(out, exist_ok=True)
    write_json(path, golden)
    write_json(
        os.path.join(out, "cpu.json"),
        {
            "made_on": torch.backends.cpu.get_cpu_capability(),
            "note": "torch.backends.cpu.get_cpu_capability() of the machine that made golden.json: its bfloat16 "
            "tokens hold on that CPU kernel family (float32 ones on every CPU).",
        },
    )
    print(f"{name}: {len(golden['calls'])} calls, {len(golden['skipped'])} skipped -> {out}")
    return 0
