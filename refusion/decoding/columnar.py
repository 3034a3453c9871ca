"""Whole-batch lossless decoding: the columnar form of left-to-right greedy verification.

A decoder composed of the ``leftmost`` selector, the ``greedy-verify`` infiller (adaptive), a greedy sampler, the
``commit-order`` reorderer and no revising reviser (the ``ar`` preset, and every decoder built that way) decodes
exactly what greedy autoregressive decoding gives. :class:`LosslessColumns` runs such decoders for all their rows at
once, on the ``branch`` engine's packed forwards: the rows' state lives in tensors (one entry per row), every
decision of a step is a tensor operation over all rows, and the host reads two small tensors per step (the
predictions and their probabilities), whatever the batch. The per-sequence program
(:class:`~refusion.decoding.session.DecodeSession.program`) stays the form every other composition runs in, and the
one a run that asks for iteration records gets.

Each step, row ``i`` feeds, after its cached entries: its pending tokens (the prompt at its first step, then the
token the previous step produced), its ``G`` guesses for the next positions, then ``M`` mask tokens. The row of the
last pending token predicts the first guess's position, the row of guess ``j`` the next one: the guesses that equal
those predictions are accepted (each prediction is conditioned only on accepted tokens, so every accepted token is
the greedy AR token), and the prediction after the accepted ones is one more token. Every step gains at least one
token. The next guesses are the mask rows' predictions for their own positions (when every guess was accepted: the
plan's drafts) or the predictions after the first rejected guess (Jacobi iteration). How many are fed follows how
many were accepted, per row, as a speculative decoder sizes its speculation: a row starts with a slot's worth (a
trained model's drafts pay from the first step; starting narrower cost the shipped model 1.8x the forwards at
``gen_length`` 32), doubles after a step that accepted every guess and shrinks to what was accepted otherwise, up to
the slot length; at zero a row decodes one token per forward and tries one guess again after ``probe_every`` slots'
worth of tokens, waiting twice as long after each probe that is rejected (a model whose drafts are never right pays
a few probes per answer, not one per ``probe_every`` slots). A guess is fed only while it and the guesses before it
have at least ``min_draft_probability`` (0.05) under the prediction that made it, the draft-confidence cut of
speculative decoders (random weights' guesses are never that likely, the shipped model's accepted ones always are);
a row whose guesses are cut narrows as after a rejection. Masks are fed only when a row has no guesses left.
Rejected guesses and masks leave the cache by a length change (no copy).

Slots are reported (``DecodeSession.committed``) as they fill, in order, so streams see the same pieces as from
the per-sequence program; the tokens are the same as that program's and as transformers' ``generate``; the
number of forwards is not (the drafts ride with the verification instead of a forward of their own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from refusion.decoding.types import DecodeResult


def _shared_reason(decoder: Any, engine: Any, record: bool, any_sampler: bool = False) -> str | None:
    """What every whole-batch loop needs: no records, drafting without guidance, commit-order caching with no
    reviser, the packed batch-variant ``branch`` engine, a causal model whose masks predict their own position.
    ``any_sampler``: any sampler (each row drawing from its own generator), else argmax on refusion's fused path."""
    from refusion.decoding.sampling import is_greedy
    from refusion.engines.branch import BranchEngine
    from refusion.strategies.reorderers.commit_order import CommitOrder

    if record:
        return "iteration records are asked for"
    if type(decoder.reorderer) is not CommitOrder or decoder.reviser.revises:
        return "the reorderer is not commit-order, or a reviser revises"
    if bool(getattr(decoder, "cfg_scale", False)):
        return "classifier-free guidance is on"
    if not (any_sampler or is_greedy(decoder.sample)):
        return "the sampler draws"
    if decoder.stop_at_eos == "block":
        return "stop_at_eos='block'"
    if type(engine) is not BranchEngine or not engine.packed or engine.batch_invariant:
        return "the engine is not the branch engine with packed, batch-variant forwards"
    model = engine.model
    caps = model.capabilities
    if not caps.causal or not caps.kv_cache or caps.logit_shift != 0 or model.mask_token_id is None:
        return "the model is not a causal model with a cache whose masks predict their own position"
    return None


def columnar_reason(decoder: Any, engine: Any, record: bool) -> str | None:
    """Why ``decoder``'s sessions on ``engine`` cannot run in a :class:`LosslessColumns` loop, or ``None``."""
    from refusion.strategies.infillers.greedy_verify import GreedyVerify
    from refusion.strategies.selectors.leftmost import Leftmost

    if type(decoder.selector) is not Leftmost or type(decoder.infiller) is not GreedyVerify:
        return "the parts are not leftmost + greedy-verify"
    if not decoder.infiller.adaptive:
        return "the greedy-verify infiller is not adaptive"
    return _shared_reason(decoder, engine, record)


def parallel_reason(decoder: Any, engine: Any, record: bool) -> str | None:
    """Why ``decoder``'s sessions on ``engine`` cannot run in a
    :class:`~refusion.decoding.parallel_columns.ParallelColumns` loop, or ``None``."""
    from refusion.strategies.infillers.parallel_ar import ParallelAR

    if type(decoder.infiller) is not ParallelAR:
        return "the infiller is not parallel-ar"
    return _shared_reason(decoder, engine, record, any_sampler=True)


