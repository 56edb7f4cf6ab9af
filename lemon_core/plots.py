"""Training curves that show what moved (matplotlib, Agg backend: no display needed in a pod or CI).

``plot_reward_curve`` draws eight panels against the GRPO step from the rows of ``metrics.jsonl``:

    reward (mean, 95% interval band, held-out eval)   reward terms            valid / success rates   cost
    capacity share of sampled agents (stacked)        delta per edit family   edits per family         loss, kl, clip

The numbers stay in ``metrics.jsonl``; the PNG is for looking. ``curve_series`` is the pure part (which
numbers go in which panel) so it can be tested without reading pixels. A series absent from every row is
skipped; a panel with nothing to show says "not recorded" rather than vanishing, so a missing metric is
visible. Older rows are read too: ``reward/std`` stands in for the interval, ``capacity/<level>`` for
``capacity_share/<level>``, ``cost`` for ``cost/mean``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from lemon_core.storage import atomic_path

Series = tuple[list[int], list[float]]
# (multiplier, how many) for cost axes: the first that writes the largest cost as 1 or more is used
COST_UNITS = ((1.0, ""), (1e3, "1,000 "), (1e6, "million "), (1e9, "billion "))
PANELS = ("reward", "reward terms", "rates", "cost", "capacity share", "delta", "edit counts", "optimisation")


def _series(rows: Sequence[dict[str, Any]], key: str) -> Series:
    pts = [(r["step"], float(r[key])) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _first_present(rows: Sequence[dict[str, Any]], *keys: str) -> Series:
    for key in keys:
        series = _series(rows, key)
        if series[0]:
            return series
    return [], []


def _suffixes(rows: Sequence[dict[str, Any]], prefix: str) -> list[str]:
    """Names after ``prefix`` in row keys, in first-seen order (train.py writes levels cheapest first); a name with
    a "/" in it belongs to a breakdown (``capacity/<benchmark>/<level>``) and is left out."""
    return list(dict.fromkeys(k[len(prefix) :] for r in rows for k in r
                              if k.startswith(prefix) and "/" not in k[len(prefix) :]))


def choice_series(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Series]]]:
    """Per benchmark the quantities GRPO moves, from ``rollout_metrics``' breakdowns: the share of sampled agents at
    each capacity level, the share of sampled specs of each team shape, and the benchmark's mean rollout reward;
    plus ``all``: the probe tasks' reward (the same tasks every step, so the curve is not task difficulty) and KL."""
    benchmarks = list(dict.fromkeys(k.split("/")[1] for r in rows for k in r
                                    if k.startswith("capacity/") and k.count("/") == 2))
    out: dict[str, dict[str, dict[str, Series]]] = {}
    for bench in benchmarks:
        out[bench] = {
            "capacity": {lv: _series(rows, f"capacity/{bench}/{lv}") for lv in _suffixes(rows, f"capacity/{bench}/")},
            "shape": {sh: _series(rows, f"shape/{bench}/{sh}") for sh in _suffixes(rows, f"shape/{bench}/")},
            "reward": {"rollout reward": _series(rows, f"reward/{bench}"),
                       "probe reward": _series(rows, f"probe/reward/{bench}")},
        }
    out = {b: {k: {label: s for label, s in v.items() if s[0]} for k, v in panels.items()} for b, panels in out.items()}
    every = {"probe reward": _series(rows, "probe/reward"), "kl": _series(rows, "kl")}
    return {**out, "all": {key: {key: s} for key, s in every.items() if s[0]}}


