"""A model adapter whose network forward runs under ``torch.compile``.

:func:`compile_adapter` compiles the part of the network every engine calls:
the backbone when the adapter's LM head is separate
(:attr:`HFCausalLM.head <refusion.models.hf.HFCausalLM.head>`; the head stays
eager and projects only the rows someone reads), else the whole network. The
adapter keeps its API: engines call it as before, and the compiled forward
takes the same inputs and returns the same outputs.

Shapes. An engine feeds a different number of query tokens and keys nearly
every step; compiling each shape would recompile every step. The forward is
compiled with dynamic shapes, and three rules keep the graphs few:

* no duck sizing: sizes that happen to be equal on the first call (a
  prompt's tokens and its keys) are not assumed equal afterwards;
* the model's geometry in a key/value buffer (layers, key/value heads, head
  size) is static, every other size symbolic;
* with ``buckets`` (on by default with CUDA graphs, which record one graph
  per concrete shape), the key length of a packed forward
  (:mod:`refusion.engines.ragged`) is rounded up to a multiple of
  ``buckets`` where the buffer has room, the added keys masked out. Query
  tokens are never padded (that would write key/value entries).

What remains is about one graph per branch the Python takes (one query token
or many, one sequence or several, an empty cache or not, a query span at
column 0 or not): :func:`compile_stats` counts them. Batch-invariant forwards
(:mod:`refusion.engines.invariant`) run eagerly. Knows nothing about
decoding: it sees network calls only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from refusion.errors import ConfigError
from refusion.validators import is_integer

#: ``mode`` values :func:`compile_adapter` takes (``torch.compile``'s), and those that capture CUDA graphs
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: key-length bucket of the CUDA-graph modes
CUDA_GRAPH_BUCKETS = 64
#: dynamo's compiles per code object are raised to at least this: transformers' forward wrapper is one code
#: object shared by every model of the process
RECOMPILE_LIMIT = 64
#: keywords of :func:`compile_adapter` that ``load_model(compile={...})`` takes
OPTIONS = ("mode", "backend", "dynamic", "buckets")


@attrs.frozen
class CompileStats:
    """What compiling has cost so far.

    ``calls`` of the compiled forward; ``compiling_calls`` among them that
    compiled (the first compile, then ``recompiles``); ``graphs`` compiled
    (graph breaks add graphs); ``graph_breaks``; ``compile_seconds``, the wall
    time of the compiling calls (their forward included).
    """

    calls: int = 0
    compiling_calls: int = 0
    graphs: int = 0
    graph_breaks: int = 0
    compile_seconds: float = 0.0

    @property
    def recompiles(self) -> int:
        """Calls that compiled again after the first compile."""
        return max(0, self.compiling_calls - 1)


def _dynamo_totals() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


class CompiledForward:
    """Stands in for the compiled module's ``forward``: buckets keys, marks shapes, runs the compiled forward, counts.

    Counts come from dynamo's process-wide counters read around each call: a
    compile that another thread runs meanwhile (for another model) is counted
    here too.
    """

    def __init__(self, eager: Any, compiled: Any, *, buckets: int | None, cuda_graphs: bool):
        self.eager, self.compiled = eager, compiled
        self.buckets, self.cuda_graphs = buckets, cuda_graphs
        self.stats = CompileStats()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch.fx.experimental._config as fx_config

        if _invariant_forward():  # row tiles and per-row attention are Python-level choices: run eagerly
            return self.eager(*args, **kwargs)
        if self.buckets:
            kwargs = _bucketed(kwargs, self.buckets)
        _mark(kwargs, static_address=self.cuda_graphs)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        graphs, breaks = _dynamo_totals()
        start = time.perf_counter()
        with fx_config.patch(use_duck_shape=False):
            out = self.compiled(*args, **kwargs)
        now_graphs, now_breaks = _dynamo_totals()
        s, compiled = self.stats, now_graphs > graphs
        self.stats = CompileStats(
            s.calls + 1,
            s.compiling_calls + compiled,
            s.graphs + now_graphs - graphs,
            s.graph_breaks + now_breaks - breaks,
            s.compile_seconds + (time.perf_counter() - start if compiled else 0.0),
        )
        if self.cuda_graphs and hasattr(out, "items"):  # a replay overwrites the last one's outputs: copy them
            for key, value in out.items():
                if isinstance(value, torch.Tensor):
                    out[key] = value.clone()
        return out


def _invariant_forward() -> bool:
    """Whether a batch-invariant forward (:mod:`refusion.engines.invariant`) runs in this thread."""
    from refusion.engines.invariant import current

    return current() is not None


def _cache_key(kwargs: Mapping[str, Any]) -> str:
    """The keyword that holds the forward's cache: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    return "past_key_values" if kwargs.get("cache") is None and "past_key_values" in kwargs else "cache"


