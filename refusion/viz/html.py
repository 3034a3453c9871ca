"""One self-contained HTML page of a decode: the commit grid, a slider over iterations, the trace table.

``render_html(result, path)`` writes a single file (inline CSS and a few
lines of inline JavaScript, no external resource, no server): the generation
region slot by slot, each token coloured by the iteration that committed it;
a slider shows the region as it stood after each iteration; below, one table
row per iteration (block, planned, drafted slots with their confidence,
selected, committed tokens, forwards and query tokens per forward, cache
entries and key/value bytes, wall time). Works on fresh results and on
results read from a trace file (:func:`refusion.measure.trace.read_trace`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from refusion.decoding.types import DecodeResult
from refusion.viz.plot import HTML_FORMATS, checked_output, token_labels
from refusion.wording import counted

#: colour ramp for iterations (dark blue -> green -> yellow, like matplotlib's viridis)
_RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def _colour(step: int, steps: int) -> str:
    x = step / max(steps - 1, 1) * (len(_RAMP) - 1)
    i = min(int(x), len(_RAMP) - 2)
    t = x - i
    r, g, b = (round(a + (b - a) * t) for a, b in zip(_RAMP[i], _RAMP[i + 1]))
    return f"rgb({r},{g},{b})"


def _grid(result: DecodeResult, labels: list[str]) -> str:
    steps = max(result.num_iterations, 1)
    commit_step = result.commit_step.tolist()
    out = []
    for slot in result.partition.slots:
        cells = []
        for j in range(slot.length):
            pos = slot.offset + j
            step = commit_step[pos]
            if step < 0:
                cells.append('<span class="cell never" title="never committed"></span>')
                continue
            ink = "#fff" if step / max(steps - 1, 1) < 0.6 else "#000"
            title = f"position {result.prompt_length + pos}, iteration {step}"
            cells.append(
                f'<span class="cell" data-step="{step}" style="background:{_colour(step, steps)};color:{ink}" '
                f'title="{title}">{html.escape(labels[pos])}</span>'
            )
        out.append(f'<span class="slot" title="slot {slot.index}, block {slot.block}">{"".join(cells)}</span>')
    return "".join(out)


def _table(result: DecodeResult, labels: list[str]) -> str:
    rows = []
    slots = result.partition.slots
    for s in result.iterations:
        conf = dict(zip(s.drafted, s.confidence))
        drafted = ", ".join(f"{i}" + (f" ({conf[i]:.2f})" if i in conf else "") for i in s.drafted) or "-"
        committed = "; ".join(
            f"{i}: " + html.escape("".join(labels[slots[i].offset : slots[i].offset + n])) for i, n in s.committed
        )
        cells = (
            s.iteration,
            s.block,
            ", ".join(map(str, s.planned)),
            drafted,
            ", ".join(map(str, s.selected)),
            committed,
            s.forwards,
            " + ".join(map(str, s.fed_tokens)) or "-",
            f"{s.kv_appended} / {s.kv_pending} / {s.kv_encoded} / {s.kv_invalidated}",
            f"{s.kv_copied_bytes:,} / {s.kv_written_bytes:,}",
            f"{s.seconds * 1000:.1f}",
        )
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = (
        "iteration",
        "block",
        "planned",
        "drafted (confidence)",
        "selected",
        "committed",
        "forwards",
        "query tokens per forward",
        "cache: with KV / pending / encoded / invalidated",
        "KV bytes copied / written",
        "ms",
    )
    return (
        "<table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.grid{display:flex;flex-wrap:wrap;gap:6px;margin:1em 0}
.slot{display:inline-flex;border:1px solid #000;padding:1px}
.cell{display:inline-block;width:1.9em;height:1.6em;line-height:1.6em;text-align:center;font:12px monospace;margin:1px}
.cell.never{background:#e0e0e0}.cell.hidden{background:#e0e0e0!important;color:transparent!important}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
"""

_SCRIPT = """
const slider=document.getElementById('upto'),shown=document.getElementById('shown');
function show(){const k=+slider.value;shown.textContent=k<+slider.max?'after iteration '+k:'all iterations';
document.querySelectorAll('.cell[data-step]').forEach(c=>c.classList.toggle('hidden',+c.dataset.step>k));}
slider.addEventListener('input',show);show();
"""


def render_html(result: DecodeResult, path: str | Path, *, tokenizer: Any = None, title: str | None = None) -> Path:
    """Write the self-contained HTML view of ``result`` to ``path``; return the path. Reads ``result`` only."""
    out, _ = checked_output(result, path, "path", HTML_FORMATS)
    labels = token_labels(result, tokenizer)
    steps = result.num_iterations
    heading = title or (
        f"{counted(len(result.partition.slots), 'slot')}, {counted(steps, 'iteration')}, "
        f"{counted(result.forwards, 'forward')}, "
        f"{result.tokens_per_forward:.2f} tokens/forward"
    )
    text = "" if result.text is None else f"<p>answer: <code>{html.escape(result.text)}</code></p>"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title><style>{_STYLE}</style></head>
<body><h2>{html.escape(heading)}</h2>{text}
<label>iteration <input type="range" id="upto" min="0" max="{max(steps - 1, 0)}" value="{max(steps - 1, 0)}">
<span id="shown"></span></label>
<div class="grid">{_grid(result, labels)}</div>
{_table(result, labels)}
<script>{_SCRIPT}</script></body></html>
"""
    out.write_text(page, encoding="utf-8")
    return out
