"""The runtime under the decoder: one interface, interchangeable engines.

A decode is a program that yields :class:`~refusion.decoding.protocol.ModelCall` s
(:meth:`refusion.decoding.session.DecodeSession.program`). An :class:`Engine` runs
them against one model:

* :meth:`Engine.admit` creates the per-sequence state of an admitted prompt
  (a :class:`SequenceState`: the committed context and whatever the engine
  keeps for it);
* :meth:`Engine.run` answers one pending call of each given sequence;
* :meth:`Engine.release` gives a finished (or cancelled) sequence's memory back.

Engines count their work in :class:`~refusion.counters.Counters`, per
sequence and in total, the same way: a forward is one call of the network; a
sequence's forwards are those that served it. Built-ins: ``repeat``
(:mod:`refusion.engines.repeat`), ``branch`` (:mod:`refusion.engines.branch`)
and ``canvas`` (:mod:`refusion.engines.canvas`); plugins add more through the
``register_engines`` hook.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from refusion.counters import Counters, ForwardShape
from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import BlockReuse, Epoch, ExtendOutput, ModelCall
from refusion.models.base import exclusive


class SequenceState:
    """What an engine keeps for one admitted sequence.

    ``context`` is the sequence's committed context (tokens, positions,
    keys/values in cache order); ``counters`` what served it so far.
    ``prompt_length`` and ``region_length`` give its canvas: the prompt at
    positions ``0:prompt_length``, the generation region after it. The
    decoder tells the engine about the decode through two lifecycle calls,
    :meth:`start_block` and :meth:`end_at`; an engine subclasses this class to
    keep typed state of its own. Nothing else writes it.
    """

    def __init__(self, context: SequenceCache, counters: Counters, prompt_length: int, region_length: int):
        self.context = context
        self.counters = counters
        self.prompt_length = prompt_length
        self.region_length = region_length
        self.released = False

    @property
    def canvas_length(self) -> int:
        """Prompt plus generation region."""
        return self.prompt_length + self.region_length

    def start_block(self, start: int, stop: int, reuse: BlockReuse | None) -> None:
        """Serial block ``start:stop`` (absolute positions) begins; ``reuse`` is the reorderer's cache request."""

    def end_at(self, position: int) -> None:
        """An EOS was committed at absolute ``position``: no later position will be decoded."""


