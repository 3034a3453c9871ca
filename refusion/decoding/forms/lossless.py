"""The batched form of ``greedy-verify``: lossless decoding of every row at once, the AR tokens in fewer forwards.

A decoder whose selector always takes the leftmost open slot (trait ``leftmost_only``), whose infiller is the
adaptive ``greedy-verify``, whose reorderer keeps commit order (trait ``commit_order``), with no reviser that
revises, a deterministic draft (the argmax, in any arithmetic) and no guidance, on an engine whose lanes hold each
sequence's context as a causal chain (trait ``causal_lanes``: the ``branch`` engine), decodes exactly what greedy
autoregressive decoding gives. :class:`Lossless` decides for all such rows at once: their state lives in arrays
(one entry per row), every decision of a step is an array operation over all rows, and the host reads two small
tensors per step (the predictions and their probabilities), whatever the batch. Its tokens join the step's
forward with every other row's.

Slots are reported (``DecodeSession.committed``) as they fill, in order, so streams see the same pieces as from
the per-sequence program; the tokens are the same as that program's and as transformers' ``generate``; the
number of forwards is not (the drafts ride with the verification instead of a forward of their own).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from refusion.decoding.forms.base import BatchedForm, hashable
from refusion.decoding.sampling import apply_sampler, is_greedy
from refusion.engines.feed import causal_spans


def deterministic(sampler: Any) -> bool:
    """Whether ``sampler`` drafts the argmax (in whatever arithmetic): each row's token depends on its logits
    alone and nothing is drawn at random."""
    return is_greedy(sampler) or (bool(getattr(sampler, "rowwise", False)) and not getattr(sampler, "draws", False))


def shared_reason(decoder: Any, engine: Any, record: bool) -> str | None:
    """What every batched form of a causal decode needs of the decoder and the engine, from their declared
    traits: no records, commit-order caching with no reviser, no guidance, no block stop, an engine whose lanes
    are causal chains, a causal model whose masks predict their own position."""
    if record:
        return "iteration records are asked for"
    if not getattr(decoder.reorderer, "commit_order", False):
        return "the reorderer does not keep commit order (trait `commit_order`)"
    if decoder.reviser.revises:
        return "a reviser revises"
    if getattr(decoder.selector, "rescores", False):
        return "the selector rescores each plan's logits (trait `rescores`)"
    if bool(getattr(decoder, "cfg_scale", False)):
        return "classifier-free guidance is on"
    if decoder.stop_at_eos == "block":
        return "stop_at_eos='block'"
    if not getattr(engine, "causal_lanes", False):
        return "the engine does not keep each sequence's context as a causal chain (trait `causal_lanes`)"
    model = engine.model
    caps = model.capabilities
    if not caps.causal or not caps.kv_cache or caps.logit_shift != 0 or model.mask_token_id is None:
        return "the model is not a causal model with a cache whose masks predict their own position"
    return None


class Lossless(BatchedForm):
    """All live rows of equal lossless decoders, decided together (see the module docstring).

    It writes each session's ``tokens``, ``commit_step``, ``committed`` as its slots fill, and its cache when it
    finishes; it never reads what another form keeps.
    """

    #: a guess is fed only while it and the guesses before it have at least this probability under the prediction
    #: that made it (random weights' guesses never reach it, the shipped model's accepted ones always do)
    min_draft_probability = 0.05

    @classmethod
    def refuses(cls, decoder: Any, engine: Any, record: bool) -> str | None:
        if not getattr(decoder.selector, "leftmost_only", False):
            return "the selector may choose another slot than the leftmost (trait `leftmost_only`)"
        if not getattr(decoder.infiller, "adaptive", False):
            return "the infiller is not adaptive (this form sizes each row's speculation itself)"
        if not deterministic(decoder.sample):
            return "the sampler draws at random"
        return shared_reason(decoder, engine, record)

    @classmethod
    def key(cls, decoder: Any) -> Hashable:
        return (cls, decoder.infiller, bool(decoder.stop_at_eos), hashable(decoder.sample))

    def __init__(self, loop: Any, decoder: Any):
        super().__init__(loop, decoder)
        engine = self.engine
        #: an EOS ends its row (else every position is decoded and the answer is cut at the first EOS after)
        self.stop_at_eos = bool(decoder.stop_at_eos)
        self.sample = decoder.sample
        #: the argmax on refusion's fused LM-head path (else the sampler's arithmetic on the rows' logits)
        self.fused = is_greedy(decoder.sample)
        self.limit_cap = 0
        self.probe_every = decoder.infiller.probe_every
        self.mask = int(engine.model.mask_token_id)
        self.sessions: list[Any] = []
        self.prompts: list[np.ndarray | None] = []  # a row's prompt until its first step feeds it
        self.stops: list[list[int]] = []  # per row: the stop offset of each slot, in order
        self._eos = np.array(sorted(engine.model.eos_token_ids), dtype=np.int64)
        self._step: tuple | None = None
        self._grow(0, 8, 8)

    # -- columns (one entry per row; ``guess`` and ``out`` one row each) ---------------
    gen: np.ndarray  # positions to generate
    produced: np.ndarray  # tokens produced so far
    last: np.ndarray  # the last produced token (fed next, pending)
    guess: np.ndarray  # (rows, slot length): guesses for the positions after it
    guesses: np.ndarray  # how many of them are valid
    width: np.ndarray  # how many guesses to feed (acceptance-adaptive)
    limit: np.ndarray  # the most guesses (the longest slot)
    idle: np.ndarray  # tokens since the width fell to zero
    misses: np.ndarray  # steps in a row whose guesses were all rejected or too unlikely to feed (probes wait longer)
    steps: np.ndarray  # forwards that served the row
    fed: np.ndarray  # tokens the row fed
    boundary: np.ndarray  # the stop offset of the next slot to report
    out: np.ndarray  # (rows, positions): the answer
    _COLUMNS = (
        "gen",
        "produced",
        "last",
        "guess",
        "guesses",
        "width",
        "limit",
        "idle",
        "misses",
        "steps",
        "fed",
        "boundary",
        "out",
    )

    def _grow(self, rows: int, capacity: int, width: int) -> None:
        """(Re)allocate the columns for ``capacity`` rows, ``width`` answer positions; keeps the first ``rows``."""
        old = getattr(self, "out", None)
        k = max(self.limit_cap, 1)
        fresh: dict[str, Any] = {name: np.zeros(capacity, dtype=np.int64) for name in self._COLUMNS}
        fresh["guess"] = np.zeros((capacity, k), dtype=np.int64)
        fresh["out"] = np.zeros((capacity, width), dtype=np.int64)
        if old is not None:
            for name, column in fresh.items():
                current: Any = getattr(self, name)
                if column.ndim == 1:
                    column[:rows] = current[:rows]
                else:
                    column[:rows, : current.shape[1]] = current[:rows, : column.shape[1]]
        for name, column in fresh.items():
            setattr(self, name, column)

    def __len__(self) -> int:
        return len(self.sessions)

    def admit(self, session: Any) -> None:
        """Add ``session``'s row (its engine state was just admitted: the prompt is pending)."""
        i = len(self.sessions)
        slots = session.partition.slots
        limit = max(slot.length for slot in slots)
        gen = session.partition.gen_length
        if limit > self.limit_cap or i >= self.out.shape[0] or gen > self.out.shape[1]:
            self.limit_cap = max(self.limit_cap, limit)
            self._grow(i, max(self.out.shape[0], 2 * (i + 1)), max(self.out.shape[1], gen))
        self.sessions.append(session)
        cache = session.cache  # a reused prefix is encoded already: the rest of the prompt is pending
        self.prompts.append(cache.tokens[cache.encoded :].numpy().copy())
        self.stops.append([slot.stop for slot in slots])
        for name in self._COLUMNS[:-2]:
            getattr(self, name)[i] = 0
        self.gen[i], self.width[i], self.limit[i], self.boundary[i] = gen, limit, limit, slots[0].stop

    # -- one step ------------------------------------------------------------------
    def feed(self, feed: Any) -> None:
        """Every row's pending token (its prompt at its first step), guesses and masks after its context."""
        n = len(self.sessions)
        self._step = None
        if not n:
            return
        mask, k = self.mask, self.guess.shape[1]
        produced, gen, width = self.produced[:n], self.gen[:n], self.width[:n]
        remaining = gen - produced  # >= 1 for a live row
        guesses = np.minimum(self.guesses[:n], np.minimum(width, remaining - 1))
        # masks draft the next guesses once a row has none left (a guess's row already predicts the next position)
        masks = np.where((width > 0) & (guesses == 0), width + 1, 0)
        masks = np.minimum(masks, np.maximum(remaining - 1 - guesses, 0))
        masks[masks == 1] = 0  # one mask drafts only the position the step decodes anyway
        new = [i for i, p in enumerate(self.prompts) if p is not None]
        pending: Any = np.ones(n, dtype=np.int64)
        for i in new:
            pending[i] = len(self.prompts[i])  # type: ignore[arg-type]  # a new row's prompt is set
        body = np.full((n, 2 * k + 1), mask, dtype=np.int64)
        body[:, :k] = np.where(np.arange(k)[None, :] < guesses[:, None], self.guess[:n], mask)
        counts = pending + guesses + masks
        if new:
            lead = int(pending.max())
            tokens = np.full((n, lead + body.shape[1]), mask, dtype=np.int64)
            tokens[:, 0] = self.last[:n]
            tokens[:, 1 : 1 + body.shape[1]] = body
            for i in new:
                p = int(pending[i])
                tokens[i, :p] = self.prompts[i]
                tokens[i, p : p + body.shape[1]] = body[i]
                self.prompts[i] = None
        else:
            tokens = np.concatenate((self.last[:n, None], body), axis=1)
        states = [session.state for session in self.sessions]
        lanes = [feed.lane(state, state.table) for state in states]
        lengths = np.fromiter((state.table.length for state in states), np.int64, n)
        # every row's tokens in one run: row i feeds tokens[i, :counts[i]] at columns length_i ..
        fed = np.arange(tokens.shape[1])[None, :] < counts[:, None]
        columns = (lengths[:, None] + np.arange(tokens.shape[1])[None, :])[fed]
        at = feed.add_runs(lanes, counts, tokens[fed], columns, columns, causal_spans(columns))
        self._step = (n, states, pending, guesses, masks, counts, at)

    def absorb(self, scores: Any, decisions: Any) -> None:
        """Accept each row's guesses that equal the predictions, gain one more token, draft the next guesses."""
        if self._step is None:
            return
        n, states, pending, guesses, masks, counts, offsets = self._step
        self._step = None
        mask, k = self.mask, self.guess.shape[1]
        produced, gen, width = self.produced[:n], self.gen[:n], self.width[:n]
        # the rows read: the last pending token's, each guess's and each mask's (prediction index 0 .. G + M)
        read = guesses + masks
        wanted = np.arange(int(read.max()) + 1)[None, :] <= read[:, None]
        rows = (offsets + pending - 1)[:, None] + np.arange(wanted.shape[1])[None, :]
        predicted = np.full(wanted.shape, -1, dtype=np.int64)
        read_rows = scores[torch.from_numpy(rows[wanted])]
        probability = None  # of each prediction, when some row guesses (a guess is fed only if likely enough)
        if not self.fused:  # the sampler's own arithmetic (e.g. the peers' softmax in the logits' dtype)
            picked, confidence = apply_sampler(self.sample, read_rows, mask, None)
            probability = np.zeros(wanted.shape)
            probability[wanted] = confidence.double().cpu().numpy()
        elif (width > 0).any():
            picked, best, lse = read_rows.stats(mask)
            probability = np.zeros(wanted.shape)
            probability[wanted] = torch.exp(best - lse).cpu().numpy()
        else:
            picked = read_rows.argmax(mask)
        predicted[wanted] = picked.cpu().numpy()  # the step's host reads: this and the probabilities
        # accepted guesses: equal to the prediction made from the accepted tokens before them
        span = min(k, predicted.shape[1] - 1)
        col = np.arange(span + 1)
        match = (self.guess[:n, :span] == predicted[:, :span]) & (col[None, :span] < guesses[:, None])
        accepted = np.cumprod(match, axis=1).sum(1)
        rows_n = np.arange(n)
        produced_token = predicted[rows_n, accepted]
        made = np.zeros((n, span + 1), dtype=np.int64)
        made[:, :span] = self.guess[:n, :span]
        made[rows_n, accepted] = produced_token
        gained = accepted + 1
        ended: Any = np.zeros(n, dtype=bool)
        if self.stop_at_eos and len(self._eos):  # an EOS ends the row
            hit = np.isin(made, self._eos) & (col[None, :] < gained[:, None])
            ended = hit.any(1)
            gained = np.where(ended, hit.argmax(1) + 1, gained)
        r_idx, c_idx = np.nonzero(col[None, :] < gained[:, None])
        self.out[r_idx, produced[r_idx] + c_idx] = made[r_idx, c_idx]
        all_in = accepted == guesses
        # the next guesses: the mask rows' own positions (all accepted) or Jacobi's after the first rejection
        start = np.where(all_in, guesses + 2, accepted + 1)
        available = np.where(all_in, np.maximum(masks - 1, 0), guesses - accepted)
        pick = np.minimum(start[:, None] + np.arange(k)[None, :], predicted.shape[1] - 1)
        unsure: Any = np.zeros(n, dtype=bool)  # rows whose guesses were cut for being unlikely
        if probability is not None:
            likely = probability[rows_n[:, None], pick] >= self.min_draft_probability
            kept = np.cumprod(likely & (np.arange(k)[None, :] < available[:, None]), axis=1).sum(1)
            unsure = kept < available
            available = kept
        self.guess[:n] = np.where(np.arange(k)[None, :] < available[:, None], predicted[rows_n[:, None], pick], mask)
        grown = np.minimum(np.maximum(2 * width, 1), self.limit[:n])
        width = np.where(guesses > 0, np.where(all_in, grown, accepted), width)
        width = np.where(unsure, np.minimum(width, available), width)  # as if the cut guesses were rejected
        missed = ((guesses > 0) & (accepted == 0)) | (unsure & (available == 0))  # rejected, or none likely
        misses = np.where((guesses > 0) & (accepted > 0), 0, self.misses[:n] + missed)
        misses = np.minimum(misses, 16)
        self.misses[:n] = misses
        idle = np.where(width == 0, self.idle[:n] + gained, 0)
        probe = idle >= (self.probe_every * self.limit[:n]) << np.maximum(misses - 1, 0)  # one guess again, later
        self.width[:n] = np.where(probe, 1, width)
        self.idle[:n] = np.where(probe, 0, idle)
        self.guesses[:n] = available
        self.last[:n] = produced_token
        produced += gained
        self.steps[:n] += 1
        self.fed[:n] += counts
        finished = ended | (produced >= gen)
        self.engine.keep_columns(states, (pending + accepted).tolist())
        done = []
        for i in np.nonzero((produced >= self.boundary[:n]) | finished)[0].tolist():
            self._report(i, bool(finished[i]))
            if finished[i]:
                done.append(i)
        for i in sorted(done, reverse=True):
            self._finish(i)

    def _report(self, i: int, finished: bool) -> None:
        """Row ``i`` filled slots (or ``finished``): write their tokens into its session, each slot reported as one
        iteration, as the per-sequence program commits them (the slot an EOS ends is cut there, later ones dropped)."""
        session, stops = self.sessions[i], self.stops[i]
        produced = int(self.produced[i])
        slots = session.partition.slots
        index = len(session.committed)
        while index < len(stops):
            slot = slots[index]
            if slot.offset >= produced or (slot.stop > produced and not finished):
                break
            end = min(slot.stop, produced)
            session.tokens[slot.offset : end] = torch.from_numpy(self.out[i, slot.offset : end])
            session.commit_step[slot.offset : end] = index
            session.sealed[slot.offset : end] = True
            session.open[index] = False
            session.committed.append(((index, end - slot.offset),))
            index += 1
        if index < len(stops):
            self.boundary[i] = stops[index]

    def _finish(self, i: int) -> None:
        """Row ``i`` is done: settle its session's cache, free its row, report its result to the loop."""
        session = self.sessions[i]
        produced = int(self.produced[i])
        eos: Any = np.nonzero(np.isin(self.out[i, :produced], self._eos))[0] if self.stop_at_eos else ()
        if len(eos):
            session.eos_offset = int(eos[0])
            session.open = [False] * len(session.open)
        # the answer is cached left to right; its last token is still pending
        result = session.settled(torch.arange(produced), session.state.table.length)
        self._remove(i)
        self.loop.finish(session, result)

    def _remove(self, i: int) -> None:
        """Free row ``i``: the last row moves into its place in the columns."""
        last = len(self.sessions) - 1
        for name in self._COLUMNS:
            column = getattr(self, name)
            column[i] = column[last]
        self.sessions[i], self.prompts[i], self.stops[i] = self.sessions[last], self.prompts[last], self.stops[last]
        del self.sessions[last], self.prompts[last], self.stops[last]

    def remove(self, session: Any) -> bool:
        for i, s in enumerate(self.sessions):
            if s is session:
                self._remove(i)
                return True
        return False
