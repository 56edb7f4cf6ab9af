"""What every benchmark shares: the Example record, the Benchmark interface, and finding the data.

Loading protocol (all benchmarks): examples come in file order (the order the authors published);
``limit=N`` keeps the first N. ``seed=0`` (the default) keeps file order; any other seed shuffles the
split with ``random.Random(seed)`` before the limit, for a reproducible random subset.

Data location, in order (``benchmark_folder``, the one place that decides it):

1. the ``data_dir`` argument (``--data-dir`` on the CLI, ``data_dir:`` in a config): only there, because
   a folder someone names on purpose must not be silently replaced by another copy;
2. ``$LEMON_DATA_DIR``;
3. a ``shared/datasets`` folder above the working directory or this package (the repository's
   ``../shared/datasets`` on machines and CI runners that keep one beside the checkout);
4. the cache that ``lemon data pull`` installs into (``$LEMON_CACHE_DIR/datasets``, default
   ``~/.cache/lemon/datasets``), so a fresh clone works after one pull.

Places 2-4 are tried in turn for each benchmark; the first that holds its folder wins. ``data_dir`` and
``$LEMON_DATA_DIR`` may be the datasets root or the benchmark's own folder. ``data_dir="hf"`` or a split
written ``"hf:<dataset>[:<config>][@<split>]"`` loads from the Hugging Face hub instead (needs the
optional ``datasets`` package; those copies are not the sha256-pinned files).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from lemon_core.benchmarks.extract import extract_choice, extract_number, numbers_match
from lemon_core.errors import LemonError

DATA_ENV = "LEMON_DATA_DIR"


class Example(BaseModel):
    """One task. ``question`` is the full text agents see; ``answer`` the gold label."""

    model_config = ConfigDict(frozen=True)

    id: str  # stable: "<benchmark>/<split>/<key>"
    benchmark: str
    question: str
    answer: str  # number as canonical string, option letter, or HumanEval task_id
    answer_format: str  # one-line instruction the executor appends to the final agent's prompt
    # The same instruction for a final agent that reads other agents' outputs; "" means answer_format.
    # It carries no placeholder: such an agent copies one ("The answer is N.") instead of answering.
    team_answer_format: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)


class DataNotFoundError(LemonError, FileNotFoundError):
    pass


PULL_HINT = "run `lemon data pull {name}` (or pass --data-dir / set $LEMON_DATA_DIR to a folder holding {name}/)"


SHARED_ENV = "LEMON_SHARED_DATASETS"  # "off": look for no shared/datasets folder


def shared_search_starts() -> tuple[Path, Path]:
    """Where the search for a ``shared/datasets`` folder starts: the working directory and this package."""
    return Path.cwd().resolve(), Path(__file__).resolve().parent


def find_shared_datasets() -> Path | None:
    """The first ``shared/datasets`` folder above the working directory or this package, else None; none at all
    with ``LEMON_SHARED_DATASETS=off`` (what a fresh clone without the folder sees, for a whole run in tests).

    A module-level function so that tests can hide the folder (``monkeypatch.setattr``) and check what a
    fresh clone without one sees."""
    if os.environ.get(SHARED_ENV, "").strip().lower() == "off":
        return None
    for start in shared_search_starts():
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "datasets"
            if candidate.is_dir():
                return candidate
    return None


PULL_MARKER = "lemon_data.json"  # written last into a pulled benchmark folder: its presence means "complete"


def pulled_datasets_dir() -> Path:
    """Where ``lemon data pull`` installs benchmarks: ``$LEMON_CACHE_DIR/datasets`` (~/.cache/lemon/datasets)."""
    from lemon_core.models import cache_root

    return cache_root() / "datasets"


def is_pulled(name: str) -> bool:
    """Whether ``lemon data pull`` completed benchmark ``name`` in the cache (its folder carries the marker)."""
    return (pulled_datasets_dir() / name / PULL_MARKER).is_file()


class DataPlace(BaseModel):
    """One place the loader looks for a benchmark: ``label`` names the setting, ``looked_at`` the path it
    checked (or why there was none), ``folder`` the benchmark's folder there when it has one."""

    label: str
    looked_at: str
    folder: Path | None = None

    def describe(self) -> str:
        return f"{self.label} {self.looked_at}" + ("" if self.folder else " (not there)")