class Engine(ABC):
    """Runs the model calls of many sequences on one model.

    ``name`` is the registry key; among the engines that can run a model,
    :func:`~refusion.engines.factory.choose_engine` takes the one with the
    highest ``priority``. Subclasses implement :meth:`unsupported`,
    :meth:`admit` and :meth:`run`, call the network through :meth:`scores`
    (which holds the model's forward lock, so several engines may share one
    model across threads), count every network forward with :meth:`served`
    and every key/value copy on the sequence's counters.

    ``batch_invariant=True`` (the decoder option of that name, passed by
    :func:`~refusion.engines.factory.open_engine`) makes every sequence's
    tokens the ones it gets alone, in every dtype: :meth:`scores` runs each
    forward under an :class:`~refusion.engines.invariant.Invariance`. An
    engine whose forwards hold one sequence's tokens only sets
    ``mixes_sequences = False`` (its forwards are batch-invariant already).
    """

    name: ClassVar[str]
    kind: ClassVar[str] = "engine"
    priority: ClassVar[int] = 0
    #: whether one forward may hold several sequences' tokens (then batch-invariance tiles its linear layers)
    mixes_sequences: ClassVar[bool] = True
    #: a trait: the engine lays calls out into a shared :class:`~refusion.engines.feed.Feed` (:meth:`lay_out`)
    #: and runs it in one forward (:meth:`forward`), so batched forms can add their rows' tokens to the same forward
    #: (:class:`~refusion.engines.paged.PagedEngine`); else the loop hands programs' calls to :meth:`run`
    lays_out: ClassVar[bool] = False
    #: a trait: every sequence's lane holds its encoded context in columns ``0:len``, in cache order, as a causal
    #: chain, and tokens fed after it see it (the ``branch`` engine): causal batched forms run on it
    causal_lanes: ClassVar[bool] = False

    def __init__(self, model: Any, *, batch_invariant: bool = False):
        from refusion.errors import ConfigError
        from refusion.validators import check_boolean

        reason = self.unsupported(model)
        if reason is not None:
            raise ConfigError(f"engine {self.name!r} cannot run {type(model).__name__}: {reason}.", param="engine")
        check_boolean("batch_invariant", batch_invariant)
        self.model = model
        #: the batch-invariance of every forward (:mod:`refusion.engines.invariant`), or ``None``
        self.invariance = None
        if batch_invariant:
            from refusion.engines.invariant import Invariance

            self.invariance = Invariance.for_model(model)
        #: where the network runs (read once: adapters may find it by walking the parameters)
        self.device = model.device
        #: the engine's totals; each sequence's counters report their bytes here too
        self.counters = Counters()
        self.epoch = Epoch()

    @classmethod
    @abstractmethod
    def unsupported(cls, model: Any) -> str | None:
        """Why this engine cannot run ``model`` (a short reason), or ``None`` when it can."""

    @abstractmethod
    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        """Create the state of a new sequence whose prompt (1-D ids, checked) is not encoded yet.

        ``region_length`` is the number of positions to generate after it.
        The prompt becomes the context's pending entries (the first call
        encodes it).
        """

    @abstractmethod
    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Answer one call of each given sequence: one :class:`ExtendOutput` per extend, in order.

        Must encode a sequence's pending context entries before (or together
        with) its extends, and must not change its committed context otherwise.
        """

    def lay_out(self, state: SequenceState, call: ModelCall, feed: Any) -> Any:
        """Engines that lay calls out (trait ``lays_out``): add ``call`` to ``feed`` and return what finishes it
        once :meth:`forward` ran (see :class:`~refusion.engines.paged.PagedEngine`)."""
        raise NotImplementedError(f"engine {self.name!r} runs calls (`run`); it lays nothing out")

    def forward(self, feed: Any) -> Any:
        """Engines that lay calls out (trait ``lays_out``): one forward over every token of ``feed``."""
        raise NotImplementedError(f"engine {self.name!r} runs calls (`run`); it takes no feed")

    def guide(self, state: SequenceState, cfg_scale: float) -> None:
        """Apply classifier-free guidance with ``cfg_scale`` (> 0) to every call of ``state`` (LLaDA, Sec. 2.4).

        An engine that can runs a second forward with the prompt masked and
        answers with ``un + (cfg_scale + 1) * (cond - un)``; the default
        refuses with the reason.
        """
        from refusion.errors import ConfigError

        raise ConfigError(
            f"`cfg_scale` > 0 needs an engine with classifier-free guidance; engine {self.name!r} has "
            "none (the 'canvas' engine, for bidirectional models, applies it).",
            param="cfg_scale",
        )

    def release(self, state: SequenceState) -> None:
        """The sequence has finished or was cancelled: free what the engine keeps for it (idempotent)."""
        state.released = True

    def admission(self, prompt_length: int, region_length: int, *, alone: bool = False) -> str | None:
        """Why a sequence of ``prompt_length`` prompt tokens and ``region_length`` to generate cannot be admitted
        now, beside the running sequences (``alone``: even with none running), as a short reason naming the memory
        budget; ``None`` when it can. A scheduler queues a request that does not fit now and refuses one that does
        not fit alone. Engines with a memory budget (the ``branch`` engine's pages) say; the default admits
        everything."""
        return None

    def kv_pages(self) -> tuple[int, int] | None:
        """``(used, total)`` pages of keys/values, for engines that keep them on pages (``None`` here)."""
        return None

    def awaited_prefix(self, prompt: torch.Tensor) -> int:
        """Prompt tokens a sequence admitted now would compute but could reuse if admitted once the sequences being
        encoded publish their prompts (engines that reuse prompt prefixes across sequences); 0 here. A scheduler may
        hold such a request back a step; it must not wait on this forever."""
        return 0

    # -- counting ----------------------------------------------------------------
    def run_network(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: Any, cache: Any) -> Any:
        """One network forward (:meth:`ModelAdapter.scores <refusion.models.base.ModelAdapter.scores>`) while holding
        the model's lock (:func:`refusion.models.base.exclusive`); hold that lock yourself around any change to
        the network's state that the forward needs."""
        with exclusive(self.model):
            if self.invariance is None:
                return self.model.scores(input_ids, position_ids, attention_mask, cache)
            with self.invariance.forward(self.mixes_sequences):
                out = self.model.scores(input_ids, position_ids, attention_mask, cache)
            return self.invariance.scores(out)

    @property
    def batch_invariant(self) -> bool:
        """Whether every sequence gets the tokens it gets alone (see the class docstring)."""
        return self.invariance is not None

    def served(self, fed: Mapping[SequenceState, int], padded: int = 0, *, pairs: int = 0, keys: int = 0) -> None:
        """Count one network forward that fed ``fed[state]`` query tokens of each sequence, plus padding.

        ``pairs`` (query-key pairs attended) and ``keys`` (cached key/value
        tokens read) describe the forward's shape for the GPU cost model.
        """
        self.counted(len(fed), sum(fed.values()), padded, pairs=pairs, keys=keys)
        for state, n in fed.items():
            state.counters.forward(n, log=True)

    def counted(self, rows: int, fed: int, padded: int = 0, *, pairs: int = 0, keys: int = 0) -> None:
        """Count one network forward of ``rows`` sequences in the engine's totals only: ``fed`` query tokens plus
        ``padded`` padding, its shape for the cost model (see :meth:`served`, which also counts each sequence's)."""
        shape = ForwardShape(rows, fed + padded, pairs, keys) if self.counters.shapes is not None else None
        self.counters.forward(fed, shape=shape)
        self.counters.padded_tokens += padded

    def new_counters(self) -> Counters:
        """Counters for a new sequence, reporting into the engine's totals."""
        return Counters(parent=self.counters)
