"""Benchmark data for a fresh clone: fetch each benchmark's raw files from its authors' repository at a pinned
commit, verify every byte against a pinned sha256, and install the benchmark atomically in the cache.

Why not the Hugging Face copies: they are re-exports (other column layouts, answer indexes instead of
letters), not the files whose sha256 values the tests and the reported numbers rest on. The files listed in
``SOURCES`` are exactly those of ``shared/datasets`` (each one checked against its repository's git blob at
the pinned commit), so a pulled benchmark and the shared copy load the same examples in the same order.

Layout: ``$LEMON_CACHE_DIR/datasets/<name>/`` (default ``~/.cache/lemon/datasets``), the same layout as
``shared/datasets/<name>/``, plus ``lemon_data.json`` written last. The benchmark loader
(``lemon_core.benchmarks.base.benchmark_folder``) uses a cached benchmark only when that marker is there.
A pull builds the folder under a temporary name beside its final place (each file downloaded to a temporary
file there, verified, then renamed into place) and renames the whole folder at the end, so a failed, corrupt
or interrupted download leaves nothing that the loader would read. Files that are already installed and still
match their sha256 are copied into the new folder rather than fetched again.

URLs: ``<base>/<owner>/<repo>/<commit>/<path>``, base ``https://raw.githubusercontent.com`` unless
``$LEMON_DATA_BASE_URL`` or ``--base-url`` names a mirror (a test serves the files from 127.0.0.1).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel

from lemon_core.benchmarks.base import PULL_MARKER as MARKER
from lemon_core.benchmarks.base import data_places, pulled_datasets_dir
from lemon_core.errors import LemonError
from lemon_core.models import _install_atomically
from lemon_core.progress import Progress

DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
BASE_URL_ENV = "LEMON_DATA_BASE_URL"
_CHUNK = 1 << 16


class DataError(LemonError):
    """Benchmark data cannot be fetched or installed; the message names the file, the URL and the fix."""


@dataclass(frozen=True)
class RemoteFile:
    """One file at a pinned commit of a GitHub repository, and where it goes in the benchmark folder."""

    repo: str  # owner/name
    commit: str
    path: str  # in the repository
    dest: str  # relative to the benchmark folder (the shared/datasets layout)
    size: int
    sha256: str

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"


@dataclass(frozen=True)
class DatasetSource:
    """A benchmark's files; ``unpack`` names a fetched zip whose members are extracted into the folder."""

    name: str
    files: tuple[RemoteFile, ...]
    unpack: str | None = None


