"""The batched form of ``parallel-ar``: ReFusion's slot selection and parallel-AR verification for every row at once.

A decoder composed of any selector, the ``parallel-ar`` infiller (any ``precision``), a reorderer that keeps
commit order (trait ``commit_order``), no revising reviser and any sampler without guidance (the shipped model's
preset, ReFusion's algorithm with every tuned threshold, and the same with temperature, top-k/top-p, LLaDA's Gumbel
noise or SDAR's block multinomial) runs here for all its rows together, on an engine whose lanes are causal chains
(the ``branch`` engine). A sampler that draws is called per row with that row's own generator, on exactly the rows
its program draws at once (a plan's masks, a branch's masks), so a seeded row draws the same alone and in any
batch. Each row is in one phase of the paper's iteration, and its tokens join the step's one forward with every
other row's, whatever their phases:

- ``plan``: the open slots the selector may choose, as masks after the context (with the prompt at a row's first
  step). Every row's slot confidences are read at once and the selector's batched
  :meth:`~refusion.strategies.base.SlotSelector.choose` decides for all rows of the step that use it, whatever
  form they are in (:class:`~refusion.decoding.decisions.Decisions`; a selector without a batched form gets each
  row's :class:`~refusion.decoding.types.Plan` through the per-sequence adapter).
- ``verify``: the chosen slots' drafts concatenated (global verification). The accepted prefix of every row comes
  out of one head pass: each slot's first token always, later tokens while their AR probability is above
  ``token_threshold``. A prefix with an EOS or whole slots is committed with this pass's keys/values.
- ``draft`` / ``check``: otherwise each chosen slot is a branch that sees the context and itself only (its own
  columns after the context: the branches lie where the concatenation lay, so the finished ones are already in
  commit order and committing them is a length change). A draft round fills each branch's unaccepted tokens from
  masks, a check round accepts the first of them and every following one above the threshold, until every branch
  is full; an accepted EOS ends its branch and drops the branches after it.

The tokens, the forwards and the cache are those of the per-sequence program
(:class:`~refusion.strategies.infillers.parallel_ar.ParallelAR` run by
:class:`~refusion.decoding.session.DecodeSession`): the same passes, decided for all rows at once. The host reads
each step's statistics once, whatever the batch: on refusion's fused path one LM-head pass over every row read; in
another arithmetic the sampler over the draft rows and the infiller's probability over the verified ones.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from refusion.decoding.checks import checked_candidates
from refusion.decoding.forms.base import BatchedForm, hashable
from refusion.decoding.forms.lossless import deterministic, shared_reason
from refusion.decoding.sampling import apply_sampler, is_greedy, token_probability
from refusion.decoding.types import Drafts, Plan
from refusion.engines.feed import Feed

PLAN, VERIFY, DRAFT, CHECK = range(4)


class _Row:
    """One sequence's state in the loop: its slots, the phase of its iteration and the chosen slots' tokens."""

    __slots__ = (
        "session",
        "prompt",
        "context",
        "region",
        "offset",
        "length",
        "blocks",
        "block",
        "open",
        "phase",
        "chosen",
        "tokens",
        "starts",
        "accepted",
        "cached",
        "active",
        "stop",
        "cutoff",
        "order",
        "positions",
        "planned",
        "plan_at",
    )
    session: Any
    prompt: np.ndarray | None
    context: int
    region: int
    offset: np.ndarray  # per slot of the partition: its region offset, its length, whether it is open
    length: np.ndarray
    open: np.ndarray
    blocks: list[np.ndarray]
    block: int
    phase: int
    planned: np.ndarray  # the slots the current plan drafts
    plan_at: int  # the packed index of the plan's first mask
    chosen: np.ndarray  # the chosen slots, in position order
    tokens: np.ndarray  # their tokens, concatenated (drafts, then accepted tokens)
    positions: np.ndarray  # the positions of what the row feeds (plan masks, then the chosen slots' tokens)
    starts: np.ndarray  # where each chosen slot starts in ``tokens`` (one more: the end)
    accepted: np.ndarray  # per branch: tokens accepted
    cached: np.ndarray  # per branch: tokens whose keys/values it keeps from earlier rounds
    active: list[int]  # the branches still infilling
    stop: np.ndarray  # per finished branch: the tokens it commits
    cutoff: int | None  # the branch an accepted EOS ended (the later ones are dropped)
    order: list[int]

    def __init__(self, session: Any):
        self.session = session
        partition = session.partition
        cache = session.cache  # a reused prefix is encoded already: the rest of the prompt is pending
        self.prompt: np.ndarray | None = cache.tokens[cache.encoded :].numpy().copy()
        self.context = cache.encoded  # columns of the row's cache (its committed entries)
        self.region = session.prompt_len  # the position of the generation region's first token
        self.offset = np.array([s.offset for s in partition.slots], dtype=np.int64)
        self.length = np.array([s.length for s in partition.slots], dtype=np.int64)
        self.blocks = [np.array(b, dtype=np.int64) for b in partition.blocks]
        self.block = 0
        self.open = np.array(session.open, dtype=bool)
        self.phase = PLAN
        self.order: list[int] = []  # the cache's tokens after the prompt, in commit order (region offsets)

    def used(self) -> int:
        """Buffer columns the row needs kept: its context, and while it infills branches their columns (the keys
        and values a branch keeps from its earlier rounds lie there)."""
        return self.context + (int(self.starts[-1]) if self.phase in (DRAFT, CHECK) else 0)

    def remaining(self) -> np.ndarray:
        """The open slots of the current block (advancing past finished blocks); empty when the row is done."""
        while self.block < len(self.blocks):
            block = self.blocks[self.block]
            left = block[self.open[block]]
            if len(left):
                return left
            self.block += 1
        return self.blocks[0][:0]


class PlanInfill(BatchedForm):
    """All live rows of equal plan-and-infill decoders, decided together (see the module docstring).

    It writes each session's tokens, ``commit_step``, ``committed``, ``sealed``, ``open`` as its iterations finish,
    and its cache when it finishes.
    """

    @classmethod
    def refuses(cls, decoder: Any, engine: Any, record: bool) -> str | None:
        return shared_reason(decoder, engine, record)

    @classmethod
    def key(cls, decoder: Any) -> Hashable:
        return (
            cls,
            hashable(decoder.selector),
            decoder.infiller,
            hashable(decoder.sample),
            bool(decoder.stop_at_eos),
        )

    def __init__(self, loop: Any, decoder: Any):
        super().__init__(loop, decoder)
        engine = self.engine
        self.selector = decoder.selector
        self.threshold = float(decoder.infiller.token_threshold)
        #: the infiller's arithmetic for token probabilities (:data:`~refusion.decoding.sampling.PRECISIONS`)
        self.precision = decoder.infiller.precision
        #: greedy drafts and float32 probabilities on refusion's fused head: one pass gives both
        self.fused = is_greedy(decoder.sample) and self.precision == "float32"
        #: the sampler draws: each row's drafts come from its own generator, in its program's calls
        self.draws = not deterministic(decoder.sample)
        #: the dtype of the drafts' confidences (known from the first plan; verification compares in it)
        self.confidence_dtype = torch.float32
        self.stop_at_eos = bool(decoder.stop_at_eos)
        self.mask = int(engine.model.mask_token_id)
        eos = sorted(engine.model.eos_token_ids)
        #: whether each token id is an EOS (ids past the table, e.g. out-of-vocabulary drafts, are not)
        self._is_eos: np.ndarray = np.zeros(max(eos, default=-1) + 1, dtype=bool)
        self._is_eos[eos] = True
        self.rows: list[_Row] = []
        self._step: tuple[_Batch, list[tuple[_Row, int]]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def sessions(self) -> list[Any]:
        return [row.session for row in self.rows]

    def admit(self, session: Any) -> None:
        """Add ``session``'s row (its engine state was just admitted: the prompt is pending)."""
        self.rows.append(_Row(session))

    def remove(self, session: Any) -> bool:
        for r, row in enumerate(self.rows):
            if row.session is session:
                del self.rows[r]
                return True
        return False

    # -- one step ------------------------------------------------------------------
    def feed(self, feed: Feed) -> None:
        """Each row's phase of the paper's iteration (its plan's masks, its verification, its branches)."""
        batch = _Batch(feed)
        fed: list[tuple[_Row, int]] = []  # each row that fed, with its phase
        for row in list(self.rows):
            phase = row.phase
            if phase == PLAN:
                try:
                    left = row.remaining()
                    width = checked_candidates(self.selector, (row.region + row.offset[left]).tolist())
                except Exception as error:  # the selector failed for this row: it alone leaves
                    self.loop.fail(row.session, error)
                    continue
                self._feed_plan(row, width, batch)
            elif phase == VERIFY:
                self._feed_verify(row, batch)
            else:
                self._feed_branches(row, batch)
            fed.append((row, phase))
        self._step = (batch, fed)

    def absorb(self, scores: Any, decisions: Any) -> None:
        """Decide every row that fed: selections for the planned ones (with the other forms' rows), acceptance for
        the verified and the infilled ones; report the rows that finished."""
        if self._step is None:
            return
        batch, fed = self._step
        self._step = None
        for row, pending in batch.encoded.items():
            row.context += pending
        answers = batch.answers(scores, self)  # the step's head pass and host read
        finished: list[_Row] = []
        for row, phase in fed:
            if phase == PLAN:
                self._ask(row, answers[id(row)], scores, decisions)
            elif phase == VERIFY:
                self._after_verify(row, answers.get(id(row)))
            elif phase == DRAFT:
                self._after_draft(row, answers.get(id(row)))
            elif phase == CHECK:
                self._after_check(row, answers.get(id(row)))
            if row.phase == PLAN and not len(row.remaining()):
                finished.append(row)
        self.engine.hold_columns([row.session.state for row, _ in fed], [row.used() for row, _ in fed])
        for row in finished:
            self._finish(row)

    # -- what each phase feeds ----------------------------------------------------
    def _feed_plan(self, row: _Row, width: int, batch: _Batch) -> None:
        left = row.remaining()
        row.planned = left[:width]
        positions: np.ndarray = _spans(row.offset[row.planned], row.length[row.planned]) + row.region
        pending = 0
        if row.prompt is not None:  # the first step encodes the prompt before the masks (it stays cached)
            pending = len(row.prompt)
            batch.feed(row, row.prompt, np.arange(row.context, row.context + pending), row.context, row.context)
            row.prompt = None
            batch.encoded[row] = pending
        # the masks: a causal chain after the context and the prompt
        masks: np.ndarray = np.full(len(positions), self.mask, dtype=np.int64)
        at = batch.feed(row, masks, positions, row.context + pending, row.context)
        row.positions, row.plan_at = positions, at
        batch.read(row, np.arange(at, at + len(positions)), plan=positions)

    def _feed_verify(self, row: _Row, batch: _Batch) -> None:
        at = batch.feed(row, row.tokens, row.positions, row.context, row.context)
        if len(row.tokens) > 1:  # the row of token j scores token j + 1
            batch.read(row, np.arange(at, at + len(row.tokens) - 1), row.tokens[1:])

    def _feed_branches(self, row: _Row, batch: _Batch) -> None:
        drafting = row.phase == DRAFT
        for b in row.active:
            a, z = int(row.starts[b]), int(row.starts[b + 1])
            cached, accepted = int(row.cached[b]), int(row.accepted[b])
            if drafting and accepted >= z - a:
                continue
            tokens = row.tokens[a + cached : z].copy()
            if drafting:
                tokens[accepted - cached :] = self.mask
            at = batch.feed(row, tokens, row.positions[a + cached : z], row.context + a + cached, row.context + a)
            if drafting:  # the masks predict their own positions
                batch.read(row, np.arange(at + accepted - cached, at + z - a - cached))
            elif accepted + 1 < z - a:  # the tokens after the forced one, each scored by the row before it
                index = np.arange(at + accepted - cached, at + z - a - cached - 1)
                batch.read(row, index, row.tokens[a + accepted + 1 : z])

    # -- what each phase decides --------------------------------------------------
    def _ask(self, row: _Row, answer: tuple, scores: Any, decisions: Any) -> None:
        """Ask for the planned row's choice (decided with every other row that uses the selector)."""
        top, confidence = answer[:2]
        lengths = row.length[row.planned]
        starts = np.concatenate(([0], np.cumsum(lengths)))
        drafted = (top, confidence, starts, row.positions)
        firsts = confidence[torch.from_numpy(starts[:-1])]
        decisions.select(
            self.selector,
            lambda: self._plan(row, drafted, scores),
            lambda chosen: self._chosen(row, drafted, chosen),
            lambda error: self.loop.fail(row.session, error),
            first_confidence=firsts,
            length=len(firsts),
        )

    def _chosen(self, row: _Row, drafted: tuple, picked: tuple[int, ...]) -> None:
        """The chosen slots' drafts go to global verification."""
        top, _, starts, _ = drafted
        slots = row.planned[list(picked)]
        row.chosen = slots
        row.tokens = np.concatenate([top[starts[j] : starts[j + 1]] for j in picked])
        row.positions = _spans(row.offset[slots], row.length[slots]) + row.region
        row.starts = np.concatenate(([0], np.cumsum(row.length[slots])))
        row.phase = VERIFY

    def _after_verify(self, row: _Row, answer: Any) -> None:
        """Global verification: commit the accepted prefix's EOS or whole slots, else infill in parallel."""
        n = len(row.tokens)
        accept: np.ndarray = np.ones(n, dtype=bool)
        if answer is not None:
            accept[1:] = answer[2]
        accept[row.starts[:-1]] = True
        prefix = _leading(accept)
        eos = self._first_eos(row.tokens[:prefix])
        if eos is not None:
            cut = eos + 1
        else:
            cut = int(row.starts[np.searchsorted(row.starts, prefix, side="right") - 1])
        if cut:
            self._commit(row, cut)
            return
        k = len(row.chosen)
        row.accepted = _leading_per_run(accept, row.starts)
        row.cached = np.zeros(k, dtype=np.int64)
        row.active = list(range(k))
        row.stop = np.zeros(k, dtype=np.int64)  # tokens each finished branch commits (0: not finished)
        row.cutoff = None
        lengths = np.diff(row.starts)
        row.phase = DRAFT if (row.accepted < lengths).any() else CHECK

    def _after_draft(self, row: _Row, answer: Any) -> None:
        """The drafting branches' unaccepted tokens are the masks' predictions."""
        top = answer[0]
        at = 0
        for b in row.active:
            a, z = row.starts[b], row.starts[b + 1]
            accepted = row.accepted[b]
            if accepted >= z - a:
                continue
            n = z - a - accepted
            row.tokens[a + accepted : z] = top[at : at + n]
            at += n
        row.phase = CHECK

    def _after_check(self, row: _Row, answer: Any) -> None:
        """Each branch accepts its first unaccepted token and every following one above the threshold."""
        at = 0
        still, cutoff = [], None
        for b in row.active:
            if cutoff is not None:
                break  # the branches after an EOS accepted in this round are dropped
            a, z = row.starts[b], row.starts[b + 1]
            length, accepted = z - a, int(row.accepted[b])
            if accepted < length:
                nxt = accepted + 1
                if nxt < length:
                    above = answer[3][at : at + length - nxt]
                    at += length - nxt
                    nxt += _leading(above)
                row.accepted[b] = accepted = nxt
            eos = self._first_eos(row.tokens[a : a + accepted])
            if eos is None and accepted < length:
                row.cached[b] = accepted - 1
                still.append(b)
                continue
            row.stop[b] = length if eos is None else eos + 1
            if eos is not None:
                cutoff = b
                row.cutoff = b if row.cutoff is None else min(row.cutoff, b)
        row.active = still
        if row.active:
            row.phase = DRAFT
            return
        last = row.cutoff if row.cutoff is not None else len(row.chosen) - 1
        kept = row.stop[: last + 1]
        # the branches up to the last kept one are full but the last: their tokens are one run of columns
        tokens = np.concatenate([row.tokens[row.starts[b] : row.starts[b] + kept[b]] for b in range(last + 1)])
        positions = np.concatenate([row.positions[row.starts[b] : row.starts[b] + kept[b]] for b in range(last + 1)])
        row.tokens, row.positions, row.chosen = tokens, positions, row.chosen[: last + 1]
        row.starts = np.concatenate(([0], np.cumsum(kept)))
        self._commit(row, len(tokens))

    def _first_eos(self, tokens: np.ndarray) -> int | None:
        table = self._is_eos
        if not len(table) or not len(tokens):
            return None
        hits = table[np.minimum(tokens, len(table) - 1)] & (tokens < len(table))
        return int(hits.argmax()) if hits.any() else None

    def _commit(self, row: _Row, cut: int) -> None:
        """Commit the first ``cut`` of the row's concatenated chosen tokens (their keys/values already follow the
        context, in commit order): EOS applied, the session told, the next iteration planned."""
        session = row.session
        commits = []
        for j, slot in enumerate(row.chosen.tolist()):
            a = int(row.starts[j])
            if a >= cut:
                break
            commits.append((slot, a, min(int(row.starts[j + 1]), cut)))
        eos = self._first_eos(row.tokens[:cut]) if self.stop_at_eos else None
        if eos is not None:  # the answer ends there: its slot is cut after it, the later slots are dropped
            j = next(j for j, (_, a, z) in enumerate(commits) if a <= eos < z)
            slot, a, _ = commits[j]
            first = int(row.offset[slot]) + eos - a
            session.eos_offset = first if session.eos_offset is None else min(session.eos_offset, first)
            row.open &= row.offset <= first
            commits = commits[:j] + [(slot, a, eos + 1)]
            cut = eos + 1
        iteration = len(session.committed)
        slots = np.array([slot for slot, _, _ in commits], dtype=np.int64)
        kept = np.array([z - a for _, a, z in commits], dtype=np.int64)
        where = _spans(row.offset[slots], kept)  # the commits cover the chosen tokens' first `cut`, in order
        index = torch.from_numpy(where)
        session.tokens[index] = torch.from_numpy(row.tokens[:cut])
        session.commit_step[index] = iteration
        session.sealed[index] = True
        row.open[slots] = False
        for slot in slots.tolist():
            session.open[slot] = False
        row.order.extend(where.tolist())
        session.committed.append(tuple(zip(slots.tolist(), kept.tolist())))
        row.context += cut
        row.phase = PLAN

    def _plan(self, row: _Row, drafted: tuple, scores: Any) -> Plan:
        """Row ``r``'s :class:`Plan` (the per-sequence adapter: for selectors that read more than the stacked
        views, and for the checks of a plugin's answer)."""
        session = row.session
        top, confidence, starts, positions = drafted
        slots = tuple(session.partition.slots[i] for i in row.planned.tolist())
        rows = scores[torch.arange(row.plan_at, row.plan_at + len(positions))]
        tokens = torch.from_numpy(top)
        drafts = Drafts(rows, lambda s: (tokens, confidence), len(positions), lazy=False, exclude=self.mask)
        return Plan(
            slots,
            torch.from_numpy(positions),
            rows,
            tuple(starts.tolist()),
            session.rng,
            drafts,
            **session._where(),
        )

    # -- rows leaving ---------------------------------------------------------------
    def _finish(self, row: _Row) -> None:
        """The row is done: settle its session's cache, free its row, report its result to the loop."""
        session = row.session
        if session.eos_offset is not None:
            session.open = [False] * len(session.open)
        result = session.settled(torch.tensor(row.order, dtype=torch.long), row.context)
        self.remove(session)
        self.loop.finish(session, result)