def whole_batch_loop(decoder: Any, engine: Any, record: bool) -> tuple[Any, Any] | None:
    """``(key, make)`` of the whole-batch loop ``decoder``'s sessions on ``engine`` join (``make()`` builds it;
    sessions with equal keys share one: the key holds every part and option the loop reads from its decoder), or
    ``None`` when they run as per-sequence programs."""
    if columnar_reason(decoder, engine, record) is None:
        key: tuple = ("lossless", decoder.infiller, bool(decoder.stop_at_eos))
        return key, lambda: LosslessColumns(engine, decoder.infiller, bool(decoder.stop_at_eos))
    if parallel_reason(decoder, engine, record) is None:
        from refusion.decoding.parallel_columns import ParallelColumns

        key = ("parallel", _key(decoder.selector), decoder.infiller, _key(decoder.sample), bool(decoder.stop_at_eos))
        return key, lambda: ParallelColumns(engine, decoder)
    return None


def _key(part: Any) -> Any:
    """A part as a dictionary key: itself when hashable (equal parts share a loop), else its identity."""
    try:
        hash(part)
    except TypeError:
        return ("id", id(part))
    return part


class LosslessColumns:
    """All live rows of the lossless decoders of one engine, decided together (see the module docstring).

    :meth:`admit` takes a :class:`~refusion.decoding.session.DecodeSession` whose state the engine has just admitted
    (its prompt pending); :meth:`step` runs one forward for every row and returns the sessions that finished, with
    their results; :meth:`cancel` and :meth:`abort` free rows. The loop writes each session's ``tokens``,
    ``commit_step``, ``committed`` and counters as its slots fill, and its cache when it finishes; it never reads
    what another loop or program keeps.
    """

    #: a guess is fed only while it and the guesses before it have at least this probability under the prediction
    #: that made it (random weights' guesses never reach it, the shipped model's accepted ones always do)
    min_draft_probability = 0.05

    def __init__(self, engine: Any, infiller: Any, stop_at_eos: bool):
        self.engine = engine
        #: an EOS ends its row (else every position is decoded and the answer is cut at the first EOS after)
        self.stop_at_eos = bool(stop_at_eos)
        self.limit_cap = 0
        self.probe_every = infiller.probe_every
        self.mask = int(engine.model.mask_token_id)
        self.sessions: list[Any] = []
        self.prompts: list[np.ndarray | None] = []  # a row's prompt until its first step feeds it
        self.stops: list[list[int]] = []  # per row: the stop offset of each slot, in order
        self._eos = np.array(sorted(engine.model.eos_token_ids), dtype=np.int64)
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
    def step(self) -> list[tuple[Any, DecodeResult]]:
        """One forward for every row; returns the sessions that finished, with their results."""
        n = len(self.sessions)
        if not n:
            return []
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
        scores = self.engine.run_columns(states, torch.from_numpy(tokens), torch.from_numpy(counts))

        # the rows read: the last pending token's, each guess's and each mask's (prediction index 0 .. G + M)
        offsets = np.cumsum(counts) - counts
        read = guesses + masks
        wanted = np.arange(int(read.max()) + 1)[None, :] <= read[:, None]
        rows = (offsets + pending - 1)[:, None] + np.arange(wanted.shape[1])[None, :]
        predicted = np.full(wanted.shape, -1, dtype=np.int64)
        read_rows = scores[torch.from_numpy(rows[wanted])]
        probability = None  # of each prediction, when some row guesses (a guess is fed only if likely enough)
        if (width > 0).any():
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
        return [self._finish(i) for i in sorted(done, reverse=True)]

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

    def _finish(self, i: int) -> tuple[Any, DecodeResult]:
        """Row ``i`` is done: settle its session's cache and counters, free its row, return its result."""
        session = self.sessions[i]
        produced = int(self.produced[i])
        eos: Any = np.nonzero(np.isin(self.out[i, :produced], self._eos))[0] if self.stop_at_eos else ()
        if len(eos):
            session.eos_offset = int(eos[0])
            session.open = [False] * len(session.open)
        result = session.settled(  # the answer is cached left to right; its last token is still pending
            torch.arange(produced),
            len(session.state.store),
            int(self.steps[i]),
            int(self.fed[i]),
            self.engine.kv.token_bytes,
        )
        self._remove(i)
        return session, result

    def _remove(self, i: int) -> None:
        """Free row ``i``: the last row moves into its place in the columns (the engine gives its pages back)."""
        session = self.sessions[i]
        last = len(self.sessions) - 1
        for name in self._COLUMNS:
            column = getattr(self, name)
            column[i] = column[last]
        self.sessions[i], self.prompts[i], self.stops[i] = self.sessions[last], self.prompts[last], self.stops[last]
        del self.sessions[last], self.prompts[last], self.stops[last]
        self.engine.release(session.state)

    def cancel(self, session: Any) -> bool:
        """Stop ``session``'s row and free it; False if it is not in this loop."""
        for i, s in enumerate(self.sessions):
            if s is session:
                self._remove(i)
                return True
        return False

    def abort(self) -> None:
        """Free every row (a step raised)."""
        while self.sessions:
            self._remove(len(self.sessions) - 1)
