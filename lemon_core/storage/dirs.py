"""Folders (checkpoints, model folders): upload with a manifest written last, download verified then
published whole, and a download cache keyed by content for pods that share one volume."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lemon_core.storage.atomic import atomic_path
from lemon_core.storage.base import MANIFEST_NAME, StorageError, is_temporary, join, sha256_bytes
from lemon_core.storage.objects import exists, fetch_verified, get_bytes, list_uris, put_bytes, put_file
from lemon_core.storage.s3 import S3Options

MANIFEST_FORMAT = "lemon-dir/1"


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class DirManifest(BaseModel):
    """What ``upload_dir`` writes last as ``_lemon_manifest.json``: every file's sha256 and size."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["lemon-dir/1"] = MANIFEST_FORMAT
    files: dict[str, ManifestEntry]

    @field_validator("files", mode="before")
    @classmethod
    def _paths_stay_inside(cls, files: Any) -> Any:
        """Checked before the entries, so a hostile path is reported as such whatever its entry holds."""
        if isinstance(files, Mapping):
            for rel in files:
                parts = PurePosixPath(str(rel)).parts
                if not parts or rel.startswith("/") or ".." in parts or "\\" in rel or rel == MANIFEST_NAME:
                    raise ValueError(f"names {rel!r}, which escapes the folder (or is not a file path in it)")
        return files

    def dumps(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True).encode()