def _leading(flags: np.ndarray) -> int:
    """How many of ``flags`` (boolean, 1-D) are true before the first false one."""
    if not len(flags):
        return 0
    first = int(flags.argmin())
    return len(flags) if flags[first] else first


def _leading_per_run(flags: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """:func:`_leading` of each run ``flags[starts[i]:starts[i + 1]]`` (runs not empty), in one pass."""
    n = len(flags)
    falses = np.where(flags, n, np.arange(n))
    return np.minimum(np.minimum.reduceat(falses, starts[:-1]), starts[1:]) - starts[:-1]


def _spans(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The region offsets of consecutive runs ``offsets[i] .. offsets[i] + lengths[i]``, one after another."""
    if len(lengths) == 1:
        return np.arange(offsets[0], offsets[0] + lengths[0])
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    return np.repeat(offsets - starts, lengths) + np.arange(total)


class _Batch:
    """What the form's rows feed in one step (runs of tokens added to the step's feed) and read (rows of the
    forward, per form row)."""

    def __init__(self, feed: Feed) -> None:
        self.feed_ = feed
        #: row, packed indices, targets, the plan's positions (a plan's drafts)
        self.reads: list[tuple[_Row, np.ndarray, np.ndarray | None, np.ndarray | None]] = []
        #: per row, the prompt tokens this step encodes (they stay cached)
        self.encoded: dict[_Row, int] = {}

    def feed(self, row: _Row, ids: np.ndarray, positions: np.ndarray, column: int, low: int) -> int:
        """Feed ``ids`` at ``positions`` into the row's columns ``column ..``, seeing its context and the columns
        ``low ..`` before each; returns the packed index of the first."""
        n = len(ids)
        columns = np.arange(column, column + n)
        spans: np.ndarray = np.zeros((n, 2, 2), dtype=np.int64)
        spans[:, 0, 1] = row.context
        spans[:, 1, 0] = low
        spans[:, 1, 1] = columns + 1
        state = row.session.state
        return self.feed_.add(self.feed_.lane(state, state.table), ids, positions, columns, spans)

    def read(
        self, row: _Row, index: np.ndarray, targets: np.ndarray | None = None, plan: np.ndarray | None = None
    ) -> None:
        """Read packed rows ``index`` for ``row``: their drafts (the sampler's tokens and confidences; ``plan``: the
        positions of a plan's masks, drawn as the program draws a plan), or ``targets``' probability."""
        self.reads.append((row, index, targets, plan))

    def answers(self, scores: Any, loop: PlanInfill) -> _Answers:
        """The rows read, decided in the decoder's arithmetic: each row's draft (the sampler's token, never the
        mask, and its confidence) and whether its target's probability is above ``token_threshold`` (compared in
        the confidences' dtype, as global verification compares, and in the probabilities' own, as a branch's
        check does). On the fused path one head pass gives both."""
        out = _Answers()
        if not self.reads:
            return out
        index = np.concatenate([r[1] for r in self.reads])
        targets = torch.from_numpy(
            np.concatenate([r[2] if r[2] is not None else np.full(len(r[1]), -1) for r in self.reads])
        )
        picked = scores[torch.from_numpy(index)]
        if loop.fused:
            tokens, confidence, probability = picked.read(loop.mask, targets)
            loop.confidence_dtype = confidence.dtype
        else:  # the sampler on the draft rows, the infiller's probability on the target rows
            n = len(index)
            tokens = torch.zeros(n, dtype=torch.long)
            confidence = torch.zeros(n, dtype=loop.confidence_dtype)
            probability = torch.zeros(n, dtype=torch.float64)
            wanted = targets >= 0
            drafts = (~wanted).nonzero().squeeze(-1)
            if len(drafts):
                top, conf = (
                    self._drawn(picked, loop)
                    if loop.draws
                    else apply_sampler(loop.decoder.sample, picked[drafts], loop.mask, None)
                )
                loop.confidence_dtype = conf.dtype
                confidence = confidence.to(conf.dtype)
                tokens[drafts], confidence[drafts] = top.cpu(), conf.cpu()
            if len(drafts) < n:
                rows = wanted.nonzero().squeeze(-1)
                p = token_probability(picked[rows], targets[rows], loop.precision).cpu()
                probability = probability.to(p.dtype)
                probability[rows] = p
        threshold = loop.threshold
        verified = (probability.to(loop.confidence_dtype) > threshold).cpu().numpy()
        checked = (probability > threshold).cpu().numpy()
        top, confidence = tokens.cpu().numpy(), confidence.cpu()
        at = 0
        for row, rows, *_ in self.reads:
            n = len(rows)
            out.add(id(row), top[at : at + n], confidence[at : at + n], verified[at : at + n], checked[at : at + n])
            at += n
        return out

    def _drawn(self, picked: Any, loop: PlanInfill) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft reads' tokens and confidences, each read drawn from its row's generator by the call its program
        makes: a plan's rows at once (:meth:`~refusion.decoding.session.DecodeSession.draw`), a branch's masks with
        the infiller's sampler (so a row draws what it draws alone, whatever the batch)."""
        tokens, confidences = [], []
        at = 0
        for row, rows, targets, plan in self.reads:
            n = len(rows)
            if targets is None:
                session = row.session
                scores = picked[at : at + n]
                top, conf = (
                    session.draw(scores, torch.from_numpy(plan))
                    if plan is not None
                    else session.sample(scores, loop.mask)
                )
                tokens.append(top.cpu())
                confidences.append(conf.cpu())
            at += n
        return torch.cat(tokens), torch.cat(confidences)


class _Answers(dict):
    """Per loop row, of the rows it read in order: ``(draft tokens, their confidences (a tensor), target above the
    threshold as verification compares, as a branch's check compares)``."""

    def add(self, row: int, *columns: Any) -> None:  # row: the id of the form's row
        if row in self:
            self[row] = tuple(
                torch.cat((a, b)) if isinstance(a, torch.Tensor) else np.concatenate((a, b))
                for a, b in zip(self[row], columns)
            )
        else:
            self[row] = columns
