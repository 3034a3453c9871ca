"""``run_batch``: a JSON Lines input through one :class:`~refusion.batch.worker.BatchWorker` (or Ray) to an output
that a rerun resumes.

The input is read line by line; a row whose id is already in the output is
skipped, a second row with the same id is an error row (id ``line-N``), the
rest go to the worker (embedded, in this process) or, with ``ray``, to
:func:`refusion.batch.ray_data.run_on_ray`. Result rows are appended as they
finish, each as one whole line; a progress bar on stderr shows rows and
tokens per second of generation, as the summary does. Options and the output
are checked before the model loads, and nothing is loaded when every row is
already in the output.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from refusion.batch.lines import count_pending, input_lines, is_dataset, pending_lines
from refusion.batch.output import ResultWriter, check_output
from refusion.errors import ConfigError
from refusion.limits import DEFAULT_MAX_ROWS, MAX_GEN_LENGTH, MAX_KV_MEMORY
from refusion.validators import check_boolean, check_integer, check_number


@attrs.frozen
class BatchSummary:
    """What a run did: rows written (``errors`` of them error rows), rows ``skipped`` as already in the output,
    tokens generated, the ``seconds`` it took in all and the ``load_seconds`` of those spent loading the model
    (0 when nothing was left to run)."""

    rows: int
    skipped: int
    errors: int
    tokens: int
    seconds: float
    load_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of generation (the model's loading left out), as the progress bar shows them."""
        busy = self.seconds - self.load_seconds
        return self.tokens / busy if busy > 0 else 0.0


#: Python keyword -> how errors name it (the command line passes its flags' spellings)
NAMES = {
    "input": "input",
    "out": "out",
    "max_rows": "max_rows",
    "max_batch_tokens": "max_batch_tokens",
    "workers": "workers",
    "gpus_per_worker": "gpus_per_worker",
    "cpus_per_worker": "cpus_per_worker",
    "gen_length": "gen_length",
    "prefix_cache": "prefix_cache",
    "kv_memory": "kv_memory",
}


def check_paths(input_path: Any, output_path: Any, names: dict | None = None) -> None:
    """The input is a readable file; the output can hold results and is not the input
    (:func:`~refusion.batch.output.check_output`). Nothing is opened for writing."""
    names = names or NAMES
    file_input = isinstance(input_path, (str, os.PathLike))
    if file_input:
        source = Path(input_path)
        if not source.is_file():
            why = "is a directory" if source.is_dir() else "does not exist"
            raise ConfigError(
                f"`{names['input']}` {str(source)!r} {why}; give a JSON Lines file.", param=names["input"]
            )
        if not os.access(source, os.R_OK):
            raise ConfigError(
                f"`{names['input']}` {str(source)!r} cannot be read (permission denied).", param=names["input"]
            )
    check_output(output_path, input_path if file_input else None, param=names["out"])


def check_options(
    input_path: Any,
    output_path: Any,
    *,
    model: Any,
    ray: str | None,
    max_rows: int,
    max_batch_tokens: int,
    workers: int,
    gpus_per_worker: float,
    cpus_per_worker: float,
    prefix_cache: bool | None = None,
    kv_memory: int | None = None,
    names: dict | None = None,
    **decoder_options: Any,
) -> None:
    """Every option checked before the model loads: numbers in range, Ray's only with ``ray``, paths usable, the
    default decoder buildable."""
    from refusion.api import build_decoder
    from refusion.models.checks import check_model_path

    shown = names or NAMES
    check_integer(shown["max_rows"], max_rows, 1)
    check_integer(shown["max_batch_tokens"], max_batch_tokens, 1)
    check_integer(shown["workers"], workers, 1)
    check_number(shown["gpus_per_worker"], gpus_per_worker, 0)
    check_number(shown["cpus_per_worker"], cpus_per_worker, 0, low_open=True)
    if prefix_cache is not None:
        check_boolean(shown.get("prefix_cache", "prefix_cache"), prefix_cache)
    if kv_memory is not None:
        check_integer(shown.get("kv_memory", "kv_memory"), kv_memory, 1, MAX_KV_MEMORY, "bytes")
    if ray is None:
        for name, value, default in (
            ("workers", workers, 1),
            ("gpus_per_worker", gpus_per_worker, 0),
            ("cpus_per_worker", cpus_per_worker, 1),
        ):
            if value != default:
                raise ConfigError(
                    f"`{shown[name]}` applies only to a run on Ray (`ray=`, `--ray`); "
                    "an embedded run has one batcher in this process.",
                    param=shown[name],
                )
    if ray is not None and not isinstance(ray, str):
        raise ConfigError(f"`ray` must be None, 'local' or a Ray address; got {ray!r}.", param="ray")
    if decoder_options.get("gen_length") is not None:
        check_integer(shown["gen_length"], decoder_options["gen_length"], 1, MAX_GEN_LENGTH)
    path = model.get("model") if isinstance(model, Mapping) else model
    if isinstance(path, (str, os.PathLike)):
        check_model_path(str(path))
    check_paths(input_path, output_path, names)
    build_decoder(
        None,
        **{
            k: v
            for k, v in decoder_options.items()
            if k not in ("gen_length", "chat", "allow_special") and v is not None
        },
    )


