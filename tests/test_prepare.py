"""Dataset preparation: seeded, limit-stable splits, atomic shards, examples that round-trip."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from lemon_core import prepare
from lemon_core.config import PrepareConfig
from lemon_core.prepare import PrepareError


@dataclass(frozen=True)
class Ex:
    id: str
    question: str
    answer: str
    answer_format: str = "a number"
    options: tuple[str, ...] = ()


def _examples(prefix: str, n: int) -> list[Ex]:
    return [Ex(id=f"{prefix}-{i}", question=f"q{i}", answer=str(i), options=("A", "B")) for i in range(n)]


def _ids(manifest: prepare.Manifest, split: str, bench: str | None = None) -> list[str]:
    return [ex.id for _, ex in prepare.load_split(manifest, split, bench)]


def test_splits_are_disjoint_seeded_and_cover_everything(tmp_path: Path) -> None:
    cfg = PrepareConfig(benchmarks=["a", "b"], train_fraction=0.5, val_fraction=0.2, shard_size=7, seed=3)
    loaded = {"a": _examples("a", 40), "b": _examples("b", 20)}
    m = prepare.prepare_dataset(cfg, str(tmp_path / "t1"), loaded=loaded)
    train, val, test = (set(_ids(m, s)) for s in prepare.SPLITS)
    assert not (train & val or train & test or val & test)
    assert len(train | val | test) == 60
    assert m.splits["train"].counts == {"a": 20, "b": 10}
    assert m.splits["val"].counts == {"a": 8, "b": 4}
    assert all(
        len((tmp_path / "t1" / "train" / f"shard-{i:05d}.jsonl").read_text().splitlines()) <= 7
        for i in range(len(m.shards("train")))
    )
    again = prepare.prepare_dataset(cfg, str(tmp_path / "t2"), loaded=loaded)
    for split in prepare.SPLITS:
        for u1, u2 in zip(m.shards(split), again.shards(split), strict=True):
            assert Path(u1).read_bytes() == Path(u2).read_bytes()
    other = prepare.prepare_dataset(cfg.model_copy(update={"seed": 4}), str(tmp_path / "t3"), loaded=loaded)
    assert set(_ids(other, "test")) != test


def test_limits_never_move_examples_between_splits(tmp_path: Path) -> None:
    loaded = {"a": _examples("a", 50)}
    full = prepare.prepare_dataset(PrepareConfig(benchmarks=["a"]), str(tmp_path / "full"), loaded=loaded)
    capped = prepare.prepare_dataset(
        PrepareConfig(benchmarks=["a"], train_limit=5, test_limit=3), str(tmp_path / "capped"), loaded=loaded
    )
    assert len(_ids(capped, "train")) == 5 and len(_ids(capped, "test")) == 3
    assert set(_ids(capped, "test")) <= set(_ids(full, "test"))
    assert set(_ids(capped, "train")) <= set(_ids(full, "train"))


def test_examples_round_trip_to_their_type(tmp_path: Path) -> None:
    m = prepare.prepare_dataset(
        PrepareConfig(benchmarks=["a"], val_fraction=0.0), str(tmp_path), loaded={"a": _examples("a", 10)}
    )
    assert m.example_types["a"].endswith(":Ex")
    (name, ex), *_ = prepare.load_split(m, "train")
    assert name == "a" and isinstance(ex, Ex) and ex.options == ("A", "B")
    reread = prepare.read_manifest(str(tmp_path))
    assert reread.splits == m.splits
    assert json.loads((tmp_path / "manifest.json").read_text())["format"] == "lemon-tasks/1"
    assert not list(tmp_path.rglob("*.tmp*")), "atomic writes leave no temporary files"


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train_fraction \\+ val_fraction"):
        PrepareConfig(benchmarks=["a"], train_fraction=0.8, val_fraction=0.3)
    with pytest.raises(ValueError, match="benchmarks"):
        PrepareConfig(benchmarks=[])
    with pytest.raises(PrepareError, match="run `lemon prepare` first"):
        prepare.read_manifest(str(tmp_path / "nowhere"))
    m = prepare.prepare_dataset(
        PrepareConfig(benchmarks=["a"]), str(tmp_path), loaded={"a": _examples("a", 5)}
    )
    with pytest.raises(PrepareError, match="split 'dev'"):
        m.shards("dev")


def test_real_benchmark_files(tmp_path: Path) -> None:
    benchmarks = pytest.importorskip("lemon_core.benchmarks", reason="benchmark loaders not installed yet")
    if not hasattr(benchmarks, "get"):
        pytest.skip("lemon_core.benchmarks.get not available yet")
    cfg = PrepareConfig(
        benchmarks=["multiarith", "gsm8k"],
        source_split={"gsm8k": "test"},
        train_limit=6,
        val_limit=2,
        test_limit=4,
        shard_size=4,
        seed=0,
    )
    m = prepare.prepare_dataset(cfg, str(tmp_path))
    assert m.splits["test"].counts == {"multiarith": 4, "gsm8k": 4}
    name, ex = prepare.load_split(m, "test", "gsm8k")[0]
    bench = benchmarks.get(name)
    assert bench.score(ex.answer, ex) == 1.0, "a rebuilt example still scores its own gold answer as correct"