def _files(repo: str, commit: str, *rows: tuple[str, str, int, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(repo, commit, path, dest, size, sha) for path, dest, size, sha in rows)


# Repository, commit, path, size and sha256 of every file as in shared/datasets/<name>/SOURCE.md; each file's
# git blob at that commit was checked to equal the shared copy (git hash-object against git ls-tree).
SOURCES: dict[str, DatasetSource] = {
    s.name: s
    for s in (
        DatasetSource(
            name="mmlu",
            files=_files(
                "hiyouga/LLaMA-Factory", "465ee8119aa489a41bee0b01b3c105a2f3dd137f",
                ("evaluation/mmlu/mmlu.zip", "mmlu.zip", 2336375,
                 "9e2b2d78bf59d80baf271a13005568ef0aca17bd663f2e5ebfecdc07a68f0edc"),
            ) + _files(
                "hendrycks/test", "4450500f923c49f1fb1dd3d99108a0bd9717b660",
                ("LICENSE", "LICENSE", 1070, "5d841b9eee8bf0d721359b79fbae956a8b426d3139bfefee32149c7d4f2a1a9c"),
            ),
            unpack="mmlu.zip",
        ),
        DatasetSource(
            name="gsm8k",
            files=_files(
                "openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c",
                ("grade_school_math/data/test.jsonl", "test.jsonl", 749738,
                 "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"),
                ("grade_school_math/data/train.jsonl", "train.jsonl", 4166206,
                 "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"),
                ("LICENSE", "LICENSE", 1062, "86bbb73e855821d7c401912fd4bf82e34313e6e3b6fd6f909f2b6cc9e209a53b"),
            ),
        ),
        DatasetSource(
            name="aqua",
            files=_files(
                "google-deepmind/AQuA", "26b64ed1f22208c6742f47df547dfd65088ec30d",
                ("test.json", "test.json", 130192, "de41581881ef95c5588c44ddc701c77fd480839241dd422a0d181262af24520c"),
                ("dev.json", "dev.json", 132008, "4a52301d8a49ae0b286f8e697f9c5da1b109b247b825b47b4c6de34312dceec5"),
                ("LICENSE", "LICENSE", 552, "189bff4f09eccdbc1790f7a9085ddd031ddf050f27929608fa4ba8a57e14a7c3"),
            ),
        ),
        DatasetSource(
            name="multiarith",  # the repository has no LICENSE (see shared/datasets/multiarith/SOURCE.md)
            files=_files(
                "kojima-takeshi188/zero_shot_cot", "5ef330fcdeec0cd26aee27943504f91f8ec1c33c",
                ("dataset/MultiArith/MultiArith.json", "MultiArith.json", 254012,
                 "dc9db1b6cc68b1ecc2dec830d15aaf8c9a0932aa31d5ffce88ef3628179d36f4"),
            ),
        ),
        DatasetSource(
            name="svamp",
            files=_files(
                "arkilpatel/SVAMP", "689d7ccac74b9983a2ac7cc3b264f441b99e7c53",
                ("SVAMP.json", "SVAMP.json", 339970,
                 "5be77703a6d891ae476d7c082787ad361392aa02453b132516cdd5f4e7934e3e"),
                ("LICENSE", "LICENSE", 1068, "07ce3a34de7a865345634f9278bc26ddcacc2d0defd348c28e3f4603448b9ba4"),
            ),
        ),
        DatasetSource(
            name="humaneval",
            files=_files(
                "openai/human-eval", "6d43fb980f9fee3c892a914eda09951f772ad10d",
                ("data/HumanEval.jsonl.gz", "HumanEval.jsonl.gz", 44877,
                 "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"),
                ("LICENSE", "LICENSE", 1083, "bcba3de214851cce46ed5af42d6698044616eeace887c3231bc7a20474ab639e"),
            ),
        ),
    )
}
NAMES: tuple[str, ...] = tuple(SOURCES)


class PullResult(BaseModel):
    """What ``pull_dataset`` did for one benchmark: ``state`` is ``pulled`` (files fetched and installed),
    ``verified`` (already in the cache, every sha256 still matches) or ``available`` (the loader already finds
    it before the cache: --data-dir, $LEMON_DATA_DIR or the shared folder; nothing fetched)."""

    name: str
    state: Literal["pulled", "verified", "available"]
    folder: Path
    fetched_files: int = 0
    fetched_bytes: int = 0
    where: str = ""  # for "available": which place the loader reads it from


def source(name: str) -> DatasetSource:
    if name not in SOURCES:
        raise DataError(f"unknown benchmark {name!r}; `lemon data pull` knows {', '.join(NAMES)}")
    return SOURCES[name]


def datasets_dir() -> Path:
    """The pull cache: ``$LEMON_CACHE_DIR/datasets`` (default ``~/.cache/lemon/datasets``)."""
    return pulled_datasets_dir()


def resolve_base_url(base_url: str | None = None) -> str:
    """``base_url``, else ``$LEMON_DATA_BASE_URL``, else raw.githubusercontent.com (no trailing slash)."""
    return (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")


def sha256_of(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def _matches(path: Path, size: int, sha256: str) -> bool:
    """True when ``path`` is a file of ``size`` bytes hashing to ``sha256`` (size first: no hashing of a
    file that is plainly wrong)."""
    return path.is_file() and path.stat().st_size == size and sha256_of(path) == sha256


def _members(zf: zipfile.ZipFile, zip_name: str) -> list[zipfile.ZipInfo]:
    """The zip's file members, refusing any whose name would land outside the benchmark folder."""
    members = []
    for info in zf.infolist():
        parts = PurePosixPath(info.filename).parts
        if info.filename.startswith("/") or ".." in parts or "\\" in info.filename:
            raise DataError(f"{zip_name} has a member named {info.filename!r} that points outside its folder; "
                            "the archive is not the pinned one - delete it and pull again")
        if not info.is_dir():
            members.append(info)
    return members


def _unpack(zip_path: Path, folder: Path) -> int:
    """Extract the zip's files under ``folder``, each through a temporary name; returns the file count."""
    with zipfile.ZipFile(zip_path) as zf:
        members = _members(zf, zip_path.name)
        for info in members:
            target = folder / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            with zf.open(info) as src, partial.open("wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            os.replace(partial, target)
    return len(members)


def verify_installed(name: str, folder: Path | None = None) -> list[str]:
    """Problems of an installed benchmark (empty: every pinned file and every unpacked member matches).

    Unpacked members are compared with the (verified) zip's own bytes, so the zip's sha256 pins them too."""
    entry = source(name)
    folder = folder if folder is not None else datasets_dir() / name
    problems = []
    for f in entry.files:
        if not _matches(folder / f.dest, f.size, f.sha256):
            problems.append(f"{f.dest}: missing or not the pinned bytes (sha256 {f.sha256})")
    if entry.unpack and not problems:
        with zipfile.ZipFile(folder / entry.unpack) as zf:
            for info in _members(zf, entry.unpack):
                on_disk = folder / info.filename
                if not on_disk.is_file() or on_disk.stat().st_size != info.file_size:
                    problems.append(f"{info.filename}: missing or wrong size (from {entry.unpack})")
                    continue
                with zf.open(info) as src:
                    want = hashlib.file_digest(src, "sha256").hexdigest()
                if sha256_of(on_disk) != want:
                    problems.append(f"{info.filename}: differs from its member of {entry.unpack}")
    return problems


def download(client: Any, url: str, target: Path, size: int, sha256: str, bar: Progress) -> None:
    """Stream ``url`` into a temporary file beside ``target``, check size and sha256, then rename it.

    A network error, a short body or different bytes delete the temporary file and raise a DataError that
    names the URL, both sha256 values where there are two, and what to do."""
    import httpx

    partial = target.with_name(target.name + ".partial")
    sha = hashlib.sha256()
    received = 0
    try:
        with client.stream("GET", url) as response, partial.open("wb") as out:
            if response.status_code != 200:
                raise DataError(f"GET {url}: HTTP {response.status_code}; check that the URL is reachable "
                                f"(${BASE_URL_ENV} / --base-url point at a mirror) and pull again")
            for block in response.iter_bytes(_CHUNK):
                out.write(block)
                sha.update(block)
                received += len(block)
                bar.update(len(block))
    except httpx.HTTPError as e:
        partial.unlink(missing_ok=True)
        raise DataError(f"GET {url} failed after {received} of {size} bytes ({type(e).__name__}: {e}); "
                        "nothing was installed - check the network (or the mirror) and pull again") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    digest = sha.hexdigest()
    if received != size or digest != sha256:
        partial.unlink(missing_ok=True)
        raise DataError(f"{url} is not the pinned file: expected {size} bytes with sha256 {sha256}, got "
                        f"{received} bytes with sha256 {digest}; nothing was installed - if ${BASE_URL_ENV} or "
                        "--base-url names a mirror, fix its copy; otherwise pull again (the download was "
                        "probably cut or altered on the way)")
    os.replace(partial, target)


def pull_dataset(name: str, base_url: str | None = None, progress: bool = True, client: Any = None) -> PullResult:
    """Install benchmark ``name`` in the cache, or verify the installed copy; see the module docstring."""
    entry = source(name)
    final = datasets_dir() / name
    damaged = (final / MARKER).is_file()
    if damaged and not verify_installed(name, final):
        return PullResult(name=name, state="verified", folder=final)
    base = resolve_base_url(base_url)
    final.parent.mkdir(parents=True, exist_ok=True)
    reuse = [f for f in entry.files if _matches(final / f.dest, f.size, f.sha256)]
    fetch = [f for f in entry.files if f not in reuse]
    import httpx

    own_client = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(60.0, connect=15.0))
    bar = Progress(sum(f.size for f in fetch), f"pull {name}", unit="B", mode=None if progress else "off",
                   min_interval_s=2.0)
    try:
        with tempfile.TemporaryDirectory(prefix=f".pull-{name}-", dir=final.parent) as tmp:
            staged = Path(tmp) / name
            staged.mkdir()
            for f in reuse:
                shutil.copy2(final / f.dest, staged / f.dest)
            for f in fetch:
                (staged / f.dest).parent.mkdir(parents=True, exist_ok=True)
                download(client, f.url(base), staged / f.dest, f.size, f.sha256, bar)
            unpacked = _unpack(staged / entry.unpack, staged) if entry.unpack else 0
            meta = {
                "name": name,
                "files": [{"dest": f.dest, "url": f.url(DEFAULT_BASE_URL), "size": f.size, "sha256": f.sha256}
                          for f in entry.files],
                "fetched_from": base,
                "unpacked_files": unpacked,
            }
            (staged / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
            if damaged:  # marked complete but no longer verifies: unmark it so the rename below replaces it
                (final / MARKER).unlink(missing_ok=True)
            _install_atomically(staged, final, marker=MARKER)
    except BaseException:
        if bar.mode == "bar":
            bar.close()  # end the terminal bar before the error; in a log, a "done" line would be false
        raise
    else:
        bar.close()
    finally:
        if own_client:
            client.close()
    return PullResult(name=name, state="pulled", folder=final, fetched_files=len(fetch),
                      fetched_bytes=sum(f.size for f in fetch))


def pull(names: Iterable[str], data_dir: str | os.PathLike[str] | None = None, base_url: str | None = None,
         progress: bool = True) -> list[PullResult]:
    """Make each benchmark loadable: skip those the loader already finds before the cache (``data_dir``,
    $LEMON_DATA_DIR, the shared folder: CI has those and no internet), pull or verify the rest.

    With ``data_dir`` the loader reads only there, so a benchmark missing from it is an error, not a pull
    into a cache that would never be read."""
    results = []
    for name in names:
        source(name)
        places = data_places(name, data_dir)
        if data_dir is not None and places[0].folder is None:
            raise DataError(f"data_dir {str(data_dir)!r} has no {name}/ folder and the loader reads only there; "
                            f"put the files there, or remove data_dir so that `lemon data pull {name}` can "
                            "install it in the cache")
        ahead = next((p for p in (places if data_dir is not None else places[:-1]) if p.folder is not None), None)
        if ahead is not None and ahead.folder is not None:
            results.append(PullResult(name=name, state="available", folder=ahead.folder, where=ahead.label))
        else:
            results.append(pull_dataset(name, base_url=base_url, progress=progress))
    return results


def config_benchmarks(config: str | os.PathLike[str]) -> tuple[list[str], str | None]:
    """(benchmark names, data_dir) a pipeline or train config needs: a pipeline config's ``prepare`` and
    ``evaluate`` benchmarks plus ``train.data.benchmarks`` when the file sets them (the pipeline trains on
    the prepared shards, so the train section's default names nothing); a train config's ``data``."""
    from lemon_core.config import PipelineConfig, TrainConfig, load_settings, read_config_source

    raw, _ = read_config_source(config)
    names: list[str] = []
    if "prepare" in raw:
        cfg = load_settings(PipelineConfig, config)
        names += cfg.prepare.benchmarks + list(cfg.evaluate.benchmarks or [])
        if "data" in cfg.train.model_fields_set and "benchmarks" in cfg.train.data.model_fields_set:
            names += cfg.train.data.benchmarks
        data_dir = cfg.prepare.data_dir
    else:
        train = load_settings(TrainConfig, config)
        names += [] if train.data.tasks_jsonl else train.data.benchmarks
        data_dir = train.data.data_dir
    return list(dict.fromkeys(n.strip().lower() for n in names)), data_dir
