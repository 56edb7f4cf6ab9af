"""URIs, checksums, errors and the ``Store`` protocol that the local and S3 back ends implement."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

MANIFEST_NAME = "_lemon_manifest.json"
SHA256_META = "sha256"  # S3 user metadata key (sent as x-amz-meta-sha256)
TMP_RE = re.compile(r"\.tmp-[0-9a-f]{32}$")
MiB = 1024 * 1024


class StorageError(RuntimeError):
    """A read or write failed; the message names the URI (or endpoint) and what to check."""


@dataclass(frozen=True)
class Location:
    """A parsed artifact URI: either an S3 object (bucket + key) or a local path."""

    uri: str
    scheme: Literal["s3", "file"]
    bucket: str = ""
    key: str = ""
    path: Path = field(default_factory=Path)


def parse_uri(uri: str | os.PathLike[str]) -> Location:
    """``s3://bucket/key``, ``file:///abs/path`` or a plain path; anything else is an error."""
    text = os.fspath(uri)
    if not text:
        raise StorageError("empty storage URI: give s3://bucket/key, file:///path or a local path")
    if text.startswith("s3://"):
        bucket, _, key = text[len("s3://") :].partition("/")
        if not bucket:
            raise StorageError(f"storage URI {text!r} has no bucket: expected s3://bucket/key")
        return Location(uri=text, scheme="s3", bucket=bucket, key=key)
    if text.startswith("file://"):
        rest = text[len("file://") :]
        rest = rest[len("localhost") :] if rest.startswith("localhost/") else rest
        return Location(uri=text, scheme="file", path=Path(rest))
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise StorageError(f"unsupported storage URI {text!r}: only s3:// and file:// (or plain paths) work")
    return Location(uri=text, scheme="file", path=Path(text))


def join(uri: str, *parts: str) -> str:
    """Append path segments to a URI or path with exactly one '/' between them."""
    out = os.fspath(uri).rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def is_s3(uri: str | os.PathLike[str]) -> bool:
    return os.fspath(uri).startswith("s3://")


def is_temporary(name: str) -> bool:
    """True for the temporary names that atomic writes use (``<name>.tmp-<32 hex>``): debris of a
    writer that died before publishing, which readers and listings must never treat as data."""
    return bool(TMP_RE.search(name))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(MiB), b""):
                digest.update(block)
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err.strerror or err}") from None
    return digest.hexdigest()


def require_key(loc: Location) -> None:
    if loc.scheme == "s3" and (not loc.key or loc.key.endswith("/")):
        raise StorageError(f"{loc.uri} names no object: expected s3://bucket/path/to/object")


def verify(uri: str, expected: str | None, actual: str, source: str = "metadata") -> None:
    """Raise when a recorded sha256 (object metadata or a manifest) disagrees with the content."""
    if expected and expected != actual:
        raise StorageError(
            f"checksum mismatch for {uri}: {source} sha256 {expected}, content sha256 {actual}; "
            "the object was changed after upload or corrupted in transit"
        )


Progress = Callable[[int], None]


class Store(Protocol):
    """One storage back end. Every write publishes all-or-nothing (a reader sees the old object or
    the new one, never part of one); checksums are computed and compared by the callers."""

    def put_bytes(self, loc: Location, data: bytes, digest: str) -> None: ...

    def put_file(self, src: Path, loc: Location, digest: str, progress: Progress | None) -> None: ...

    def get_bytes(self, loc: Location) -> tuple[bytes, str | None]:
        """The content and the sha256 recorded with it (None when the back end records none)."""
        ...

    def get_file(self, loc: Location, dest: Path) -> str | None:
        """Write the content to ``dest`` (a temporary path the caller publishes); returns the recorded sha256."""
        ...

    def exists(self, loc: Location) -> bool: ...

    def list_prefix(self, prefix: str, include_tmp: bool) -> list[str]: ...

    def delete(self, loc: Location, recursive: bool) -> int: ...