def run_batch(
    input_path: Any,
    output_path: str | os.PathLike,
    *,
    model: Any = None,
    ray: str | None = None,
    workers: int = 1,
    gpus_per_worker: float = 0,
    cpus_per_worker: float = 1,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_batch_tokens: int = 8192,
    allow_imports: bool = False,
    progress: bool = True,
    names: dict | None = None,
    prefix_cache: bool | None = None,
    kv_memory: int | None = None,
    **decoder_options: Any,
) -> BatchSummary:
    """Generate for every row of ``input_path`` into ``output_path``; a :class:`BatchSummary`.

    ``input_path``: a JSON Lines file, a list of row objects or (with Ray) a
    ``ray.data.Dataset`` of ``{"line": str}`` or row objects. ``model``: a
    path, ``None`` (the shipped model), a mapping of model options or (embedded
    only) a loaded adapter. ``decoder_options`` are every row's defaults (see
    :class:`~refusion.batch.worker.BatchWorker`), ``gen_length`` (alias
    ``max_tokens``) included. At most ``max_rows`` rows decode at once,
    reserving at most ``max_batch_tokens`` positions together; rows whose
    prompts start alike reuse the keys/values of the prefix they share unless
    ``prefix_cache`` is ``False``; ``kv_memory`` bounds the bytes of keys/values
    (a row waits until the pages it may need are free; default: from the device). ``ray`` (an
    address, or ``"local"``) runs the rows on Ray Data with ``workers`` actors
    of ``gpus_per_worker``/``cpus_per_worker`` each. Rows already in the output
    are skipped, so a rerun resumes (and loads no model when nothing is left);
    ``KeyboardInterrupt`` stops the run with every written line whole.
    ``names`` maps keywords to the spellings errors use (the command line's
    flags).
    """
    if "max_tokens" in decoder_options:  # OpenAI's and vLLM's name for the tokens to generate
        if decoder_options.get("gen_length") is not None:
            raise ConfigError("Give `gen_length` or its alias `max_tokens`, not both.", param="max_tokens")
        decoder_options["gen_length"] = decoder_options.pop("max_tokens")
    dataset = is_dataset(input_path)
    if dataset and ray is None:
        ray = "local"
    check_options(
        input_path,
        output_path,
        model=model,
        ray=ray,
        max_rows=max_rows,
        max_batch_tokens=max_batch_tokens,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        prefix_cache=prefix_cache,
        kv_memory=kv_memory,
        names=names,
        **decoder_options,
    )
    from refusion.config.runtime import RuntimeConfig

    runtime = RuntimeConfig(  # checked above with the caller's spellings; one value from here on
        max_rows=max_rows, max_batch_tokens=max_batch_tokens, prefix_cache=prefix_cache, kv_memory=kv_memory
    )
    worker_options = dict(runtime=runtime, allow_imports=allow_imports, **decoder_options)
    start = time.monotonic()
    counts = {"rows": 0, "skipped": 0, "errors": 0, "tokens": 0}
    load_seconds = 0.0
    with ResultWriter(
        output_path, input_path if isinstance(input_path, (str, os.PathLike)) else None, param=(names or NAMES)["out"]
    ) as writer:
        early: deque = deque()
        lines = None if dataset else pending_lines(input_lines(input_path), writer.done, early, counts)
        total = None if dataset else count_pending(input_path, writer.done)
        if total == 0:  # nothing left to run: no model to load
            for _ in lines or ():  # counts the rows skipped
                pass
            return BatchSummary(0, counts["skipped"], 0, 0, time.monotonic() - start)
        bar = progress_bar(total, progress)
        worker = None
        rows: Iterator[dict]
        try:
            if ray is not None:
                from refusion.batch.ray_data import run_on_ray

                rows = run_on_ray(
                    input_path,
                    writer,
                    lines,
                    workers=workers,
                    gpus_per_worker=gpus_per_worker,
                    cpus_per_worker=cpus_per_worker,
                    address=ray,
                    model=model,
                    worker_options=worker_options,
                    progress=progress,
                )
            else:
                from refusion.batch.worker import BatchWorker

                worker = BatchWorker(model, **worker_options)
                rows = worker.run(lines or ())
            loaded = time.monotonic()
            load_seconds = loaded - start
            record = recorder(writer, counts, bar, loaded)  # tokens/s counted once the model is loaded
            try:
                for row in rows:
                    while early:
                        record(early.popleft())
                    record(row)
                while early:
                    record(early.popleft())
            finally:
                close = getattr(rows, "close", None)
                if close is not None:
                    close()
        finally:
            if worker is not None:
                worker.close()
            bar.close()
    return BatchSummary(
        counts["rows"], counts["skipped"], counts["errors"], counts["tokens"], time.monotonic() - start, load_seconds
    )


def recorder(writer: ResultWriter, counts: dict, bar: Any, start: float) -> Callable[[dict], None]:
    """A function that writes one result row, counts it and advances the progress bar."""

    def record(row: dict) -> None:
        if not writer.write(row):
            return
        counts["rows"] += 1
        if row.get("error") is not None:
            counts["errors"] += 1
        counts["tokens"] += len(row.get("tokens") or ())
        elapsed = time.monotonic() - start
        bar.update(1)
        bar.set_postfix_str(
            f"{counts['tokens'] / elapsed if elapsed > 0 else 0:.1f} tok/s, {counts['errors']} errors", refresh=False
        )

    return record


def progress_bar(total: int | None, show: bool) -> Any:
    """A tqdm bar on stderr counting rows (disabled when not ``show``)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not show, unit="row", desc="batch", dynamic_ncols=True, leave=True)