def _explicit_folder(name: str, root: Path, how: str) -> Path | None:
    """``root/name`` or ``root`` itself when it is the benchmark's folder; ``how`` names the setting in errors."""
    if not root.is_dir():
        raise DataNotFoundError(f"{how}={str(root)!r} is not a folder; fix it (a folder holding {name}/ or the "
                                f"{name} folder itself) or leave it out")
    if (root / name).is_dir():
        return root / name
    return root if root.name == name else None


def data_places(name: str, data_dir: str | os.PathLike[str] | None = None) -> list[DataPlace]:
    """Every place the loader considers for benchmark ``name``, in order (module docstring), each with its
    folder if it holds the benchmark. An explicit ``data_dir`` is the only place."""
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        folder = _explicit_folder(name, root, "--data-dir (data_dir)")
        return [DataPlace(label="--data-dir", looked_at=str(root / name), folder=folder)]
    places = []
    env = os.environ.get(DATA_ENV)
    if env:
        root = Path(env).expanduser()
        folder = _explicit_folder(name, root, f"${DATA_ENV}")
        places.append(DataPlace(label=f"${DATA_ENV}", looked_at=str(root / name), folder=folder))
    else:
        places.append(DataPlace(label=f"${DATA_ENV}", looked_at="(not set)"))
    shared = find_shared_datasets()
    if shared is None:
        above = " or ".join(str(p) for p in shared_search_starts())
        places.append(DataPlace(label="shared folder", looked_at=f"(no shared/datasets above {above})"))
    else:
        found = (shared / name).is_dir()
        places.append(DataPlace(label="shared folder", looked_at=str(shared / name),
                                folder=shared / name if found else None))
    cached = pulled_datasets_dir() / name
    pulled = is_pulled(name)
    places.append(DataPlace(label="pull cache", looked_at=str(cached), folder=cached if pulled else None))
    return places


def benchmark_folder(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder the loader reads benchmark ``name`` from; the error lists every place it looked."""
    places = data_places(name, data_dir)
    for place in places:
        if place.folder is not None:
            return place.folder
    if data_dir is not None:
        raise DataNotFoundError(f"no {name}/ folder in --data-dir (data_dir) {str(data_dir)!r}; point it at the "
                                f"folder holding {name}/, or leave it out and {PULL_HINT.format(name=name)}")
    looked = "; ".join(p.describe() for p in places)
    raise DataNotFoundError(f"benchmark data for {name!r} not found; looked in: {looked}. "
                            f"To fix: {PULL_HINT.format(name=name)}; data_dir='hf' loads the Hugging Face copies")


def parse_hf_split(split: str, default_dataset: str, default_config: str | None,
                   default_split: str) -> tuple[str, str | None, str]:
    """"hf:openai/gsm8k:main@test" -> ("openai/gsm8k", "main", "test"); parts left out take defaults."""
    spec = split.removeprefix("hf:")
    spec, _, hf_split = spec.partition("@")
    dataset, _, config = spec.partition(":")
    return dataset or default_dataset, config or default_config, hf_split or default_split


def load_hf_rows(dataset: str, config: str | None, split: str) -> list[dict[str, Any]]:
    """Rows of a hub dataset; ``datasets`` is imported only here so the library works without it."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            f"loading {dataset!r} from the Hugging Face hub needs the 'datasets' package "
            "(pip install datasets); or use the sha256-pinned raw files: `lemon data pull`, or --data-dir / "
            f"${DATA_ENV} pointing at a copy"
        ) from exc
    return [dict(row) for row in datasets.load_dataset(dataset, config, split=split)]


