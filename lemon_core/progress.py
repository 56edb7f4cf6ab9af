"""Progress of long work (SFT, rollout, update, evaluation, model pulls): a bar on a terminal, lines in logs.

A tqdm bar is the right thing in a terminal and the wrong thing in a Kubeflow or Kubernetes log, where
carriage returns turn into one endless line or hundreds of half-drawn bars. So ``progress`` looks at
where it writes: a TTY gets the bar; anything else gets one plain line per step,

    sft step 3/10 (30%), elapsed 12s, eta 28s, loss=0.412 valid=0.5

flushed at once, so ``kubectl logs -f`` and kfp.local show it as it happens. ``LEMON_PROGRESS=bar``,
``lines`` or ``off`` overrides the choice (e.g. ``lines`` under a CI runner that fakes a TTY).

Usage::

    with progress(len(batches), "sft") as bar:
        for batch in batches:
            loss = step(batch)
            bar.update(loss=loss)

    for shard in track(shards, "rollout"):
        ...
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Literal, TypeVar

Mode = Literal["bar", "lines", "off"]
MODES: tuple[Mode, ...] = ("bar", "lines", "off")
T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """Short human duration: 9s, 1m05s, 2h03m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def choose_mode(stream: IO[str], mode: Mode | None = None) -> Mode:
    """``mode`` if given, else ``LEMON_PROGRESS``, else a bar on a TTY and lines elsewhere."""
    chosen = mode or os.environ.get("LEMON_PROGRESS") or None
    if chosen is None:
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "lines"
    if chosen not in MODES:
        raise ValueError(f"LEMON_PROGRESS={chosen!r} is not a progress mode; use one of {list(MODES)}")
    return chosen  # type: ignore[return-value]


class Progress:
    """Counts done work against ``total`` and reports it as a bar or as log lines (see module doc).

    ``update(n, **figures)`` adds ``n`` done units; the figures (loss, reward, accuracy...) are shown
    beside the count. ``min_interval_s`` throttles lines for fast loops (the last step always prints).
    """

    def __init__(
        self,
        total: int | float | None,
        desc: str,
        *,
        unit: str = "step",
        stream: IO[str] | None = None,
        mode: Mode | None = None,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.mode = choose_mode(self.stream, mode)
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.start = clock()
        self.done: float = 0
        self.figures: dict[str, Any] = {}
        self._last_line = float("-inf")
        self._closed = False
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True,
                             unit_scale=unit == "B", unit_divisor=1000)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def eta(self) -> float | None:
        """Seconds left at the average rate so far; None before the first step or without a total."""
        if not self.total or self.done <= 0:
            return None
        return self.elapsed() / self.done * max(self.total - self.done, 0)

    def count(self) -> str:
        """'step 3/10', 'step 3' without a total, '12.0 MB/96.0 MB' for bytes."""
        if self.unit == "B":
            return format_bytes(self.done) + (f"/{format_bytes(self.total)}" if self.total else "")
        return f"{self.unit} {format_figure(self.done)}" + (f"/{format_figure(self.total)}" if self.total else "")

    def line(self) -> str:
        """The log line for the current state."""
        count = self.count()
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = self.eta()
        parts = [f"{self.desc} {count}{pct}", f"elapsed {format_duration(self.elapsed())}"]
        if eta is not None:
            parts.append(f"eta {format_duration(eta)}")
        text = ", ".join(parts)
        if self.figures:
            text += ", " + " ".join(f"{k}={format_figure(v)}" for k, v in self.figures.items())
        return text

    def update(self, n: float = 1, **figures: Any) -> None:
        self.done += n
        self.figures.update(figures)
        if self.mode == "bar":
            if figures:
                self._bar.set_postfix({k: format_figure(v) for k, v in self.figures.items()}, refresh=False)
            self._bar.update(n)
        elif self.mode == "lines":
            now = self.clock()
            finished = self.total is not None and self.done >= self.total
            if finished or now - self._last_line >= self.min_interval_s:
                self._last_line = now
                self._write(self.line())

    def close(self) -> None:
        """End the bar; in lines mode say how long the whole thing took."""
        if self._closed:
            return
        self._closed = True
        if self.mode == "bar":
            self._bar.close()
        elif self.mode == "lines":
            self._write(f"{self.desc} done, {self.count()} in {format_duration(self.elapsed())}")

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int | float | None, desc: str, **kwargs: Any) -> Progress:
    """A ``Progress`` for ``total`` units of work named ``desc`` (use it as a context manager)."""
    return Progress(total, desc, **kwargs)


def track(items: Iterable[T], desc: str, total: int | None = None, **kwargs: Any) -> Iterator[T]:
    """Yield ``items``, reporting one step per item (total from ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, **kwargs) as bar:
        for item in items:
            yield item
            bar.update()
