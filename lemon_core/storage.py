"""Artifact storage: one interface for ``s3://bucket/key`` and ``file://`` / plain local paths.

Every stage reads and writes its artifacts (task shards, rollout records, checkpoints, metrics,
reports) through these functions, so the same code runs on a laptop and in a pod writing to S3.
kfp.local cannot write to an ``s3://`` pipeline root, which is one more reason components go
through here instead of relying on the orchestrator to move files.

Guarantees:
- Atomic publish. A write goes to ``<key>.tmp-<hex>`` first and is then copied (S3) or renamed
  (local, ``os.replace``) onto the final name, so a reader never sees half a shard and a failed
  upload never replaces the previous good version. Temporary names are hidden from ``list``.
- Checksums. S3 uploads carry their sha256 in object metadata; downloads recompute and compare
  (objects written by other tools, without that metadata, are read unverified).
- Directories (checkpoints) get a manifest written last; ``download_dir`` refuses a directory
  without one, because that means its upload never finished.
- Network failures become a ``StorageError`` that names the endpoint and what to check, after a
  small number of retries with backoff and a short connect timeout - never a raw botocore trace.

S3 settings come from the environment (``S3Options.from_env``): ``LEMON_S3_ENDPOINT_URL`` (else
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), ``LEMON_S3_ACCESS_KEY_ID`` /
``LEMON_S3_SECRET_ACCESS_KEY`` / ``LEMON_S3_SESSION_TOKEN`` (else the usual ``AWS_*`` chain),
``LEMON_S3_REGION``, ``LEMON_S3_ADDRESSING_STYLE`` (auto|path|virtual; MinIO and most
S3-compatible servers want ``path``), ``LEMON_S3_CONNECT_TIMEOUT`` / ``LEMON_S3_READ_TIMEOUT``
(seconds), ``LEMON_S3_MAX_ATTEMPTS`` and ``LEMON_S3_MULTIPART_THRESHOLD_MB``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mimetypes
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

MANIFEST_NAME = "_lemon_manifest.json"
SHA256_META = "sha256"  # S3 user metadata key (sent as x-amz-meta-sha256)
_TMP_RE = re.compile(r"\.tmp-[0-9a-f]{32}$")
_MiB = 1024 * 1024


class StorageError(RuntimeError):
    """A read or write failed; the message names the URI (or endpoint) and what to check."""


# ---------------------------------------------------------------------------------------------- URIs


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


def _tmp_name(name: str) -> str:
    return f"{name}.tmp-{uuid.uuid4().hex}"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_MiB), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------ S3 client


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class S3Options:
    """Everything needed to build an S3 client; hashable so clients are cached per setting."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 60.0
    max_attempts: int = 4
    multipart_threshold: int = 64 * _MiB
    multipart_chunksize: int = 16 * _MiB

    @classmethod
    def from_env(cls, endpoint_url: str | None = None) -> S3Options:
        """Read ``LEMON_S3_*`` (preferred) and ``AWS_*`` variables; an explicit endpoint wins."""
        style = (_env("LEMON_S3_ADDRESSING_STYLE") or "auto").lower()
        if style not in ("auto", "path", "virtual"):
            raise StorageError(f"LEMON_S3_ADDRESSING_STYLE={style!r}: use auto, path or virtual")

        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            try:
                return float(raw) if raw else default
            except ValueError:
                raise StorageError(f"{name}={raw!r} is not a number") from None

        return cls(
            endpoint_url=endpoint_url
            or _env("LEMON_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region=_env("LEMON_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=_env("LEMON_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            secret_access_key=_env("LEMON_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            session_token=_env("LEMON_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            addressing_style=style,  # type: ignore[arg-type]
            connect_timeout_s=number("LEMON_S3_CONNECT_TIMEOUT", 3.0),
            read_timeout_s=number("LEMON_S3_READ_TIMEOUT", 60.0),
            max_attempts=max(1, int(number("LEMON_S3_MAX_ATTEMPTS", 4))),
            multipart_threshold=int(number("LEMON_S3_MULTIPART_THRESHOLD_MB", 64) * _MiB),
        )


_client_lock = threading.Lock()


@lru_cache(maxsize=16)
def _cached_client(opts: S3Options) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=opts.connect_timeout_s,
        read_timeout=opts.read_timeout_s,
        retries={"max_attempts": opts.max_attempts, "mode": "standard"},  # exponential backoff + jitter
        s3={"addressing_style": opts.addressing_style},
        # We verify our own sha256; the newer default CRC headers break several S3-compatible servers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session(
        aws_access_key_id=opts.access_key_id,
        aws_secret_access_key=opts.secret_access_key,
        aws_session_token=opts.session_token,
        region_name=opts.region,
    )
    return session.client("s3", endpoint_url=opts.endpoint_url, config=config)


def s3_client(opts: S3Options | None = None) -> Any:
    """A (cached, thread-safe) boto3 S3 client for these options, default: from the environment."""
    with _client_lock:
        return _cached_client(opts or S3Options.from_env())


def _transfer_config(opts: S3Options) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=opts.multipart_threshold,
        multipart_chunksize=opts.multipart_chunksize,
        max_concurrency=4,
        use_threads=True,
    )


@contextlib.contextmanager
def _s3_errors(loc: Location, client: Any) -> Iterator[None]:
    """Turn botocore/s3transfer exceptions into one ``StorageError`` that says what to do."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - translated below, re-raised if unknown
        raise _translate(exc, loc, client) from None


def _translate(exc: BaseException, loc: Location, client: Any) -> BaseException:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        HTTPClientError,
        NoCredentialsError,
    )

    if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
        exc = exc.__context__  # s3transfer wraps the ClientError that actually happened
    endpoint = client.meta.endpoint_url
    if isinstance(exc, ConnectionError | HTTPClientError):
        return StorageError(
            f"cannot reach S3 endpoint {endpoint}: {exc} (while accessing {loc.uri}); "
            "check LEMON_S3_ENDPOINT_URL / network"
        )
    if isinstance(exc, NoCredentialsError):
        return StorageError(
            f"no S3 credentials for {loc.uri}: set LEMON_S3_ACCESS_KEY_ID/LEMON_S3_SECRET_ACCESS_KEY "
            "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, message = str(err.get("Code", "")), err.get("Message", "")
        if code in ("404", "NoSuchKey", "NotFound"):
            return StorageError(f"{loc.uri} does not exist")
        if code == "NoSuchBucket":
            return StorageError(f"bucket {loc.bucket!r} does not exist at {endpoint} (for {loc.uri})")
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StorageError(
                f"access denied to {loc.uri} at {endpoint} ({code}): check the S3 credentials "
                "(LEMON_S3_ACCESS_KEY_ID / AWS_ACCESS_KEY_ID) and the bucket policy"
            )
        return StorageError(f"S3 error {code} on {loc.uri} at {endpoint}: {message or exc}")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"S3 request for {loc.uri} at {endpoint} failed: {exc}")
    return exc


# --------------------------------------------------------------------------------------- S3 primitives


def _s3_publish(client: Any, opts: S3Options, loc: Location, tmp_key: str, digest: str) -> None:
    """Copy the fully-written temporary object onto the final key, then drop the temporary."""
    extra = {"Metadata": {SHA256_META: digest}, "MetadataDirective": "REPLACE"}
    content_type = mimetypes.guess_type(loc.key)[0]
    if content_type:
        extra["ContentType"] = content_type
    client.copy({"Bucket": loc.bucket, "Key": tmp_key}, loc.bucket, loc.key, ExtraArgs=extra,
                Config=_transfer_config(opts))
    client.delete_object(Bucket=loc.bucket, Key=tmp_key)


def _s3_cleanup(client: Any, loc: Location, tmp_key: str) -> None:
    """Best effort: the endpoint may be the very thing that failed."""
    with contextlib.suppress(Exception):
        client.delete_object(Bucket=loc.bucket, Key=tmp_key)


def _require_key(loc: Location) -> None:
    if loc.scheme == "s3" and (not loc.key or loc.key.endswith("/")):
        raise StorageError(f"{loc.uri} names no object: expected s3://bucket/path/to/object")


def _verify(loc: Location, expected: str | None, actual: str) -> None:
    if expected and expected != actual:
        raise StorageError(
            f"checksum mismatch for {loc.uri}: metadata sha256 {expected}, content sha256 {actual}; "
            "the object was changed after upload or corrupted in transit"
        )


# ------------------------------------------------------------------------------------- local helpers


@contextlib.contextmanager
def _local_atomic(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto ``path``, on failure delete it."""
    tmp = path.with_name(_tmp_name(path.name))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        raise StorageError(f"cannot write {path}: {err}") from None
    finally:
        with contextlib.suppress(OSError):  # already renamed, or never created
            tmp.unlink()


def _local_missing(loc: Location) -> StorageError:
    return StorageError(f"{loc.uri} does not exist (local path {loc.path.resolve()})")


# ------------------------------------------------------------------------------------------ objects


def put_bytes(uri: str, data: bytes, *, s3: S3Options | None = None) -> str:
    """Atomically write ``data`` to ``uri``; returns its sha256."""
    loc, digest = parse_uri(uri), sha256_bytes(data)
    _require_key(loc)
    if loc.scheme == "file":
        with _local_atomic(loc.path) as tmp, open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return digest
    opts = s3 or S3Options.from_env()
    client, tmp_key = s3_client(opts), _tmp_name(loc.key)
    with _s3_errors(loc, client):
        try:
            client.put_object(Bucket=loc.bucket, Key=tmp_key, Body=data, Metadata={SHA256_META: digest})
            _s3_publish(client, opts, loc, tmp_key, digest)
        except BaseException:
            _s3_cleanup(client, loc, tmp_key)
            raise
    return digest


def get_bytes(uri: str, *, s3: S3Options | None = None) -> bytes:
    """Read the whole object; S3 content is checked against its stored sha256."""
    loc = parse_uri(uri)
    _require_key(loc)
    if loc.scheme == "file":
        try:
            return loc.path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise _local_missing(loc) from None
        except OSError as err:
            raise StorageError(f"cannot read {uri}: {err}") from None
    client = s3_client(s3)
    with _s3_errors(loc, client):
        response = client.get_object(Bucket=loc.bucket, Key=loc.key)
        data = response["Body"].read()
    _verify(loc, response.get("Metadata", {}).get(SHA256_META), sha256_bytes(data))
    return data


def put_file(
    local_path: str | os.PathLike[str],
    uri: str,
    *,
    s3: S3Options | None = None,
    progress: Callable[[int], None] | None = None,
) -> str:
    """Atomically upload a local file (multipart above the threshold); returns its sha256.

    ``progress`` is called with byte counts as they are sent (boto3's transfer callback).
    """
    src, loc = Path(local_path), parse_uri(uri)
    _require_key(loc)
    if not src.is_file():
        raise StorageError(f"cannot upload {src}: no such file")
    digest = sha256_file(src)
    if loc.scheme == "file":
        with _local_atomic(loc.path) as tmp:
            shutil.copyfile(src, tmp)
            if progress:
                progress(src.stat().st_size)
        return digest
    opts = s3 or S3Options.from_env()
    client, tmp_key = s3_client(opts), _tmp_name(loc.key)
    with _s3_errors(loc, client):
        try:
            client.upload_file(str(src), loc.bucket, tmp_key, ExtraArgs={"Metadata": {SHA256_META: digest}},
                               Config=_transfer_config(opts), Callback=progress)
            _s3_publish(client, opts, loc, tmp_key, digest)
        except BaseException:
            _s3_cleanup(client, loc, tmp_key)
            raise
    return digest


def get_file(uri: str, local_path: str | os.PathLike[str], *, s3: S3Options | None = None) -> Path:
    """Download to ``local_path`` atomically (temp file, verify sha256, rename)."""
    loc, dest = parse_uri(uri), Path(local_path)
    _require_key(loc)
    if loc.scheme == "file":
        if not loc.path.is_file():
            raise _local_missing(loc)
        with _local_atomic(dest) as tmp:
            shutil.copyfile(loc.path, tmp)
        return dest
    opts = s3 or S3Options.from_env()
    client = s3_client(opts)
    with _local_atomic(dest) as tmp, _s3_errors(loc, client):
        head = client.head_object(Bucket=loc.bucket, Key=loc.key)
        client.download_file(loc.bucket, loc.key, str(tmp), Config=_transfer_config(opts))
        _verify(loc, head.get("Metadata", {}).get(SHA256_META), sha256_file(tmp))
    return dest


def exists(uri: str, *, s3: S3Options | None = None) -> bool:
    """True when the object (or local file/directory) is there."""
    loc = parse_uri(uri)
    if loc.scheme == "file":
        return loc.path.exists()
    _require_key(loc)
    from botocore.exceptions import ClientError

    client = s3_client(s3)
    with _s3_errors(loc, client):
        try:
            client.head_object(Bucket=loc.bucket, Key=loc.key)
        except ClientError as err:
            if str(err.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
    return True


def list_uris(prefix: str, *, s3: S3Options | None = None, include_tmp: bool = False) -> list[str]:
    """Sorted URIs of every object under ``prefix`` (recursive, string-prefix match like S3).

    Results keep the prefix's spelling (s3://, file:// or plain path). Temporary names of unfinished
    writes are left out unless ``include_tmp``. Also available as ``storage.list``.
    """
    loc = parse_uri(prefix)
    if loc.scheme == "s3":
        client = s3_client(s3)
        keys: list[str] = []
        with _s3_errors(loc, client):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.key):
                keys.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(f"s3://{loc.bucket}/{k}" for k in keys if include_tmp or not _TMP_RE.search(k))
    # Local: walk the directory the prefix lives in, spell each file as <that dir's spelling>/<rel>.
    is_dir = loc.path.is_dir()
    if prefix.endswith("/") and not is_dir:  # a directory prefix that does not exist holds nothing
        return []
    root = loc.path if is_dir else loc.path.parent
    spelled_root = prefix.rstrip("/") if is_dir else os.path.dirname(prefix)
    if not root.is_dir():
        return []
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        text = join(spelled_root, rel) if spelled_root else rel
        if path.is_file() and text.startswith(prefix) and (include_tmp or not _TMP_RE.search(path.name)):
            found.append(text)
    return sorted(found)


def delete(uri: str, *, recursive: bool = False, s3: S3Options | None = None) -> int:
    """Delete one object (or, with ``recursive``, everything under the prefix); returns the count.

    Deleting something that is not there is not an error: retries of a cleanup must succeed.
    """
    loc = parse_uri(uri)
    if loc.scheme == "file":
        if loc.path.is_dir():
            if not recursive:
                raise StorageError(f"{uri} is a directory: pass recursive=True to delete it")
            count = sum(1 for p in loc.path.rglob("*") if p.is_file())
            shutil.rmtree(loc.path)
            return count
        if loc.path.exists():
            loc.path.unlink()
            return 1
        return 0
    client = s3_client(s3)
    if not recursive:
        _require_key(loc)
        existed = exists(uri, s3=s3)
        with _s3_errors(loc, client):
            client.delete_object(Bucket=loc.bucket, Key=loc.key)
        return int(existed)
    keys = [parse_uri(u).key for u in list_uris(uri, s3=s3, include_tmp=True)]
    with _s3_errors(loc, client):
        for start in range(0, len(keys), 1000):  # S3's per-request limit
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            client.delete_objects(Bucket=loc.bucket, Delete={"Objects": batch, "Quiet": True})
    return len(keys)


# ------------------------------------------------------------------------------------- directories


def upload_dir(local_dir: str | os.PathLike[str], uri: str, *, s3: S3Options | None = None) -> dict[str, Any]:
    """Upload every file under ``local_dir`` to ``uri/``, then the manifest (sha256 + size per file).

    The manifest goes last, so its presence means the whole directory is there.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"cannot upload directory {root}: it does not exist or is not a directory")
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        files[rel] = {"sha256": put_file(path, join(uri, rel), s3=s3), "size": path.stat().st_size}
    manifest = {"format": "lemon-dir/1", "files": files}
    put_bytes(join(uri, MANIFEST_NAME), json.dumps(manifest, indent=1, sort_keys=True).encode(), s3=s3)
    return manifest


def download_dir(
    uri: str, local_dir: str | os.PathLike[str], *, s3: S3Options | None = None, require_manifest: bool = True
) -> list[Path]:
    """Download a directory written by ``upload_dir``; every file is checked against the manifest.

    ``require_manifest=False`` takes whatever is under the prefix (directories written by other tools).
    """
    dest = Path(local_dir)
    manifest_uri = join(uri, MANIFEST_NAME)
    if exists(manifest_uri, s3=s3):
        manifest = json.loads(get_bytes(manifest_uri, s3=s3))
        files: Mapping[str, Mapping[str, Any]] = manifest.get("files", {})
    elif require_manifest:
        raise StorageError(
            f"{uri} has no {MANIFEST_NAME}: its upload did not finish, or it was not written by "
            "lemon_core.storage.upload_dir; pass require_manifest=False to take whatever is there"
        )
    else:
        base = uri.rstrip("/") + "/"
        files = {u[len(base) :]: {} for u in list_uris(base, s3=s3)}
        if not files:
            raise StorageError(f"nothing to download: {uri} holds no files")
    written = []
    for rel, info in files.items():
        target = (dest / rel).resolve()
        if not target.is_relative_to(dest.resolve()):
            raise StorageError(f"manifest of {uri} names {rel!r}, which escapes {dest}; refusing to write it")
        get_file(join(uri, rel), target, s3=s3)
        if info.get("sha256") and sha256_file(target) != info["sha256"]:
            target.unlink()
            raise StorageError(f"checksum mismatch for {join(uri, rel)}: it differs from {manifest_uri}")
        written.append(target)
    return written


# ---------------------------------------------------------------------------------- text and JSONL


def write_text(uri: str, text: str, *, s3: S3Options | None = None) -> str:
    return put_bytes(uri, text.encode("utf-8"), s3=s3)


def read_text(uri: str, *, s3: S3Options | None = None) -> str:
    return get_bytes(uri, s3=s3).decode("utf-8")


def _json_row(row: Mapping[str, Any] | BaseModel) -> str:
    obj = row.model_dump(mode="json") if isinstance(row, BaseModel) else row
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(
    uri: str, rows: Iterable[Mapping[str, Any] | BaseModel], *, s3: S3Options | None = None
) -> int:
    """Write one JSON object per line (pydantic models are dumped in JSON mode); returns the row count."""
    lines = [_json_row(row) for row in rows]
    write_text(uri, "".join(line + "\n" for line in lines), s3=s3)
    return len(lines)


def read_jsonl(uri: str, *, s3: S3Options | None = None) -> list[dict[str, Any]]:
    """Parse a JSONL file; a bad line raises ``StorageError`` naming the URI and line number."""
    rows = []
    for number, line in enumerate(read_text(uri, s3=s3).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise StorageError(f"{uri} line {number} is not valid JSON: {err.msg}") from None
    return rows


list = list_uris  # noqa: A001 - the short name the rest of lemon uses: storage.list(prefix)


# ---------------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lemon_core.storage download|upload SRC DEST``: what init containers run to sync
    model folders between S3 and a volume (the Helm chart's vLLM model-sync step)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lemon_core.storage", description=main.__doc__)
    sub = ap.add_subparsers(dest="op", required=True)
    down = sub.add_parser("download", help="download a directory URI into a local folder")
    down.add_argument("uri")
    down.add_argument("local_dir")
    down.add_argument("--require-manifest", action="store_true",
                      help="refuse a prefix without lemon's upload manifest (default: take what is there)")
    up = sub.add_parser("upload", help="upload a local folder to a directory URI (manifest written last)")
    up.add_argument("local_dir")
    up.add_argument("uri")
    args = ap.parse_args(argv)
    try:
        if args.op == "download":
            files = download_dir(args.uri, args.local_dir, require_manifest=args.require_manifest)
            print(f"downloaded {len(files)} files from {args.uri} to {args.local_dir}")
        else:
            manifest = upload_dir(args.local_dir, args.uri)
            print(f"uploaded {len(manifest.get('files', {}))} files from {args.local_dir} to {args.uri}")
    except StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
