"""Dataset preparation: benchmark files -> seeded train/val/test task shards (JSONL) plus a manifest.

Each benchmark's source split is shuffled with a seed derived from (seed, benchmark name) and cut
into train/val/test by *fractions*, before any size limit is applied. So raising ``train_limit``
never moves an example into or out of the test set, and two runs with the same seed produce
byte-identical shards.

Layout under ``out_uri`` (``s3://`` or ``file://`` / a path; every file is written atomically
through ``lemon_core.storage``, the manifest last, so a reader that finds the manifest finds every
shard)::

    <out>/train/shard-00000.jsonl   rows {"benchmark", "id", "example": {...}}; train mixes benchmarks
    <out>/val/shard-00000.jsonl
    <out>/test/shard-00000.jsonl
    <out>/manifest.json             seed, fractions, per-split shard URIs and per-benchmark counts,
                                    and the Python type of each benchmark's examples

The manifest records each example type (``module:QualName``) so a rollout pod that only has the
shard can rebuild the very objects ``Benchmark.score`` expects, without the raw files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from lemon_core import storage
from lemon_core.config import PrepareConfig
from lemon_core.errors import LemonError, format_validation_error

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"


class PrepareError(LemonError, ValueError):
    """Bad preparation input; the message names the field and the fix."""


class SplitInfo(BaseModel):
    shards: list[str]
    counts: dict[str, int]


class Manifest(BaseModel):
    """What ``prepare_dataset`` wrote; the one file downstream stages need to find the shards."""

    format: str = "lemon-tasks/1"
    uri: str
    seed: int
    config: dict[str, Any]
    splits: dict[str, SplitInfo]
    example_types: dict[str, str]

    def shards(self, split: str) -> list[str]:
        if split not in self.splits:
            raise PrepareError(f"split {split!r} is not in {self.uri}; it has {sorted(self.splits)}")
        return self.splits[split].shards


# ------------------------------------------------------------------------------ example (de)serialisation


def example_to_dict(example: Any) -> dict[str, Any]:
    """A benchmark example as plain JSON-able data (pydantic model, dataclass or mapping)."""
    if isinstance(example, BaseModel):
        return example.model_dump(mode="json")
    if dataclasses.is_dataclass(example) and not isinstance(example, type):
        return json.loads(json.dumps(dataclasses.asdict(example), default=str))
    if isinstance(example, dict):
        return dict(example)
    raise PrepareError(
        f"cannot serialise example of type {type(example).__name__}: "
        "benchmarks must yield pydantic models, dataclasses or dicts"
    )


def type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def example_from_dict(data: dict[str, Any], type_path: str) -> Any:
    """Rebuild an example from ``example_to_dict`` output and its recorded ``module:QualName``."""
    module_name, _, qualname = type_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise PrepareError(
            f"example type {type_path!r} from the manifest cannot be imported ({e}); "
            "install the same lemon version that prepared the shards"
        ) from e
    if obj is dict:
        return dict(data)
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        return obj.model_validate(data)
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set(data)
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in fields}
    return obj(**kwargs)


# ------------------------------------------------------------------------------------------ splitting


def _bench_rng(seed: int, name: str) -> random.Random:
    """A stream per benchmark, so adding a benchmark never reshuffles the others."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def split_examples(examples: Sequence[Any], *, name: str, cfg: PrepareConfig) -> dict[str, list[Any]]:
    """Seeded shuffle, cut by fractions, then cap each part by its limit."""
    order = list(examples)
    _bench_rng(cfg.seed, name).shuffle(order)
    n_train = int(round(len(order) * cfg.train_fraction))
    n_val = int(round(len(order) * cfg.val_fraction))
    parts = {
        "train": order[:n_train],
        "val": order[n_train : n_train + n_val],
        "test": order[n_train + n_val :],
    }
    limits = {"train": cfg.train_limit, "val": cfg.val_limit, "test": cfg.test_limit}
    return {s: parts[s][: limits[s]] if limits[s] else parts[s] for s in SPLITS}


