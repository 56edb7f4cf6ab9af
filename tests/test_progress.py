"""Progress helper (lemon_core/progress.py): a bar on a terminal, one readable line per step in logs."""

from __future__ import annotations

import io

import pytest

from lemon_core.progress import Progress, format_duration, progress, track


class Clock:
    """A clock that moves only when told, so elapsed time and estimates are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEMON_PROGRESS", raising=False)


def test_log_lines_have_count_elapsed_eta_and_figures() -> None:
    log, clock = io.StringIO(), Clock()
    with progress(4, "sft", stream=log, clock=clock) as bar:
        assert bar.mode == "lines", "a log file is not a terminal"
        for loss in (0.9, 0.7, 0.5, 0.25):
            clock.now += 10
            bar.update(loss=loss, valid=1)
    assert log.getvalue().splitlines() == [
        "sft step 1/4 (25%), elapsed 10s, eta 30s, loss=0.9 valid=1",
        "sft step 2/4 (50%), elapsed 20s, eta 20s, loss=0.7 valid=1",
        "sft step 3/4 (75%), elapsed 30s, eta 10s, loss=0.5 valid=1",
        "sft step 4/4 (100%), elapsed 40s, eta 0s, loss=0.25 valid=1",
        "sft done, step 4/4 in 40s",
    ]


def test_a_terminal_gets_a_bar_not_lines() -> None:
    tty, clock = Terminal(), Clock()
    with progress(3, "rollout", stream=tty, clock=clock) as bar:
        assert bar.mode == "bar"
        for _ in range(3):
            clock.now += 1
            bar.update(reward=0.5)
    out = tty.getvalue()
    assert "\r" in out, "tqdm redraws the bar in place"
    assert "rollout" in out and "3/3" in out and "reward=0.5" in out
    assert "elapsed" not in out and "done," not in out


def test_env_override_and_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_PROGRESS", "lines")
    tty = Terminal()
    with progress(1, "eval", stream=tty, clock=Clock()) as bar:
        bar.update()
    assert tty.getvalue().startswith("eval step 1/1 (100%)"), "LEMON_PROGRESS=lines wins over the TTY"
    monkeypatch.setenv("LEMON_PROGRESS", "off")
    quiet = io.StringIO()
    with progress(1, "eval", stream=quiet) as bar:
        bar.update()
    assert quiet.getvalue() == ""
    monkeypatch.setenv("LEMON_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="LEMON_PROGRESS='fancy'.*bar"):
        progress(1, "eval", stream=io.StringIO())


def test_throttled_lines_still_print_the_last_step() -> None:
    log, clock = io.StringIO(), Clock()
    with progress(4, "evaluate", stream=log, clock=clock, min_interval_s=25) as bar:
        for _ in range(4):
            clock.now += 10
            bar.update()
    steps = [ln.split(",")[0] for ln in log.getvalue().splitlines()]
    assert steps == ["evaluate step 1/4 (25%)", "evaluate step 4/4 (100%)", "evaluate done"]


def test_bytes_and_unknown_totals() -> None:
    clock = Clock()
    pull = Progress(96_000_000, "pull smollm2", unit="B", stream=io.StringIO(), clock=clock)
    clock.now += 4
    pull.update(12_000_000)
    assert pull.line() == "pull smollm2 12.0 MB/96.0 MB (12%), elapsed 4s, eta 28s"
    open_ended = Progress(None, "rollout", stream=io.StringIO(), clock=clock)
    open_ended.update(3)
    assert open_ended.line() == "rollout step 3, elapsed 0s"


def test_track_yields_every_item_and_reports_each() -> None:
    log = io.StringIO()
    assert list(track(["a", "b", "c"], "shards", stream=log, clock=Clock())) == ["a", "b", "c"]
    lines = log.getvalue().splitlines()
    expected = [f"shards step {i}/3 ({pct}%)" for i, pct in ((1, 33), (2, 67), (3, 100))]
    assert [ln.split(",")[0] for ln in lines[:3]] == expected
    assert lines[3].startswith("shards done, step 3/3 in")


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 9.4, 65, 3599, 7380)] == ["0s", "9s", "1m05s", "59m59s", "2h03m"]
