"""Training plots (matplotlib, Agg backend: no display needed in a pod or CI).

``plot_reward_curve`` draws, against the GRPO step, the mean reward with its +-std band and the
held-out eval reward, the reward terms, the valid-spec rate, and the mean counterfactual contrast
per edit family - the figures one looks at to see whether a run is learning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_reward_curve(rows: Sequence[dict[str, Any]] | str | Path, out_png: str | Path) -> Path:
    """Write the training-curve PNG from metrics rows (or a metrics.jsonl path); returns its path."""
    if isinstance(rows, str | Path):
        rows = [json.loads(x) for x in Path(rows).read_text().splitlines() if x.strip()]
    if not rows:
        raise ValueError("no metrics rows to plot; run at least one training step")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))

    ax = axes[0]
    steps, mean = _series(rows, "reward/mean")
    _, std = _series(rows, "reward/std")
    ax.plot(steps, mean, marker="o", label="reward (rollouts)")
    if len(std) == len(mean):
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            alpha=0.2,
        )
    es, ev = _series(rows, "eval/reward")
    if es:
        ax.plot(es, ev, marker="s", label="reward (held-out eval)")
    ax.set(title="reward", xlabel="GRPO step")
    ax.legend()

    ax = axes[1]
    for term in ("success", "efficiency", "structure", "cost"):
        s, v = _series(rows, f"reward/{term}")
        ax.plot(s, v, label=term)
    s, v = _series(rows, "valid_rate")
    ax.plot(s, v, "k--", label="valid-spec rate")
    ax.set(title="reward terms", xlabel="GRPO step")
    ax.legend(fontsize=8)

    ax = axes[2]
    families = sorted({k.split("/", 1)[1] for r in rows for k in r if k.startswith("delta/")})
    for fam in families:
        s, v = _series(rows, f"delta/{fam}")
        ax.plot(s, v, marker=".", label=fam)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(title="counterfactual delta = r - r_edit", xlabel="GRPO step")
    if families:
        ax.legend(fontsize=8)

    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