def _load_benchmark(name: str, cfg: PrepareConfig) -> tuple[str, list[Any]]:
    from lemon_core.benchmarks import get as get_benchmark

    try:
        bench = get_benchmark(name)
    except (KeyError, ValueError) as e:
        raise PrepareError(f"benchmarks: unknown benchmark {name!r} ({e})") from e
    split = cfg.source_split.get(name, bench.default_split)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else None
    try:
        examples = list(bench.load(split, limit=None, data_dir=data_dir))
    except (FileNotFoundError, ValueError) as e:
        raise PrepareError(f"benchmark {name!r} split {split!r}: {e}; check data_dir") from e
    if not examples:
        raise PrepareError(f"benchmark {name!r} split {split!r} is empty; check data_dir / source_split")
    return split, examples


def _shard(rows: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)] or [[]]


def prepare_dataset(
    cfg: PrepareConfig, out_uri: str, loaded: dict[str, Sequence[Any]] | None = None
) -> Manifest:
    """Write task shards and the manifest under ``out_uri``; returns the manifest.

    ``loaded`` (benchmark -> examples) skips the benchmark loaders; tests use it with plain objects.
    """
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    counts: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    types: dict[str, str] = {}
    for name in cfg.benchmarks:
        examples = list(loaded[name]) if loaded and name in loaded else _load_benchmark(name, cfg)[1]
        types[name] = type_name(examples[0])
        for split, part in split_examples(examples, name=name, cfg=cfg).items():
            counts[split][name] = len(part)
            rows[split].extend(
                {"benchmark": name, "id": str(getattr(ex, "id", i)), "example": example_to_dict(ex)}
                for i, ex in enumerate(part)
            )
    # Train shards mix benchmarks so every rollout pod sees the task distribution, not one benchmark.
    _bench_rng(cfg.seed, "train-mix").shuffle(rows["train"])
    splits: dict[str, SplitInfo] = {}
    for split in SPLITS:
        uris = []
        for i, shard in enumerate(_shard(rows[split], cfg.shard_size)):
            uri = storage.join(out_uri, split, f"shard-{i:05d}.jsonl")
            storage.write_jsonl(uri, shard)
            uris.append(uri)
        splits[split] = SplitInfo(shards=uris, counts=counts[split])
    manifest = Manifest(
        uri=out_uri, seed=cfg.seed, config=cfg.model_dump(), splits=splits, example_types=types
    )
    storage.write_text(storage.join(out_uri, MANIFEST), manifest.model_dump_json(indent=2) + "\n")
    return manifest


# -------------------------------------------------------------------------------------------- reading


def read_manifest(uri: str) -> Manifest:
    """Read a manifest given its URI or the folder it sits in."""
    target = uri if uri.endswith(".json") else storage.join(uri, MANIFEST)
    try:
        return Manifest.model_validate_json(storage.read_text(target))
    except storage.StorageError as e:
        raise PrepareError(f"no task manifest at {target}: run `lemon prepare` first ({e})") from e
    except ValidationError as e:
        raise PrepareError(f"{target} is not a valid task manifest ({format_validation_error(e)}); "
                           "re-run `lemon prepare`") from None


def read_shard(uri: str, manifest: Manifest, benchmark: str | None = None) -> list[tuple[str, Any]]:
    """(benchmark name, example object) for every row of one shard, optionally one benchmark only."""
    out = []
    for row in storage.read_jsonl(uri):
        name = row["benchmark"]
        if benchmark and name != benchmark:
            continue
        out.append((name, example_from_dict(row["example"], manifest.example_types[name])))
    return out


def load_split(manifest: Manifest, split: str, benchmark: str | None = None) -> list[tuple[str, Any]]:
    """Every example of one split (all shards), optionally one benchmark only."""
    return [item for uri in manifest.shards(split) for item in read_shard(uri, manifest, benchmark)]