def _mark(kwargs: Mapping[str, Any], static_address: bool) -> None:
    """Make the geometry dims of the key/value pages a forward writes static (everything else stays dynamic)."""
    data = getattr(kwargs.get(_cache_key(kwargs)), "slots", None)
    if isinstance(data, torch.Tensor) and data.dim() == 5:  # (layers, 2, slots, kv_heads, head_dim)
        for dim in (0, 1, 3, 4):
            torch._dynamo.mark_static(data, dim)
        if static_address:
            torch._dynamo.mark_static_address(data)


def _bucketed(kwargs: dict[str, Any], bucket: int) -> dict[str, Any]:
    """``kwargs`` of a packed forward with its key length rounded up to a multiple of ``bucket`` (within the
    pool's slots), the added keys masked out (read from slot 0 of each row, or past a consecutive row's last key);
    any other forward's unchanged.

    The attention is the same; the CPU sdpa kernels may sum in another order
    over the longer key range (last-bit differences).
    """
    from refusion.engines.ragged import RaggedCache

    key = _cache_key(kwargs)
    cache, masks = kwargs.get(key), kwargs.get("attention_mask")
    if not isinstance(cache, RaggedCache) or not isinstance(masks, dict):
        return kwargs
    layout = cache.layout
    if layout.spans is not None:  # the paged kernel's shapes do not depend on the key length
        return kwargs
    keys = -(-layout.keys // bucket) * bucket
    if layout.base is not None:
        keys = min(keys, cache.slots.shape[2] - layout.base)
    if keys == layout.keys:
        return kwargs
    mask = layout.mask
    if mask is None:  # a single query that sees every key
        mask = torch.ones((layout.rows, 1, layout.n_max, layout.keys), dtype=torch.bool, device=cache.slots.device)
    extra = keys - layout.keys
    reads = None if layout.reads is None else torch.nn.functional.pad(layout.reads, (0, extra), value=0)
    wider = attrs.evolve(layout, mask=torch.nn.functional.pad(mask, (0, extra), value=False), keys=keys, reads=reads)
    return {
        **kwargs,
        key: RaggedCache(cache.slots, wider),
        "attention_mask": {name: wider if value is layout else value for name, value in masks.items()},
    }


def compiled_module(adapter: Any) -> torch.nn.Module:
    """The module :func:`compile_adapter` compiles: the adapter's backbone when its LM head is separate, else its
    network. Raises :class:`ConfigError` for an adapter without a torch network."""
    network = getattr(adapter, "model", None)
    if not isinstance(network, torch.nn.Module):
        raise ConfigError(
            f"`compile` needs an adapter with a torch network (`.model`); {type(adapter).__name__} has none.",
            param="compile",
        )
    found = getattr(adapter, "head", None)  # found and checked now, eagerly, before anything is compiled
    return found[0] if found is not None else network


def _check(mode: Any, backend: Any, dynamic: Any, buckets: Any, within: str | None = None) -> None:
    """Refuse option values :func:`compile_adapter` cannot use. Errors name the option, or ``within`` (the
    parameter that holds the options) when given."""

    def bad(field: str, text: str) -> ConfigError:
        name = f"`{within}` {field}" if within else f"`{field}`"
        return ConfigError(f"{name} {text}", param=within or field)

    if mode not in MODES:
        raise bad("mode", f"must be one of {', '.join(map(repr, MODES))}; got {mode!r}.")
    backends = torch._dynamo.list_backends(exclude_tags=())
    if not callable(backend) and backend not in backends:
        raise bad("backend", f"must be a callable or one of {', '.join(backends)}; got {backend!r}.")
    if mode is not None and backend != "inductor":
        raise bad("mode", f"{mode!r} applies to the 'inductor' backend only; got backend {backend!r}.")
    if dynamic not in (True, False, None):
        raise bad("dynamic", f"must be True, False or None; got {dynamic!r}.")
    if buckets is not None and (not is_integer(buckets) or buckets < 1):
        raise bad("buckets", f"must be None or an integer >= 1; got {buckets!r}.")


def compile_adapter(
    adapter: Any,
    *,
    mode: str | None = None,
    backend: Any = "inductor",
    dynamic: bool | None = True,
    buckets: int | None = None,
) -> Any:
    """Compile ``adapter``'s network forward in place (the module :func:`compiled_module` names); return ``adapter``.

    ``mode``, ``backend`` and ``dynamic`` go to ``torch.compile`` (a ``mode``
    with the inductor backend only; on the CPU inductor needs a C++ compiler,
    else a :class:`ConfigError`). ``mode="reduce-overhead"`` (and
    ``"max-autotune"``) capture CUDA graphs, one per shape: they need a model
    on CUDA (else a :class:`ConfigError`: on the CPU use ``mode=None``), keep
    the key/value buffer at a static address and bucket key lengths
    (``buckets``, :data:`CUDA_GRAPH_BUCKETS` unless given). ``buckets``
    rounds packed forwards' key lengths up to its multiples in any mode;
    ``None`` (the default elsewhere) rounds nothing. Compiling again replaces
    the previous compile. Raises dynamo's ``recompile_limit`` to at least
    :data:`RECOMPILE_LIMIT`. :func:`compile_stats` reports the cost.
    """
    _check(mode, backend, dynamic, buckets)
    cuda_graphs = mode in CUDA_GRAPH_MODES
    if cuda_graphs and torch.device(adapter.device).type != "cuda":
        raise ConfigError(
            f"`mode` {mode!r} captures CUDA graphs and needs a model on CUDA; this one is on "
            f"{adapter.device}. On the CPU compile with mode=None (compile=True).",
            param="mode",
        )
    if backend == "inductor" and torch.device(adapter.device).type == "cpu" and not _cpp_compiler():
        raise ConfigError(
            "`backend` 'inductor' compiles C++ on the CPU and no C++ compiler was found (g++, clang++, "
            "c++ or $CXX): install one, or use backend='aot_eager' (no speed-up).",
            param="backend",
        )
    from refusion.engines.invariant import current
    from refusion.models.base import exclusive

    module = compiled_module(adapter)
    torch._dynamo.assume_constant_result(current)  # compiled code runs only while it is None (_invariant_forward)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    with exclusive(adapter):
        previous = module.__dict__.get("forward")
        eager = previous.eager if isinstance(previous, CompiledForward) else module.forward
        compiled = torch.compile(eager, mode=mode, backend=backend, dynamic=dynamic)
        module.forward = CompiledForward(
            eager,
            compiled,
            cuda_graphs=cuda_graphs,
            buckets=buckets if buckets is not None or not cuda_graphs else CUDA_GRAPH_BUCKETS,
        )
    return adapter


def _cpp_compiler() -> str | None:
    import os
    import shutil

    return os.environ.get("CXX") or next(filter(None, map(shutil.which, ("g++", "clang++", "c++"))), None)


def compile_options(value: Any) -> dict[str, Any] | None:
    """The :func:`compile_adapter` keywords that ``load_model``'s ``compile`` value asks for, or ``None`` (no compile).

    ``False``/``None``: no compile; ``True``: the defaults (inductor, dynamic
    shapes); a mode name (``"reduce-overhead"``, ...); or a dict of
    :data:`OPTIONS`. Anything else, and a CUDA-graph mode where CUDA is not
    available, is a :class:`ConfigError` naming ``compile``.
    """
    allowed = (
        "True, False, a torch.compile mode ("
        + ", ".join(repr(m) for m in MODES if m)
        + f") or a dict of {', '.join(OPTIONS)}"
    )
    if value is None or value is False:
        return None
    if value is True:
        options: dict[str, Any] = {}
    elif isinstance(value, str) and value in MODES:
        options = {"mode": value}
    elif isinstance(value, Mapping) and all(isinstance(key, str) and key in OPTIONS for key in value):
        options = dict(value)
    else:
        raise ConfigError(f"`compile` must be {allowed}; got {value!r}.", param="compile")
    defaults = {"mode": None, "backend": "inductor", "dynamic": True, "buckets": None}
    merged = {**defaults, **options}
    _check(merged["mode"], merged["backend"], merged["dynamic"], merged["buckets"], "compile")
    if options.get("mode") in CUDA_GRAPH_MODES and not torch.cuda.is_available():
        raise ConfigError(
            f"`compile` mode {options['mode']!r} captures CUDA graphs and needs CUDA, which is not "
            "available; on the CPU use compile=True.",
            param="compile",
        )
    return options


def compile_stats(adapter: Any) -> CompileStats | None:
    """What compiling ``adapter``'s forward has cost so far, or ``None`` when it is not compiled."""
    network = getattr(adapter, "model", None)
    for module in (getattr(network, "base_model", None), network):
        forward = module.__dict__.get("forward") if isinstance(module, torch.nn.Module) else None
        if isinstance(forward, CompiledForward):
            return forward.stats
    return None