class Benchmark:
    """A benchmark: load examples from raw files (or the hub), extract an answer, score it.

    Subclasses set the class attributes and implement ``_records`` (raw files -> records) and
    ``_example`` (one record -> Example), plus ``_hf_record`` to map a hub row onto the raw format.
    """

    name: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    default_split: ClassVar[str] = "test"
    answer_format: ClassVar[str]
    team_answer_format: ClassVar[str] = ""  # see Example.team_answer_format
    hf_dataset: ClassVar[str]
    hf_config: ClassVar[str | None] = None
    hf_splits: ClassVar[dict[str, str]] = {}  # our split name -> hub split name

    def load(self, split: str | None = None, limit: int | None = None,
             data_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> list[Example]:
        split = split or self.default_split
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        if str(data_dir) == "hf" or split.startswith("hf:"):
            examples = self._load_hf(split)
        else:
            if split not in self.splits:
                raise ValueError(f"{self.name}: unknown split {split!r}; choose one of {list(self.splits)} "
                                 "or 'hf:<dataset>[:<config>][@<split>]'")
            records = self._records(split, self.folder(data_dir))
            examples = [self._example(record, split) for record in records]
        if seed:
            random.Random(seed).shuffle(examples)
        return examples if limit is None else examples[:limit]

    def folder(self, data_dir: str | os.PathLike[str] | None = None) -> Path:
        """This benchmark's raw-data folder (``data_dir`` may be the root or the folder itself)."""
        return benchmark_folder(self.name, data_dir)

    def _load_hf(self, split: str) -> list[Example]:
        our_split = self.default_split if split.startswith("hf:") or split == "hf" else split
        hf_default = self.hf_splits.get(our_split, our_split)
        dataset, config, hf_split = parse_hf_split(split if split.startswith("hf:") else "hf:",
                                                   self.hf_dataset, self.hf_config, hf_default)
        rows = load_hf_rows(dataset, config, hf_split)
        records = self._hf_records(rows, our_split)
        return [self._example(record, our_split) for record in records]

    def _hf_records(self, rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
        return [self._hf_record(row, i) for i, row in enumerate(rows)]

    # -- to implement ----------------------------------------------------------------------------
    def _records(self, split: str, folder: Path) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _hf_record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        raise NotImplementedError

    def _example(self, record: dict[str, Any], split: str) -> Example:
        raise NotImplementedError

    def example(self, split: str, key: object, question: str, answer: str, meta: dict[str, Any]) -> Example:
        """One Example of this benchmark: its id is ``<name>/<split>/<key>`` and it carries both of the
        benchmark's answer formats, so no subclass can forget the team one."""
        return Example(id=f"{self.name}/{split}/{key}", benchmark=self.name, question=question, answer=answer,
                       answer_format=self.answer_format, team_answer_format=self.team_answer_format, meta=meta)

    def extract(self, text: str | None, example: Example | None = None) -> str | None:
        raise NotImplementedError

    def score(self, prediction: str | None, example: Example) -> float:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------------
    def grade(self, text: str | None, example: Example) -> float:
        """extract + score in one call: the reward for a raw final answer."""
        return self.score(self.extract(text, example), example)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, splits={self.splits})"


NUMBER_FORMAT = "End your reply with 'The answer is N' where N is a single number (no units)."
# For a final agent with parents: with NUMBER_FORMAT, Qwen2.5-Coder-0.5B's chain verifier and SC(3) voter
# answered "The answer is N." in 24 of 24 MultiArith problems; with this one, 0 of 24 (bench/answer_format.py).
NUMBER_TEAM_FORMAT = ("Work it out step by step first. Your last line must be 'The answer is' followed by the final "
                      "number (digits only, no units).")


class NumericBenchmark(Benchmark):
    """Math word problems: gold is a number; scored numerically (abs 1e-6; rel 1e-4 for decimal golds)."""

    answer_format = NUMBER_FORMAT
    team_answer_format = NUMBER_TEAM_FORMAT

    def extract(self, text: str | None, example: Example | None = None) -> str | None:
        return extract_number(text)

    def score(self, prediction: str | None, example: Example) -> float:
        return 1.0 if numbers_match(prediction, example.answer) else 0.0


def choice_format(letters: str) -> str:
    return f"End your reply with 'The answer is (X)' where X is one of {', '.join(letters)}."


def choice_team_format(letters: str) -> str:
    """choice_format without the "(X)" placeholder, for a final agent that reads other agents' outputs."""
    return (f"Your last line must be 'The answer is' followed by the correct option's letter in parentheses "
            f"(one of {', '.join(letters)}).")


def format_options(options: dict[str, str]) -> str:
    return "\n".join(f"{letter}) {text}" for letter, text in options.items())


class ChoiceBenchmark(Benchmark):
    """Multiple choice: gold is a letter; the example's options let option text count as an answer."""

    letters: ClassVar[str]

    def extract(self, text: str | None, example: Example | None = None) -> str | None:
        options = example.meta.get("options") if example is not None else None
        return extract_choice(text, options, self.letters)

    def score(self, prediction: str | None, example: Example) -> float:
        return 1.0 if prediction is not None and prediction.strip().upper() == example.answer else 0.0
