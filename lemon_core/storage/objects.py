"""Single objects: bytes, files, text and JSONL at a URI, through the back end the URI names."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lemon_core.storage.atomic import atomic_path
from lemon_core.storage.base import (
    Location,
    Progress,
    StorageError,
    Store,
    parse_uri,
    require_key,
    sha256_bytes,
    sha256_file,
    verify,
)
from lemon_core.storage.local import LocalStore
from lemon_core.storage.s3 import S3Options, S3Store


def store_for(loc: Location, s3: S3Options | None = None) -> Store:
    """The back end for a parsed URI: the only place that asks "is this S3?"."""
    return S3Store(s3) if loc.scheme == "s3" else LocalStore()


def put_bytes(uri: str, data: bytes, *, s3: S3Options | None = None) -> str:
    """Atomically write ``data`` to ``uri``; returns its sha256."""
    loc, digest = parse_uri(uri), sha256_bytes(data)
    require_key(loc)
    store_for(loc, s3).put_bytes(loc, data, digest)
    return digest


def get_bytes(uri: str, *, s3: S3Options | None = None) -> bytes:
    """Read the whole object; S3 content is checked against its stored sha256."""
    loc = parse_uri(uri)
    require_key(loc)
    data, recorded = store_for(loc, s3).get_bytes(loc)
    verify(loc.uri, recorded, sha256_bytes(data))
    return data


def _source_file(local_path: str | os.PathLike[str]) -> Path:
    src = Path(local_path)
    if src.is_dir():
        raise StorageError(f"cannot upload {src}: it is a folder; use upload_dir for folders")
    if not src.is_file():
        raise StorageError(f"cannot upload {src}: no such file")
    return src


def put_file(
    local_path: str | os.PathLike[str], uri: str, *, s3: S3Options | None = None, progress: Progress | None = None
) -> str:
    """Atomically upload a local file (multipart above the threshold); returns its sha256.

    ``progress`` is called with byte counts as they are sent (boto3's transfer callback).
    """
    src, loc = _source_file(local_path), parse_uri(uri)
    require_key(loc)
    digest = sha256_file(src)
    store_for(loc, s3).put_file(src, loc, digest, progress)
    return digest


def get_file(uri: str, local_path: str | os.PathLike[str], *, s3: S3Options | None = None) -> Path:
    """Download to ``local_path`` atomically: temp file, verify the recorded sha256, then rename."""
    fetch_verified(uri, local_path, expected=None, s3=s3)
    return Path(local_path)


def fetch_verified(
    uri: str, local_path: str | os.PathLike[str], *, expected: str | None, s3: S3Options | None = None
) -> str:
    """Download ``uri`` to ``local_path`` only if its content matches the recorded sha256 and ``expected``
    (a manifest's); returns the content's sha256. A mismatch leaves ``local_path`` as it was."""
    loc = parse_uri(uri)
    require_key(loc)
    store = store_for(loc, s3)
    with atomic_path(local_path) as tmp:
        recorded = store.get_file(loc, tmp)
        actual = sha256_file(tmp)
        verify(loc.uri, recorded, actual)
        verify(loc.uri, expected, actual, source="manifest")
    return actual


def exists(uri: str, *, s3: S3Options | None = None) -> bool:
    """True when the object (or local file/folder) is there."""
    loc = parse_uri(uri)
    require_key(loc)
    return store_for(loc, s3).exists(loc)


def list_uris(prefix: str, *, s3: S3Options | None = None, include_tmp: bool = False) -> list[str]:
    """Sorted URIs of every object under ``prefix`` (recursive, string-prefix match like S3).

    Results keep the prefix's spelling (s3://, file:// or plain path). Temporary names of unfinished
    writes are left out unless ``include_tmp``. Also available as ``storage.list``.
    """
    return store_for(parse_uri(prefix), s3).list_prefix(prefix, include_tmp)


def delete(uri: str, *, recursive: bool = False, s3: S3Options | None = None) -> int:
    """Delete one object (or, with ``recursive``, everything under the prefix); returns the count.

    Deleting something that is not there is not an error: retries of a cleanup must succeed.
    """
    loc = parse_uri(uri)
    if not recursive:
        require_key(loc)
    return store_for(loc, s3).delete(loc, recursive)


# ---------------------------------------------------------------------------------- text and JSONL


def write_text(uri: str, text: str, *, s3: S3Options | None = None) -> str:
    return put_bytes(uri, text.encode("utf-8"), s3=s3)


def read_text(uri: str, *, s3: S3Options | None = None) -> str:
    """The object as UTF-8 text; other bytes are an error naming the URI and the first bad byte."""
    data = get_bytes(uri, s3=s3)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise StorageError(f"{uri} is not UTF-8 text: byte {err.start} (line {line}) is "
                           f"{data[err.start:err.start + 1]!r}; re-save the file as UTF-8") from None


def _json_row(row: Mapping[str, Any] | BaseModel) -> str:
    obj = row.model_dump(mode="json") if isinstance(row, BaseModel) else row
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(uri: str, rows: Iterable[Mapping[str, Any] | BaseModel], *, s3: S3Options | None = None) -> int:
    """Write one JSON object per line (pydantic models are dumped in JSON mode); returns the row count."""
    lines = [_json_row(row) for row in rows]
    write_text(uri, "".join(line + "\n" for line in lines), s3=s3)
    return len(lines)


def read_jsonl(uri: str, *, s3: S3Options | None = None) -> list[dict[str, Any]]:
    """Parse a JSONL file; a bad line raises ``StorageError`` naming the URI and line number."""
    rows = []  # split on "\n" only: str.splitlines would also cut at U+2028 or \x85 inside a JSON string
    for number, line in enumerate(read_text(uri, s3=s3).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise StorageError(f"{uri} line {number} is not valid JSON: {err.msg}") from None
    return rows
