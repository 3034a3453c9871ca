"""``BatchWorker``: one model and one continuous-batching :class:`~refusion.batcher.Batcher` running rows.

A worker turns raw input lines into result rows (:func:`refusion.batch.output.result_row`).
It is what the embedded run uses and what each Ray actor holds. Each row is
parsed and checked (:func:`refusion.batch.rows.parse_line`), its decoder built
from the worker's defaults overridden by the row's own fields (as
:func:`refusion.generate` would build it from the same keywords) and
submitted; a bad row yields its error row at once, a request that fails
yields one when it ends, and the run goes on. A row's tokens equal
``refusion.generate(prompt, model, gen_length=..., seed=..., **options)``
with the same options (continuous batching decodes each request as it would
alone).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from refusion.batch.output import result_row
from refusion.batch.rows import BatchRow, parse_line
from refusion.errors import ConfigError, RowError, renamed
from refusion.limits import prompt_chars

#: decoders built for distinct option sets, kept for reuse (rows usually share a few)
DECODER_CACHE = 64
#: keywords of the worker that are not decoder options
OWN_OPTIONS = ("gen_length", "chat", "allow_special")


def load(model: Any) -> Any:
    """The model adapter of ``model``: an adapter, a path, ``None`` (the shipped model) or a mapping of
    :data:`~refusion.models.loading.MODEL_OPTIONS` (what the command line's model flags give)."""
    from refusion.models.loading import load_from_options, load_model

    if isinstance(model, Mapping):
        return load_from_options(model)
    return load_model(model)


#: positions (prompts plus generation regions) a batch's live rows reserve at most unless told otherwise
DEFAULT_BATCH_TOKENS = 8192


class BatchWorker:
    """Runs batch rows on one model with continuous batching.

    ``model``: see :func:`load` (loaded once, here). ``runtime`` (a
    :class:`~refusion.config.runtime.RuntimeConfig`, or its fields as
    keywords): at most ``max_rows`` requests decode at once, reserving at most
    ``max_batch_tokens`` positions together (default 8192); a row needing more
    is an error row. ``decoder_options`` are
    every row's defaults, as :func:`refusion.generate` takes them
    (``preset``, part names, part parameters, sampling, ``seed``,
    ``gen_length``, ``chat``, ``allow_special``); a row's own fields override
    them. ``allow_imports`` lets rows name parts by ``"module:Class"`` path;
    ``prefix_cache`` and ``kv_memory`` are :class:`~refusion.batcher.Batcher`'s (``None``: rows
    reuse shared prompt prefixes where the engine can; keys/values take the engine's default budget).
    Bad defaults raise :class:`ConfigError` here, before any row is read.
    """

    def __init__(
        self,
        model: Any = None,
        *,
        runtime: Any = None,
        max_rows: int | None = None,
        max_batch_tokens: int | None = None,
        allow_imports: bool = False,
        prefix_cache: bool | None = None,
        kv_memory: int | None = None,
        **decoder_options: Any,
    ):
        from refusion.batcher import Batcher
        from refusion.config.runtime import RuntimeConfig

        #: what runs the rows and what the running batch may hold (a batch's default: 8192 positions reserved)
        self.runtime = RuntimeConfig.of(
            runtime if runtime is not None else RuntimeConfig(max_batch_tokens=DEFAULT_BATCH_TOKENS),
            max_rows=max_rows,
            max_batch_tokens=max_batch_tokens,
            prefix_cache=prefix_cache,
            kv_memory=kv_memory,
        )
        self.model = load(model)
        options = dict(decoder_options)
        self.gen_length = options.pop("gen_length", None)
        self.chat = options.pop("chat", None)
        self.allow_special = bool(options.pop("allow_special", False))
        self.allow_imports = allow_imports
        if self.chat:
            from refusion.prompts import check_chat

            check_chat(self.model.tokenizer)
        self.defaults = {k: v for k, v in options.items() if v is not None}
        self.batcher = Batcher(
            self.model, runtime=self.runtime, **{k: v for k, v in self.defaults.items() if k != "seed"}
        )
        rows = self.runtime.max_rows
        self.lookahead = rows + max(1, rows // 2)  # the live rows and a small queue to refill from
        self._decoders: OrderedDict[str, tuple[Any, int | None]] = OrderedDict()

    # -- one row ---------------------------------------------------------------------
    def decoder(self, options: Mapping[str, Any]) -> tuple[Any, int | None]:
        """``(decoder, its preset's gen_length)`` for merged decoder ``options`` (built once per distinct set)."""
        from refusion.api import build_decoder

        try:
            key = json.dumps(options, sort_keys=True, default=repr)
        except (TypeError, ValueError):
            key = None
        if key is not None and key in self._decoders:
            self._decoders.move_to_end(key)
            return self._decoders[key]
        built = build_decoder(self.model, **options)
        if key is not None:
            self._decoders[key] = built
            if len(self._decoders) > DECODER_CACHE:
                self._decoders.popitem(last=False)
        return built

    def prompt_ids(self, row: BatchRow) -> list[int]:
        """The row's prompt as token ids: text encoded (with the chat template if the defaults say ``chat``), ids as
        they are, ``messages`` through the tokenizer's chat template (none: an error naming ``messages``).

        Text (all messages together) longer than
        :func:`~refusion.limits.prompt_chars` of the model's positions is refused before it is tokenised.
        """
        from refusion.prompts import check_encodable, check_no_special_text, encode_prompt

        tokenizer = self.model.tokenizer
        field = "messages" if row.chat else "prompt"
        size = (
            sum(len(m["content"]) for m in row.prompt)
            if row.chat
            else len(row.prompt)
            if isinstance(row.prompt, str)
            else 0
        )
        bound = prompt_chars(getattr(self.model, "max_positions", None))
        if bound is not None and size > bound:
            raise ConfigError(
                f"`{field}` holds {size} characters of text; this model's {self.model.max_positions} "
                f"positions take at most {bound} (checked before tokenising).",
                param=field,
            )
        if not row.chat:
            return encode_prompt(row.prompt, tokenizer, self.chat, allow_special=self.allow_special)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "`messages` need a tokenizer with a chat template, and this model's has none; give the "
                "row a `prompt` instead.",
                param="messages",
            )
        for i, message in enumerate(row.prompt):
            field = f"messages[{i}].content"
            check_encodable(message["content"], field)
            if not self.allow_special:
                check_no_special_text(message["content"], tokenizer, field)
        ids = tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def submit(self, row: BatchRow) -> Any:
        """Queue ``row`` on the batcher; its :class:`~refusion.batcher.Request`. Raises :class:`ConfigError`."""
        from refusion.api import fit_default_length
        from refusion.config.spec import DEFAULT_GEN_LENGTH

        options = {**self.defaults, **row.options}
        gen_length = options.pop("gen_length", self.gen_length)
        seed = options.pop("seed", None)
        decoder, preset_length = self.decoder(options)
        ids = self.prompt_ids(row)
        if gen_length is None:  # as refusion.generate chooses it
            gen_length = fit_default_length(decoder, self.model, [ids], preset_length or DEFAULT_GEN_LENGTH)
        return self.batcher.submit(ids, decoder=decoder, gen_length=gen_length, seed=seed)

    # -- many rows -------------------------------------------------------------------
    def run(self, lines: Iterable[tuple[int, str]]) -> Iterator[dict]:
        """Result rows of ``(line number, raw JSON text)`` pairs, in order of completion.

        Lines are read only as rows finish (at most ``max_rows`` live plus a
        small queue). Each line is handled on its own: ids are not compared
        across lines (the caller skips done ids and refuses duplicates).
        Closing the iterator early cancels the rows still decoding.
        """
        pending = iter(lines)
        live: dict[Any, tuple[str, int]] = {}  # request -> (row id, line)
        exhausted = False
        try:
            while True:
                while not exhausted and len(live) < self.lookahead:
                    try:
                        number, text = next(pending)
                    except StopIteration:
                        exhausted = True
                        break
                    try:
                        row = parse_line(text, number, allow_imports=self.allow_imports)
                    except RowError as error:
                        yield result_row(error.row_id, number, error=error)
                        continue
                    try:
                        live[self.submit(row)] = (row.id, number)
                    except ConfigError as error:
                        yield result_row(row.id, number, error=row_error(error, row))
                if not live:
                    if exhausted:
                        return
                    continue
                finished = [event for event in self.batcher.step() if event.finished]
                for event in finished:
                    row_id, line = live.pop(event.request)
                    if event.error is not None:
                        yield result_row(row_id, line, error=event.error)
                    elif event.result is None:
                        yield result_row(row_id, line, error="row: cancelled")
                    else:
                        yield result_row(row_id, line, event.result)
                if not finished and self.batcher.idle():  # nothing queued or decoding: what is left is stuck
                    for request, (row_id, line) in list(live.items()):
                        del live[request]
                        yield result_row(row_id, line, error=f"row: request stopped as {request.status!r}")
        finally:
            for request in live:
                request.cancel()

    def close(self) -> None:
        """Cancel what is still queued or decoding and release the batcher."""
        self.batcher.close(drain=False)

    def __enter__(self) -> BatchWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: names the decoder gives a row's inputs -> the row field each comes from
DECODER_NAMES = {"prompt_ids": "prompt"}


def row_error(error: ConfigError, row: BatchRow) -> ConfigError:
    """``error`` naming the row's own field: the decoder's ``prompt_ids`` is the row's ``prompt`` (``messages`` for
    a chat row)."""
    if error.param in DECODER_NAMES:
        return renamed(error, {error.param: "messages" if row.chat else DECODER_NAMES[error.param]})
    return error