def parse_manifest(data: bytes, uri: str) -> DirManifest:
    """The manifest at ``uri``; anything malformed is one error naming the URI and the problem."""
    fix = "re-upload the folder with lemon_core.storage.upload_dir"
    try:
        return DirManifest.model_validate_json(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise StorageError(f"{uri} is not a valid lemon manifest ({where}: {first['msg']}); {fix}") from None


# ------------------------------------------------------------------------------------------ upload


def _upload_plan(root: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file to upload. A symlink to a file is uploaded as that file's
    content (Hugging Face snapshot folders are links into a blob store); a symlink to a folder, a
    dangling link and special files (FIFOs would block for ever) are errors, never silently skipped."""
    plan = []
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            if Path(folder, name).is_symlink():
                raise StorageError(f"cannot upload {Path(folder, name)}: it is a symlink to a folder; "
                                   "copy the folder in (cp -rL) or remove the link")
        for name in names:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST_NAME or is_temporary(name):
                continue  # our own manifest is rewritten; a temporary name is a dead writer's debris
            plan.append((rel, _regular_file(path)))
    return sorted(plan)


def _regular_file(path: Path) -> Path:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise StorageError(f"cannot upload {path}: it is a symlink to {os.readlink(path)!r}, which does "
                           "not exist; fix or remove the link") from None
    except OSError as err:
        raise StorageError(f"cannot upload {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise StorageError(f"cannot upload {path}: not a regular file (a FIFO, socket or device); remove it")
    return path


def upload_dir(local_dir: str | os.PathLike[str], uri: str, *, s3: S3Options | None = None) -> dict[str, Any]:
    """Upload every file under ``local_dir`` to ``uri/``, then the manifest (sha256 + size per file).

    The manifest goes last, so its presence means the whole folder is there.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"cannot upload folder {root}: it does not exist or is not a folder")
    files = {}
    for rel, path in _upload_plan(root):
        size = path.stat().st_size
        files[rel] = ManifestEntry(sha256=put_file(path, join(uri, rel), s3=s3), size=size)
    manifest = DirManifest(files=files)
    put_bytes(join(uri, MANIFEST_NAME), manifest.dumps(), s3=s3)
    return manifest.model_dump(mode="json")


# ---------------------------------------------------------------------------------------- download


def _read_manifest(uri: str, s3: S3Options | None) -> tuple[DirManifest, bytes]:
    manifest_uri = join(uri, MANIFEST_NAME)
    if not exists(manifest_uri, s3=s3):
        raise StorageError(
            f"{uri} has no {MANIFEST_NAME}: its upload did not finish (or the prefix is wrong), or it was not "
            "written by lemon_core.storage.upload_dir; pass require_manifest=False (command line: "
            "--allow-missing-manifest) to take whatever is there"
        )
    data = get_bytes(manifest_uri, s3=s3)
    return parse_manifest(data, manifest_uri), data


def _listed_files(uri: str, s3: S3Options | None) -> dict[str, ManifestEntry | None]:
    base = uri.rstrip("/") + "/"
    files = {u[len(base):]: None for u in list_uris(base, s3=s3) if u[len(base):] != MANIFEST_NAME}
    if not files:
        raise StorageError(f"nothing to download: {uri} holds no files")
    return files


def _check_destination(dest: Path) -> None:
    """A download replaces the destination folder whole, so it must not hold anything else."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise StorageError(f"cannot download into {dest}: it is a file; give a folder path")
    if os.path.ismount(dest):
        raise StorageError(f"cannot download into {dest}: it is a mount point, which cannot be replaced "
                           "atomically; download into a subfolder of it")
    if any(dest.iterdir()) and not (dest / MANIFEST_NAME).is_file():
        raise StorageError(f"cannot download into {dest}: it holds files that no lemon download put there, and "
                           "a download replaces the whole folder; give an empty or new folder")


def _fetch_all(uri: str, files: Mapping[str, ManifestEntry | None], staging: Path, s3: S3Options | None) -> DirManifest:
    """Download and verify every file into ``staging``; returns the manifest of what was written."""
    got = {}
    for rel, entry in files.items():
        target = staging / rel
        if not target.resolve().is_relative_to(staging.resolve()):
            raise StorageError(f"{uri} names {rel!r}, which escapes the download folder; refusing to write it")
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = fetch_verified(join(uri, rel), target, expected=entry.sha256 if entry else None, s3=s3)
        size = target.stat().st_size
        if entry and size != entry.size:
            raise StorageError(f"size mismatch for {join(uri, rel)}: manifest says {entry.size} bytes, got {size}")
        got[rel] = ManifestEntry(sha256=digest, size=size)
    return DirManifest(files=got)


def download_dir(
    uri: str, local_dir: str | os.PathLike[str], *, s3: S3Options | None = None, require_manifest: bool = True
) -> list[Path]:
    """Download a folder written by ``upload_dir``: every file is verified against the manifest in a
    temporary sibling folder, which then replaces ``local_dir`` whole. Any failure leaves ``local_dir``
    exactly as it was (the previous good copy, or nothing). The manifest is kept in the copy, marking
    it as a finished lemon download.

    ``require_manifest=False`` takes whatever is under the prefix (folders written by other tools),
    verified only by the objects' own recorded sha256.
    """
    dest = Path(local_dir)
    _check_destination(dest)
    if require_manifest or exists(join(uri, MANIFEST_NAME), s3=s3):
        manifest, raw = _read_manifest(uri, s3)
        files: Mapping[str, ManifestEntry | None] = manifest.files
    else:
        files, raw = _listed_files(uri, s3), b""
    with atomic_path(dest, directory=True) as staging:
        fetched = _fetch_all(uri, files, staging, s3)
        (staging / MANIFEST_NAME).write_bytes(raw or fetched.dumps())
    return [dest / rel for rel in files]


def _newest_mtime(root: Path) -> float:
    newest = root.lstat().st_mtime
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                newest = max(newest, Path(folder, name).lstat().st_mtime)
            except FileNotFoundError:  # its writer is still at work and just renamed it
                continue
    return newest


def sweep_stale_downloads(cache_root: str | os.PathLike[str], stale_after_s: float) -> list[Path]:
    """Delete staging folders of downloads that died (kill -9, evicted pod): temporary names under
    ``cache_root`` in which nothing has been written for ``stale_after_s``. A live download writes
    continuously, so it is never that quiet; without this a shared PVC fills with half checkpoints."""
    root, now, removed = Path(cache_root), time.time(), []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        try:
            stale = is_temporary(path.name) and now - _newest_mtime(path) > stale_after_s
        except FileNotFoundError:  # published or discarded meanwhile
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def cached_download(
    uri: str, cache_root: str | os.PathLike[str], *, s3: S3Options | None = None, stale_after_s: float = 6 * 3600
) -> Path:
    """A local copy of the folder at ``uri`` under ``cache_root``, keyed by the sha256 of its manifest.

    The manifest lists every file's sha256, so its own hash names the folder's content: an object
    rewritten at the same URI (next week's run writing ``iter-001/checkpoint`` again) gets a new key
    and is downloaded afresh, never served stale. Concurrent processes on one cache (pods sharing a
    PVC) each download into their own temporary folder; the first rename wins and the others discard
    their copy and use the winner's. A finished entry is trusted as is (it was verified before it was
    published). Staging folders of dead downloads older than ``stale_after_s`` are swept first.
    """
    manifest, raw = _read_manifest(uri, s3)
    entry = Path(cache_root) / sha256_bytes(raw)
    if (entry / MANIFEST_NAME).is_file():
        return entry
    sweep_stale_downloads(cache_root, stale_after_s)
    # An entry without its manifest was damaged by hand (publishing is atomic): replace it.
    with atomic_path(entry, directory=True, replace=entry.exists()) as staging:
        _fetch_all(uri, manifest.files, staging, s3)
        (staging / MANIFEST_NAME).write_bytes(raw)
    return entry
