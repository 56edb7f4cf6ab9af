"""Artifact storage: one interface for ``s3://bucket/key`` and ``file://`` / plain local paths.

Every stage reads and writes its artifacts (task shards, rollout records, checkpoints, metrics,
reports) through these functions, so the same code runs on a laptop and in a pod writing to S3.
kfp.local cannot write to an ``s3://`` pipeline root, which is one more reason components go
through here instead of relying on the orchestrator to move files.

Layout: ``base`` (URIs, checksums, the ``Store`` protocol), ``local`` and ``s3`` (the two back ends),
``objects`` (bytes, files, text, JSONL), ``dirs`` (folders with manifests, the download cache),
``atomic`` (the temp-then-rename helper for any local write), ``cli`` (``python -m lemon_core.storage``).

Guarantees:
- Atomic publish. Local writes go to ``<name>.tmp-<hex>``, are fsync'ed and renamed (``os.replace``);
  an S3 PUT or completed multipart upload is all-or-nothing by itself. A reader never sees half a
  shard and a failed write never replaces the previous good version. Temporary names are hidden
  from ``list``.
- Checksums. S3 objects carry their sha256 in metadata; downloads recompute and compare (objects
  written by other tools, without that metadata, are read unverified).
- Folders (checkpoints) get a manifest written last; ``download_dir`` refuses a folder without one
  (its upload never finished), verifies every file before publishing the folder whole, and
  ``cached_download`` keys a shared cache by the manifest's sha256.
- Network failures become a ``StorageError`` that names the endpoint and what to check, after a
  small number of retries with backoff and a short connect timeout - never a raw botocore trace.

S3 settings come from the environment (``S3Options.from_env``): ``LEMON_S3_ENDPOINT_URL`` (else
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), ``LEMON_S3_ACCESS_KEY_ID`` /
``LEMON_S3_SECRET_ACCESS_KEY`` / ``LEMON_S3_SESSION_TOKEN`` (else the usual ``AWS_*`` chain),
``LEMON_S3_REGION``, ``LEMON_S3_ADDRESSING_STYLE`` (auto|path|virtual; MinIO and most
S3-compatible servers want ``path``), ``LEMON_S3_CONNECT_TIMEOUT`` / ``LEMON_S3_READ_TIMEOUT``
(seconds), ``LEMON_S3_MAX_ATTEMPTS`` and ``LEMON_S3_MULTIPART_THRESHOLD_MB``.
"""

from lemon_core.storage.atomic import atomic_path, temporary_sibling, write_atomic
from lemon_core.storage.base import (
    MANIFEST_NAME,
    SHA256_META,
    Location,
    StorageError,
    Store,
    is_s3,
    is_temporary,
    join,
    parse_uri,
    sha256_bytes,
    sha256_file,
)
from lemon_core.storage.cli import main
from lemon_core.storage.dirs import (
    DirManifest,
    cached_download,
    download_dir,
    parse_manifest,
    sweep_stale_downloads,
    upload_dir,
)
from lemon_core.storage.local import LocalStore
from lemon_core.storage.objects import (
    delete,
    exists,
    get_bytes,
    get_file,
    list_uris,
    put_bytes,
    put_file,
    read_jsonl,
    read_text,
    store_for,
    write_jsonl,
    write_text,
)
from lemon_core.storage.s3 import S3Options, S3Store, s3_client

list = list_uris  # noqa: A001 - the short name the rest of lemon uses: storage.list(prefix)

__all__ = [
    "MANIFEST_NAME", "SHA256_META", "DirManifest", "LocalStore", "Location", "S3Options", "S3Store", "StorageError",
    "Store", "atomic_path", "cached_download", "delete", "download_dir", "exists", "get_bytes", "get_file",
    "is_s3", "is_temporary", "join", "list", "list_uris", "main", "parse_manifest", "parse_uri", "put_bytes",
    "put_file", "read_jsonl", "read_text", "s3_client", "sha256_bytes", "sha256_file", "store_for",
    "sweep_stale_downloads", "temporary_sibling", "upload_dir", "write_atomic", "write_jsonl", "write_text",
]