def plot_choices(rows: Sequence[dict[str, Any]], out_png: str | Path) -> Path:
    """What moved in training, per benchmark: one row of panels each (capacity share and team-shape share of the
    sampled specs, stacked; the rollout and probe rewards), and a last row with the probe reward and the KL to the
    SFT model. A constant stack is a policy that did not move."""
    data = choice_series(rows)
    benches = [b for b in data if b != "all"]
    fig, axes = plt.subplots(len(benches) + 1, 3, figsize=(16, 3.6 * (len(benches) + 1)), squeeze=False)
    for row, bench in enumerate(benches):
        for col, (name, title) in enumerate((("capacity", "capacity share of sampled agents"),
                                             ("shape", "team shape of sampled specs"), ("reward", "reward"))):
            ax, panel = axes[row][col], data[bench][name]
            if not panel:
                _not_recorded(ax, f"{bench}: {title}")
                continue
            if name == "reward":
                for label, (steps, values) in panel.items():
                    ax.plot(steps, values, marker="o", label=label)
            else:
                _draw_capacity(ax, panel)
            ax.set_title(f"{bench}: {title}")
            ax.set_xlabel("GRPO step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=8, loc="best")
    last = axes[-1]
    for ax, key, title in ((last[0], "probe reward", "probe tasks' mean reward (same tasks every step)"),
                           (last[1], "kl", "KL to the SFT model")):
        if key not in data["all"]:
            _not_recorded(ax, title)
            continue
        ax.plot(*data["all"][key][key], marker="o")
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    last[2].axis("off")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    return Path(out_png)


def _reward_band(rows: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """Mean reward and its band: the 95% interval when logged, else mean +- std (older rows)."""
    steps, mean = _series(rows, "reward/mean")
    lo, hi = _series(rows, "reward/ci_low"), _series(rows, "reward/ci_high")
    if lo[0] and lo[0] == steps and hi[0] == steps:
        band = {"band low": lo, "band high": hi}
    else:
        s_steps, std = _series(rows, "reward/std")
        band = (
            {"band low": (steps, [m - s for m, s in zip(mean, std, strict=True)]),
             "band high": (steps, [m + s for m, s in zip(mean, std, strict=True)])}
            if s_steps == steps and steps else {}
        )
    return {"mean": (steps, mean), **band, "eval": _series(rows, "eval/reward")}


def curve_series(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Series]]:
    """Panel name -> label -> (steps, values), only for series some row carries."""
    shares = {lv: _series(rows, f"capacity_share/{lv}") for lv in _suffixes(rows, "capacity_share/")}
    if not shares:
        shares = {lv: _series(rows, f"capacity/{lv}") for lv in _suffixes(rows, "capacity/")}
    panels: dict[str, dict[str, Series]] = {
        "reward": _reward_band(rows),
        "reward terms": {t: _series(rows, f"reward/{t}") for t in ("success", "efficiency", "structure", "cost")},
        "rates": {
            "valid-spec rate": _series(rows, "valid_rate"),
            "success rate": _series(rows, "success_rate"),
            "eval valid-spec rate": _series(rows, "eval/valid_rate"),
            "eval score": _series(rows, "eval/score"),
        },
        "cost": {"cost per execution": _first_present(rows, "cost/mean", "cost"),
                 "eval cost": _series(rows, "eval/cost")},
        "capacity share": shares,
        "delta": {f: _series(rows, f"delta/{f}") for f in _suffixes(rows, "delta/")},
        "edit counts": {f: _series(rows, f"delta_count/{f}") for f in _suffixes(rows, "delta_count/")},
        "optimisation": {k: _series(rows, k) for k in ("loss", "kl", "clip_ratio")},
    }
    return {name: {label: s for label, s in panel.items() if s[0]} for name, panel in panels.items()}


def cost_unit(costs: Sequence[float], per: str = "example") -> tuple[float, str]:
    """A multiplier and its unit (``"USD per million examples"``) that write the largest cost as a number
    of 1 or more. Costs per example are tiny (1e-5 USD), and matplotlib would put them on a scientific axis
    whose exponent ("1e-5") is printed at the axis end, where it collides with the axis label; plain numbers
    in a unit the label names read without it."""
    top = max((abs(c) for c in costs), default=0.0)
    scale, count = COST_UNITS[0]
    if top:
        scale, count = next(((m, n) for m, n in COST_UNITS if top * m >= 1), COST_UNITS[-1])
    return scale, f"USD per {count}{per}{'s' if count else ''}"


def cost_axis(axis: Any, costs: Sequence[float], label: str, per: str = "example") -> None:
    """Tick ``axis`` in the unit ``cost_unit`` picks and name that unit in its label (``label``, then the unit,
    then any text after a newline in ``label``), so no exponent is drawn beside the axis."""
    scale, unit = cost_unit(costs, per)
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value * scale:g}"))
    first, _, rest = label.partition("\n")
    axis.set_label_text(f"{first}, {unit}" + (f"\n{rest}" if rest else ""))


