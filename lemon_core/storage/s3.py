"""The S3 back end: any S3-compatible endpoint through boto3, one PUT (or one multipart upload) per object.

No temporary key: an S3 PUT and a completed multipart upload are already all-or-nothing (readers see
the old object or the new one, an aborted multipart upload leaves no object), so writing to a temporary
key and copying it over would only double the bytes moved per checkpoint. Each object carries its
sha256 in user metadata (``x-amz-meta-sha256``) and readers compare it with what they received.
"""

from __future__ import annotations

import contextlib
import math
import mimetypes
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from lemon_core.storage.base import (
    SHA256_META,
    Location,
    MiB,
    Progress,
    StorageError,
    is_temporary,
    parse_uri,
)


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _positive_number(name: str, default: float) -> float:
    """A finite number > 0 from the environment: NaN or inf would reach botocore as a timeout."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StorageError(f"{name}={raw!r} is not a number; set a positive number such as {default:g}") from None
    if not math.isfinite(value) or value <= 0:
        raise StorageError(f"{name}={raw!r} must be a finite number > 0, e.g. {default:g}")
    return value


def _positive_int(name: str, default: int) -> int:
    value = _positive_number(name, default)
    if value != int(value):
        raise StorageError(f"{name}={os.environ.get(name)!r} must be a whole number, e.g. {default}")
    return int(value)


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
    multipart_threshold: int = 64 * MiB
    multipart_chunksize: int = 16 * MiB

    @classmethod
    def from_env(cls, endpoint_url: str | None = None) -> S3Options:
        """Read ``LEMON_S3_*`` (preferred) and ``AWS_*`` variables; an explicit endpoint wins."""
        style = (_env("LEMON_S3_ADDRESSING_STYLE") or "auto").lower()
        if style not in ("auto", "path", "virtual"):
            raise StorageError(f"LEMON_S3_ADDRESSING_STYLE={style!r}: use auto, path or virtual")
        return cls(
            endpoint_url=endpoint_url or _env("LEMON_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region=_env("LEMON_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=_env("LEMON_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            secret_access_key=_env("LEMON_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            session_token=_env("LEMON_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            addressing_style=style,  # type: ignore[arg-type]
            connect_timeout_s=_positive_number("LEMON_S3_CONNECT_TIMEOUT", 3.0),
            read_timeout_s=_positive_number("LEMON_S3_READ_TIMEOUT", 60.0),
            max_attempts=_positive_int("LEMON_S3_MAX_ATTEMPTS", 4),
            multipart_threshold=int(_positive_number("LEMON_S3_MULTIPART_THRESHOLD_MB", 64) * MiB),
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
    from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError, NoCredentialsError

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
        return _client_error(exc, loc, endpoint)
    if isinstance(exc, BotoCoreError):
        return StorageError(f"S3 request for {loc.uri} at {endpoint} failed: {exc}")
    return exc


def _client_error(exc: Any, loc: Location, endpoint: str) -> StorageError:
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


def _put_args(loc: Location, digest: str) -> dict[str, Any]:
    args: dict[str, Any] = {"Metadata": {SHA256_META: digest}}
    content_type = mimetypes.guess_type(loc.key)[0]
    if content_type:
        args["ContentType"] = content_type
    return args


def _is_missing(exc: Any) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound")


class S3Store:
    """S3 (or MinIO, Ceph, ...) through one boto3 client per setting."""

    def __init__(self, opts: S3Options | None = None) -> None:
        self.opts = opts or S3Options.from_env()
        self.client = s3_client(self.opts)

    def put_bytes(self, loc: Location, data: bytes, digest: str) -> None:
        with _s3_errors(loc, self.client):
            self.client.put_object(Bucket=loc.bucket, Key=loc.key, Body=data, **_put_args(loc, digest))

    def put_file(self, src: Path, loc: Location, digest: str, progress: Progress | None) -> None:
        """Multipart above the threshold; s3transfer aborts a failed multipart upload, and an upload that is
        never completed never becomes an object."""
        with _s3_errors(loc, self.client):
            self.client.upload_file(str(src), loc.bucket, loc.key, ExtraArgs=_put_args(loc, digest),
                                    Config=_transfer_config(self.opts), Callback=progress)

    def get_bytes(self, loc: Location) -> tuple[bytes, str | None]:
        with _s3_errors(loc, self.client):
            response = self.client.get_object(Bucket=loc.bucket, Key=loc.key)
            data = response["Body"].read()
        return data, response.get("Metadata", {}).get(SHA256_META)

    def get_file(self, loc: Location, dest: Path) -> str | None:
        with _s3_errors(loc, self.client):
            head = self.client.head_object(Bucket=loc.bucket, Key=loc.key)
            self.client.download_file(loc.bucket, loc.key, str(dest), Config=_transfer_config(self.opts))
        return head.get("Metadata", {}).get(SHA256_META)

    def exists(self, loc: Location) -> bool:
        from botocore.exceptions import ClientError

        with _s3_errors(loc, self.client):
            try:
                self.client.head_object(Bucket=loc.bucket, Key=loc.key)
            except ClientError as err:
                if _is_missing(err):
                    return False
                raise
        return True

    def list_prefix(self, prefix: str, include_tmp: bool) -> list[str]:
        """Temporary keys can only come from older lemon versions or other tools; still never listed."""
        loc = parse_uri(prefix)
        keys: list[str] = []
        with _s3_errors(loc, self.client):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.key):
                keys.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(f"s3://{loc.bucket}/{k}" for k in keys if include_tmp or not is_temporary(k))

    def delete(self, loc: Location, recursive: bool) -> int:
        if not recursive:
            existed = self.exists(loc)
            with _s3_errors(loc, self.client):
                self.client.delete_object(Bucket=loc.bucket, Key=loc.key)
            return int(existed)
        keys = [parse_uri(u).key for u in self.list_prefix(loc.uri, include_tmp=True)]
        with _s3_errors(loc, self.client):
            for start in range(0, len(keys), 1000):  # S3's per-request limit
                batch = [{"Key": k} for k in keys[start : start + 1000]]
                self.client.delete_objects(Bucket=loc.bucket, Delete={"Objects": batch, "Quiet": True})
        return len(keys)
