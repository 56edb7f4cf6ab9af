"""Evaluation report: accuracy-vs-cost Pareto plot, a self-contained HTML page and a Markdown summary.

The HTML embeds every plot as a base64 PNG and every table inline, so it is one file: the Kubeflow UI
shows it through kfp's HTML artifact, and a person can mail it around. The Markdown is the short
version for the UI's Markdown viewer, a CI log or an issue comment.

Rows are evaluation summaries (``lemon_core.evaluate.EvalSummary`` or the same fields as a dict):
benchmark, method, n, accuracy, mean_cost_usd, mean_tokens, mean_latency_s, failures. A method is on
the Pareto front of a benchmark when no other method is at least as accurate *and* at most as costly
with one of the two strictly better.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

COLUMNS = (
    "benchmark",
    "method",
    "n",
    "accuracy",
    "mean_cost_usd",
    "mean_tokens",
    "mean_latency_s",
    "failures",
)


def as_rows(summaries: Sequence[BaseModel | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Summaries as dicts, checked for the fields the report reads."""
    rows = [s.model_dump() if isinstance(s, BaseModel) else dict(s) for s in summaries]
    for i, row in enumerate(rows):
        missing = [c for c in ("benchmark", "method", "accuracy", "mean_cost_usd") if c not in row]
        if missing:
            raise ValueError(
                f"summary {i} lacks {missing}; pass EvalSummary objects or summary.json contents"
            )
    return rows


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, accuracy) points no other point dominates (cheaper-or-equal and
    at-least-as-accurate, one strictly), sorted by cost."""
    front = []
    for i, (cost_i, acc_i) in enumerate(points):
        dominated = any(
            cost_j <= cost_i and acc_j >= acc_i and (cost_j < cost_i or acc_j > acc_i)
            for j, (cost_j, acc_j) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def _by_benchmark(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["benchmark"], []).append(row)
    return groups


def plot_pareto(summaries: Sequence[BaseModel | Mapping[str, Any]]) -> bytes:
    """PNG bytes: one panel per benchmark, accuracy vs mean cost per example, front drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_benchmark(as_rows(summaries))
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 3.6), squeeze=False)
    for ax, (bench, rows) in zip(axes[0], sorted(groups.items()), strict=False):
        points = [(float(r["mean_cost_usd"]), float(r["accuracy"])) for r in rows]
        for (cost, acc), row in zip(points, rows, strict=True):
            ax.scatter(cost, acc, s=36)
            ax.annotate(
                str(row["method"]), (cost, acc), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
        front = pareto_front(points)
        ax.plot(
            [points[i][0] for i in front], [points[i][1] for i in front], "k--", lw=1, label="Pareto front"
        )
        ax.set_title(bench)
        ax.set_xlabel("mean cost per example (USD)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.margins(x=0.2)  # room for the method labels written to the right of each point
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}"
    return str(value)


def _front_labels(rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    labels = set()
    for bench, group in _by_benchmark(rows).items():
        points = [(float(r["mean_cost_usd"]), float(r["accuracy"])) for r in group]
        labels |= {(bench, str(group[i]["method"])) for i in pareto_front(points)}
    return labels


def render_markdown(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    *,
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
) -> str:
    """A Markdown table of every (benchmark, method) row; Pareto-optimal rows are marked with *."""
    rows = as_rows(summaries)
    front = _front_labels(rows)
    lines = [
        f"# {title}",
        "",
        *[f"- {n}" for n in notes],
        *([""] if notes else []),
        "| " + " | ".join(COLUMNS) + " | pareto |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in sorted(rows, key=lambda r: (r["benchmark"], -float(r["accuracy"]))):
        on_front = "*" if (row["benchmark"], str(row["method"])) in front else ""
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in COLUMNS) + f" | {on_front} |")
    return "\n".join(lines) + "\n"


def render_html(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    *,
    images: Mapping[str, bytes],
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
    tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """One self-contained HTML page: notes, the summary table, extra tables, plots as base64 PNGs."""
    rows = as_rows(summaries)
    front = _front_labels(rows)
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in (*COLUMNS, "pareto"))
    body = "".join(
        "<tr>"
        + "".join(f"<td>{esc(_fmt(row.get(c, '')))}</td>" for c in COLUMNS)
        + f"<td>{'&#9733;' if (row['benchmark'], str(row['method'])) in front else ''}</td></tr>"
        for row in sorted(rows, key=lambda r: (r["benchmark"], -float(r["accuracy"])))
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:right}th{background:#f4f4f4}img{max-width:100%}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        *(f"<p>{esc(n)}</p>" for n in notes),
        f"<h2>Results</h2><table><tr>{head}</tr>{body}</table>",
    ]
    for name, extra in (tables or {}).items():
        cols = list(dict.fromkeys(k for r in extra for k in r))
        parts.append(
            f"<h2>{esc(name)}</h2><table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr>"
        )
        parts += [
            "<tr>" + "".join(f"<td>{esc(_fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in extra
        ]
        parts.append("</table>")
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{esc(name)}</h2><img alt='{esc(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    summaries: Sequence[BaseModel | Mapping[str, Any]],
    out_dir: Path,
    *,
    title: str = "lemon evaluation",
    notes: Sequence[str] = (),
    extra_images: Mapping[str, Path | bytes] | None = None,
    tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Path]:
    """Write pareto.png, report.html and report.md under ``out_dir``; returns their paths.

    ``extra_images`` (title -> PNG path or bytes; e.g. the reward curve) are embedded after the Pareto plot.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    pareto = plot_pareto(summaries)
    images: dict[str, bytes] = {"Accuracy vs cost (Pareto)": pareto}
    for name, img in (extra_images or {}).items():
        images[name] = img if isinstance(img, bytes) else Path(img).read_bytes()
    paths = {
        "pareto": out_dir / "pareto.png",
        "html": out_dir / "report.html",
        "markdown": out_dir / "report.md",
    }
    _atomic_write(paths["pareto"], pareto)
    _atomic_write(
        paths["html"], render_html(summaries, images=images, title=title, notes=notes, tables=tables).encode()
    )
    _atomic_write(paths["markdown"], render_markdown(summaries, title=title, notes=notes).encode())
    return paths


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
