"""Pictures of a decode: when each position of the answer was committed.

``render_png(result, path)`` draws the generation region as rows of slots;
each cell shows its token and is coloured by the iteration that committed it,
like the figure that explains ReFusion. ``render_gif(result, path)`` animates
the same, one frame per iteration (committed cells appear, masks stay grey).
Both need matplotlib and Pillow (``pip install refusion[viz]``).
``render_html(result, path)`` (:mod:`refusion.viz.html`, no extra
dependency) writes one self-contained page with the same grid, a slider over
the iterations and the per-iteration trace. A result read from a trace file
(:func:`refusion.measure.trace.read_trace`) draws like a fresh one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from refusion.decoding.types import DecodeResult
from refusion.errors import ConfigError
from refusion.wording import counted


def token_labels(result: DecodeResult, tokenizer: Any) -> list[str]:
    """Each position's label: its token's text (``tokenizer``, else the trace's ``pieces``, else the id), "" where
    nothing was committed; one pass over the generation region."""
    pieces = result.pieces or {}
    eos = int(result.tokens[-1]) if result.stopped_at_eos and len(result.tokens) else None
    tokenizer_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    labels = []
    for i, (step, token) in enumerate(zip(result.commit_step.tolist(), result.region())):
        if step < 0:
            labels.append("")
            continue
        if tokenizer is not None:
            text = "EOS" if token == tokenizer_eos else tokenizer.decode([token])
        else:
            text = "EOS" if token == eos else pieces.get(i, str(token))
        labels.append({" ": "␣", "": "∅"}.get(text, text)[:4])
    return labels


def _figure(result: DecodeResult, tokenizer: Any, upto: int | None, title: str | None):
    """A matplotlib Figure of its own (no pyplot state, no backend switch for the caller)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    slots = result.partition.slots
    width = max(s.length for s in slots)
    per_row = max(1, min(len(slots), 64 // width))
    rows = -(-len(slots) // per_row)
    steps = max(result.num_iterations, 1)
    cmap = colormaps["viridis"]
    norm = Normalize(vmin=0, vmax=max(steps - 1, 1))
    labels = token_labels(result, tokenizer)
    commit_step = result.commit_step.tolist()
    fig = Figure(figsize=(max(4.0, 0.32 * per_row * width + 1.5), 0.45 * rows + 1.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for slot in slots:
        r, c = divmod(slot.index, per_row)
        x0 = c * width
        for j in range(slot.length):
            pos = slot.offset + j
            step = commit_step[pos]
            shown = step >= 0 and (upto is None or step <= upto)
            face = cmap(norm(step)) if shown else (0.88, 0.88, 0.88, 1.0)
            ax.add_patch(Rectangle((x0 + j, -r), 0.96, 0.9, facecolor=face, edgecolor="white"))
            if shown:
                ax.text(
                    x0 + j + 0.48,
                    -r + 0.45,
                    labels[pos],
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if norm(step) < 0.6 else "black",
                )
        ax.add_patch(Rectangle((x0 - 0.02, -r - 0.02), slot.length, 0.94, fill=False, edgecolor="black", lw=0.8))
    ax.set_xlim(-0.2, per_row * width + 0.2)
    ax.set_ylim(-rows + 0.9, 1.1)
    ax.axis("off")
    sm = ScalarMappable(cmap=cmap, norm=norm)
    fig.colorbar(sm, ax=ax, fraction=0.03, pad=0.01, label="iteration")
    done = "all" if upto is None else f"{upto + 1}/{steps}"
    ax.set_title(
        title
        or f"{counted(len(slots), 'slot')}, {counted(steps, 'iteration')} ({done}), "
        f"{counted(result.forwards, 'forward')}, "
        f"{result.tokens_per_forward:.2f} tokens/forward",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


#: picture formats by file suffix (``render_png`` writes the one its path names)
IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}
GIF_FORMATS = {".gif": "gif"}
HTML_FORMATS = {".html": "html", ".htm": "html"}


def check_output_path(path: Any, param: str = "path", formats: dict[str, str] = IMAGE_FORMATS) -> str:
    """The format ``path``'s suffix names; a ConfigError for another suffix or a missing/unwritable directory.

    Checks only; writes nothing (the CLI calls it before decoding).
    """
    import os

    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"`{param}` must be a file path; got {path!r}.", param=param)
    out = Path(path)
    fmt = formats.get(out.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"`{param}` {str(path)!r} must end in one of {', '.join(formats)} (the format is taken from the suffix).",
            param=param,
        )
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(
            f"`{param}` {str(path)!r}: the directory {str(parent)!r} does not exist; create it first.", param=param
        )
    if out.is_dir():
        raise ConfigError(f"`{param}` {str(path)!r} is a directory; name a file in it.", param=param)
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"`{param}` {str(path)!r}: the directory {str(parent)!r} is not writable.", param=param)
    return fmt


def checked_output(result: Any, path: Any, param: str, formats: dict[str, str]) -> tuple[Path, str]:
    if not isinstance(result, DecodeResult):
        raise ConfigError(f"`result` must be a DecodeResult; got {type(result).__name__}.", param="result")
    return Path(path), check_output_path(path, param, formats)


def render_png(result: DecodeResult, path: str | Path, *, tokenizer: Any = None, title: str | None = None) -> Path:
    """Write the commit picture of ``result`` to ``path`` and return it.

    The format follows the suffix: PNG for ``.png`` (also JPEG, SVG or PDF for
    ``.jpg``/``.jpeg``, ``.svg``, ``.pdf``); another suffix or a missing
    directory is a ConfigError before anything is drawn.
    """
    out, fmt = checked_output(result, path, "path", IMAGE_FORMATS)
    _figure(result, tokenizer, None, title).savefig(out, format=fmt)
    return out


def render_gif(result: DecodeResult, path: str | Path, *, tokenizer: Any = None, ms_per_frame: int = 600) -> Path:
    """Write an animated GIF of ``result``, one frame per iteration; return the path."""
    import io

    from PIL import Image

    out, _ = checked_output(result, path, "path", GIF_FORMATS)
    frames = []
    for step in range(max(result.num_iterations, 1)):
        buf = io.BytesIO()
        _figure(result, tokenizer, step, None).savefig(buf, format="png")
        frames.append(Image.open(io.BytesIO(buf.getvalue())).convert("P", palette=Image.Palette.ADAPTIVE))
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=ms_per_frame, loop=0)
    return out
