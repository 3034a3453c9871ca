"""Every hook a refusion plugin can implement.

Each hook is called once, when the registry is built, with a ``register``
callable. A plugin calls ``register(cls)`` for each class it provides; the
class must subclass the matching interface and define a unique ``name``.
The decode loop never calls hooks: it calls methods of the parts it was given.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("refusion")

Register = Callable[[type], type]

#: names a part's parameters may not take: the decoder's own (its options, its sampler and the sampler's
#: parameters, its length, description and peer function). A flat parameter of one of these names always goes to
#: the decoder (:meth:`~refusion.config.spec.DecoderSpec.with_params`), so a part declaring one would never get it
#: by that name: the registry refuses such a part when it is registered. ``refusion.config.options`` defines the
#: options and checks, when it is imported, that each is listed here.
DECODER_NAMES: tuple[str, ...] = (
    "engine",
    "seed",
    "stop_at_eos",
    "cfg_scale",
    "calls_per_token",
    "batch_invariant",
    "sample",
    "sampler",
    "temperature",
    "top_k",
    "top_p",
    "gen_length",
    "description",
    "peer",
)


@hookspec
def register_partitioners(register: Register) -> None:
    """Register :class:`~refusion.strategies.base.SlotPartitioner` subclasses: ``register(MyPartitioner)``."""


@hookspec
def register_selectors(register: Register) -> None:
    """Register :class:`~refusion.strategies.base.SlotSelector` subclasses: ``register(MySelector)``."""


@hookspec
def register_infillers(register: Register) -> None:
    """Register :class:`~refusion.strategies.base.Infiller` subclasses: ``register(MyInfiller)``."""


@hookspec
def register_reorderers(register: Register) -> None:
    """Register :class:`~refusion.strategies.base.CacheReorderer` subclasses: ``register(MyReorderer)``."""


@hookspec
def register_revisers(register: Register) -> None:
    """Register :class:`~refusion.strategies.base.Reviser` subclasses: ``register(MyReviser)``."""


@hookspec
def register_model_adapters(register: Register) -> None:
    """Register :class:`~refusion.models.base.ModelAdapter` subclasses: ``register(MyAdapter)``."""


@hookspec
def register_model_families(register: Register) -> None:
    """Register :class:`~refusion.models.families.base.ModelFamily` subclasses: ``register(MyFamily)``.

    A family recognises published checkpoints from their ``config.json`` and
    loads them into a maintained transformers class, so that
    :func:`refusion.load_model` runs them without their remote code.
    """


@hookspec
def register_engines(register: Register) -> None:
    """Register :class:`~refusion.engines.base.Engine` subclasses: ``register(MyEngine)``.

    An engine runs the decoder's model calls for many sequences; see
    :mod:`refusion.engines.base` for its contract. Among the engines that can
    run a model, the one with the highest ``priority`` is chosen by default.
    """