def _not_recorded(ax: Any, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not recorded", ha="center", va="center", color="grey", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_reward(ax: Any, panel: dict[str, Series]) -> None:
    steps, mean = panel["mean"]
    ax.plot(steps, mean, marker="o", label="reward (rollouts)")
    if "band low" in panel:
        ax.fill_between(steps, panel["band low"][1], panel["band high"][1], alpha=0.2, label="95% interval")
    if "eval" in panel:
        ax.plot(*panel["eval"], marker="s", label="reward (held-out eval)")


def _draw_capacity(ax: Any, panel: dict[str, Series]) -> None:
    steps = sorted({s for series in panel.values() for s in series[0]})
    stacks = [[dict(zip(*series, strict=True)).get(s, 0.0) for s in steps] for series in panel.values()]
    shades = [0.25 + 0.7 * i / max(len(panel) - 1, 1) for i in range(len(panel))]  # cheapest lightest
    ax.stackplot(steps, stacks, labels=list(panel), alpha=0.8, colors=plt.cm.Blues(shades))
    ax.set_ylim(0, 1)


def _draw_counts(ax: Any, panel: dict[str, Series]) -> None:
    width = 0.8 / len(panel)
    for i, (family, (steps, counts)) in enumerate(panel.items()):
        x = [s - 0.4 + width * (i + 0.5) for s in steps]
        ax.bar(x, counts, width=width, label=f"{family} (n={sum(counts):.0f})")


def plot_reward_curve(rows: Sequence[dict[str, Any]] | str | Path, out_png: str | Path) -> Path:
    """Write the training-curve PNG from metrics rows (or a metrics.jsonl path); returns its path."""
    if isinstance(rows, str | Path):
        rows = [json.loads(x) for x in Path(rows).read_text().splitlines() if x.strip()]
    if not rows:
        raise ValueError("no metrics rows to plot; run at least one training step")
    missing = [i for i, r in enumerate(rows) if "step" not in r]
    if missing:
        raise ValueError(f"metrics rows {missing[:5]} lack 'step'; each metrics.jsonl row needs its GRPO step")
    data = curve_series(rows)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    titles = {"delta": "counterfactual delta = r - r_edit", "edit counts": "edits per family",
              "capacity share": "capacity share of sampled agents", "optimisation": "loss, kl, clip ratio"}
    for ax, name in zip(axes.flat, PANELS, strict=True):
        panel = data[name]
        if not panel:
            _not_recorded(ax, titles.get(name, name))
            continue
        if name == "reward":
            _draw_reward(ax, panel)
        elif name == "capacity share":
            _draw_capacity(ax, panel)
        elif name == "edit counts":
            _draw_counts(ax, panel)
        else:
            counts = data["edit counts"] if name == "delta" else {}
            for label, (steps, values) in panel.items():
                n = f" (n={sum(counts[label][1]):.0f})" if label in counts else ""
                ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=label + n)
        if name == "delta":
            ax.axhline(0, color="grey", lw=0.5)
        if name == "rates":
            ax.set_ylim(-0.05, 1.05)
        if name == "cost":
            cost_axis(ax.yaxis, [v for _, values in panel.values() for v in values], "cost", per="execution")
        ax.set(title=titles.get(name, name), xlabel="GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)  # the temporary name does not end in .png
    plt.close(fig)
    return out
