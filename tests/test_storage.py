"""lemon_core.storage against a real S3 server on loopback (moto server mode) and the local disk.

The fault tests stop the server for real: listener closed and every open connection cut, so the
client sees what it would see when an S3 endpoint goes away mid-upload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.server import ThreadedMotoServer
from pydantic import BaseModel
from werkzeug.serving import make_server

from lemon_core import storage
from lemon_core.storage import S3Options, StorageError

MiB = 1024 * 1024


def options(port: int, **changes: object) -> S3Options:
    """Client settings for the loopback server: path-style, short timeouts, few retries."""
    base = S3Options(
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key_id="testing",
        secret_access_key="testing",
        addressing_style="path",
        connect_timeout_s=1.0,
        read_timeout_s=10.0,
        max_attempts=2,
    )
    return dataclasses.replace(base, **changes)


def raw_client(opts: S3Options):
    """A plain boto3 client for setting up and tampering, independent of lemon's code."""
    return boto3.client(
        "s3", endpoint_url=opts.endpoint_url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )


def new_bucket(opts: S3Options) -> str:
    name = f"lemon-{uuid.uuid4().hex[:12]}"
    raw_client(opts).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def moto_server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto_server) -> S3Options:
    return options(moto_server.get_host_and_port()[1])


@pytest.fixture
def bucket(s3: S3Options) -> str:
    return new_bucket(s3)


class StoppableS3Server:
    """moto's S3 app on a werkzeug server whose stop() also cuts every open connection.

    ThreadedMotoServer.stop() leaves keep-alive connections served by their handler threads, so a
    client with pooled connections would not notice. moto's backend state lives in the process,
    so a server restarted on the same port sees the same buckets and objects.
    """

    def __init__(self, port: int = 0) -> None:
        self.connections: set[socket.socket] = set()
        connections = self.connections

        class TrackingHandler(MotoRequestHandler):
            def setup(self) -> None:
                super().setup()
                connections.add(self.connection)

            def finish(self) -> None:
                connections.discard(self.connection)
                super().finish()

        app = DomainDispatcherApplication(create_backend_app)
        self.server = make_server("127.0.0.1", port, app, threaded=True, request_handler=TrackingHandler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=5)


# -------------------------------------------------------------------------------------- round trips


def test_bytes_text_jsonl_round_trip(s3: S3Options, bucket: str) -> None:
    class Row(BaseModel):
        id: int
        text: str

    uri = f"s3://{bucket}/shards/a.bin"
    digest = storage.put_bytes(uri, b"\x00\x01hello", s3=s3)
    assert digest == hashlib.sha256(b"\x00\x01hello").hexdigest()
    assert storage.get_bytes(uri, s3=s3) == b"\x00\x01hello"
    head = raw_client(s3).head_object(Bucket=bucket, Key="shards/a.bin")
    assert head["Metadata"]["sha256"] == digest

    storage.write_text(f"s3://{bucket}/t.txt", "grüße\n", s3=s3)
    assert storage.read_text(f"s3://{bucket}/t.txt", s3=s3) == "grüße\n"

    rows = [{"a": 1, "b": [1, 2]}, Row(id=2, text="x")]
    assert storage.write_jsonl(f"s3://{bucket}/r.jsonl", rows, s3=s3) == 2
    expected = [{"a": 1, "b": [1, 2]}, {"id": 2, "text": "x"}]
    assert storage.read_jsonl(f"s3://{bucket}/r.jsonl", s3=s3) == expected


def test_missing_key_and_bucket_name_the_uri(s3: S3Options, bucket: str) -> None:
    with pytest.raises(StorageError, match=f"s3://{bucket}/nope.json does not exist"):
        storage.get_bytes(f"s3://{bucket}/nope.json", s3=s3)
    with pytest.raises(StorageError, match="does not exist"):
        storage.get_file(f"s3://{bucket}/nope.json", "/tmp/never-written", s3=s3)
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-xyz' does not exist"):
        storage.put_bytes("s3://no-such-bucket-xyz/k", b"x", s3=s3)
    assert not storage.exists(f"s3://{bucket}/nope.json", s3=s3)


def test_list_prefix_exists_delete_hide_temporaries(s3: S3Options, bucket: str) -> None:
    for key in ["run1/a.jsonl", "run1/b.jsonl", "run1/sub/c.jsonl", "run2/a.jsonl"]:
        storage.put_bytes(f"s3://{bucket}/{key}", key.encode(), s3=s3)
    # An unfinished write from a crashed writer: present in the bucket, never listed.
    raw_client(s3).put_object(Bucket=bucket, Key=f"run1/d.jsonl.tmp-{uuid.uuid4().hex}", Body=b"half")

    listed = storage.list(f"s3://{bucket}/run1/", s3=s3)
    assert listed == [f"s3://{bucket}/run1/{k}" for k in ["a.jsonl", "b.jsonl", "sub/c.jsonl"]]
    assert len(storage.list(f"s3://{bucket}/run1/", s3=s3, include_tmp=True)) == 4
    assert storage.list(f"s3://{bucket}/run", s3=s3)[-1] == f"s3://{bucket}/run2/a.jsonl"
    # Publishing cleaned up its own temporaries: only the hand-made one exists.
    all_keys = [o["Key"] for o in raw_client(s3).list_objects_v2(Bucket=bucket)["Contents"]]
    assert sum(".tmp-" in k for k in all_keys) == 1

    assert storage.exists(f"s3://{bucket}/run2/a.jsonl", s3=s3)
    assert storage.delete(f"s3://{bucket}/run2/a.jsonl", s3=s3) == 1
    assert storage.delete(f"s3://{bucket}/run2/a.jsonl", s3=s3) == 0  # idempotent
    assert storage.delete(f"s3://{bucket}/run1/", recursive=True, s3=s3) == 4
    assert storage.list(f"s3://{bucket}/", s3=s3) == []


def test_directory_upload_download_with_manifest(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    src = tmp_path / "ckpt"
    (src / "tokenizer").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(4096))
    (src / "config.json").write_text('{"a": 1}')
    (src / "tokenizer" / "vocab.txt").write_text("a\nb\n")

    manifest = storage.upload_dir(src, f"s3://{bucket}/ckpt/step-1", s3=s3)
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tokenizer/vocab.txt"]

    out = tmp_path / "restored"
    written = storage.download_dir(f"s3://{bucket}/ckpt/step-1", out, s3=s3)
    assert len(written) == 3
    for rel in manifest["files"]:
        assert (out / rel).read_bytes() == (src / rel).read_bytes()

    # A directory whose manifest never arrived is an unfinished upload: refused unless asked.
    storage.put_bytes(f"s3://{bucket}/ckpt/half/model.safetensors", b"w", s3=s3)
    with pytest.raises(StorageError, match="upload did not finish"):
        storage.download_dir(f"s3://{bucket}/ckpt/half", tmp_path / "half", s3=s3)
    got = storage.download_dir(f"s3://{bucket}/ckpt/half", tmp_path / "half", s3=s3, require_manifest=False)
    assert [p.name for p in got] == ["model.safetensors"]


def test_multipart_upload_and_download(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    opts = dataclasses.replace(s3, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    parts: list[int] = []
    client = storage.s3_client(opts)
    client.meta.events.register("before-call.s3.UploadPart", lambda **kw: parts.append(1))

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB))
    sent: list[int] = []
    uri = f"s3://{bucket}/big/model.bin"
    storage.put_file(src, uri, s3=opts, progress=sent.append)
    assert len(parts) == 3  # 5 + 5 + 1 MiB
    assert sum(sent) == 11 * MiB

    dest = tmp_path / "down.bin"
    storage.get_file(uri, dest, s3=opts)
    assert storage.sha256_file(dest) == storage.sha256_file(src)
    assert raw_client(s3).head_object(Bucket=bucket, Key="big/model.bin")["ContentLength"] == 11 * MiB


def test_tampered_object_fails_checksum(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    uri = f"s3://{bucket}/shard-0.jsonl"
    digest = storage.put_bytes(uri, b'{"q": 1}\n', s3=s3)
    # Overwrite the content behind lemon's back, keeping the recorded checksum.
    raw_client(s3).put_object(
        Bucket=bucket, Key="shard-0.jsonl", Body=b'{"q": 2}\n', Metadata={"sha256": digest}
    )
    with pytest.raises(StorageError, match="checksum mismatch for s3://.*/shard-0.jsonl"):
        storage.get_bytes(uri, s3=s3)
    dest = tmp_path / "shard.jsonl"
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.get_file(uri, dest, s3=s3)
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []  # no temp file left behind either


# ------------------------------------------------------------------------------------------- faults


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_endpoint_fails_fast_and_clearly() -> None:
    port = _free_port()
    opts = options(port)
    start = time.monotonic()
    with pytest.raises(StorageError) as err:
        storage.put_bytes("s3://b/k.json", b"{}", s3=opts)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert f"cannot reach S3 endpoint http://127.0.0.1:{port}" in message
    assert "LEMON_S3_ENDPOINT_URL" in message
    assert err.value.__suppress_context__  # no botocore stack chained under it
    assert elapsed < 10, elapsed


def test_server_stops_mid_multipart_upload_then_retry_succeeds(tmp_path: Path) -> None:
    server = StoppableS3Server()
    port = server.port
    opts = options(port, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    bucket = new_bucket(opts)
    uri = f"s3://{bucket}/ckpt/model.safetensors"
    src = tmp_path / "model.safetensors"
    src.write_bytes(os.urandom(12 * MiB))

    sent = [0]
    stopped = threading.Event()

    def stop_after_first_mib(n: int) -> None:
        sent[0] += n
        if sent[0] > MiB and not stopped.is_set():
            stopped.set()
            server.stop()

    try:
        with pytest.raises(StorageError, match=f"cannot reach S3 endpoint http://127.0.0.1:{port}"):
            storage.put_file(src, uri, s3=opts, progress=stop_after_first_mib)
        assert stopped.is_set() and sent[0] < 12 * MiB  # it really failed mid-upload

        server = StoppableS3Server(port=port)  # same port, same in-process S3 state
        assert not storage.exists(uri, s3=opts)
        assert storage.list(f"s3://{bucket}/ckpt/", s3=opts) == []
        listing = raw_client(opts).list_objects_v2(Bucket=bucket)
        assert all(not o["Key"].endswith("model.safetensors") for o in listing.get("Contents", []))

        storage.put_file(src, uri, s3=opts)
        dest = tmp_path / "back.safetensors"
        storage.get_file(uri, dest, s3=opts)
        assert dest.read_bytes() == src.read_bytes()
    finally:
        server.stop()


def test_put_while_server_down_keeps_previous_version(tmp_path: Path) -> None:
    server = StoppableS3Server()
    port = server.port
    opts = options(port)
    bucket = new_bucket(opts)
    uri = f"s3://{bucket}/eval/metrics.json"
    storage.put_bytes(uri, b'{"acc": 0.5}', s3=opts)
    server.stop()
    try:
        with pytest.raises(StorageError, match="cannot reach S3 endpoint"):
            storage.put_bytes(uri, b'{"acc": 0.9}', s3=opts)
        server = StoppableS3Server(port=port)
        assert storage.get_bytes(uri, s3=opts) == b'{"acc": 0.5}'
        storage.put_bytes(uri, b'{"acc": 0.9}', s3=opts)
        assert storage.get_bytes(uri, s3=opts) == b'{"acc": 0.9}'
    finally:
        server.stop()


# -------------------------------------------------------------------------------------- settings


def test_options_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws-style:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-key")
    monkeypatch.setenv("LEMON_S3_ACCESS_KEY_ID", "lemon-key")
    monkeypatch.setenv("LEMON_S3_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("LEMON_S3_MAX_ATTEMPTS", "7")
    opts = S3Options.from_env()
    assert opts.endpoint_url == "http://aws-style:9000"
    assert opts.access_key_id == "lemon-key"  # LEMON_S3_* wins over AWS_*
    assert (opts.addressing_style, opts.max_attempts) == ("path", 7)
    monkeypatch.setenv("LEMON_S3_ENDPOINT_URL", "http://minio:9000")
    assert S3Options.from_env().endpoint_url == "http://minio:9000"
    assert S3Options.from_env("http://explicit:1").endpoint_url == "http://explicit:1"
    monkeypatch.setenv("LEMON_S3_ADDRESSING_STYLE", "sideways")
    with pytest.raises(StorageError, match="LEMON_S3_ADDRESSING_STYLE='sideways'"):
        S3Options.from_env()


def test_bad_uris_are_explained() -> None:
    with pytest.raises(StorageError, match="only s3:// and file://"):
        storage.get_bytes("gs://bucket/key")
    with pytest.raises(StorageError, match="has no bucket"):
        storage.parse_uri("s3:///key")
    with pytest.raises(StorageError, match="names no object"):
        storage.put_bytes("s3://bucket/dir/", b"x")
    assert storage.parse_uri("file:///data/x.jsonl").path == Path("/data/x.jsonl")
    assert storage.join("s3://b/run/", "/shard-0.jsonl") == "s3://b/run/shard-0.jsonl"


# -------------------------------------------------------------------------------------------- local


def test_local_round_trip_list_and_dirs(tmp_path: Path) -> None:
    base = f"file://{tmp_path}/out"
    storage.write_jsonl(f"{base}/shard-0.jsonl", [{"i": 0}])
    storage.write_jsonl(f"{base}/shard-1.jsonl", [{"i": 1}])
    storage.write_text(str(tmp_path / "out" / "notes.txt"), "plain path")
    assert storage.read_jsonl(f"{base}/shard-1.jsonl") == [{"i": 1}]
    assert storage.list(f"{base}/shard-") == [f"{base}/shard-0.jsonl", f"{base}/shard-1.jsonl"]
    assert storage.list(str(tmp_path / "out")) == sorted(
        str(tmp_path / "out" / n) for n in ["notes.txt", "shard-0.jsonl", "shard-1.jsonl"]
    )
    with pytest.raises(StorageError, match="missing.jsonl does not exist"):
        storage.read_jsonl(f"{base}/missing.jsonl")
    (tmp_path / "out" / "bad.jsonl").write_text('{"ok": 1}\n{broken\n')
    with pytest.raises(StorageError, match="bad.jsonl line 2 is not valid JSON"):
        storage.read_jsonl(f"{base}/bad.jsonl")

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(StorageError, match="cannot write .*a-file/x.txt"):
        storage.write_text(str(tmp_path / "a-file" / "x.txt"), "under a file, not a directory")

    storage.upload_dir(tmp_path / "out", f"{base}-copy")
    restored = storage.download_dir(f"{base}-copy", tmp_path / "restored")
    assert sorted(p.name for p in restored) == ["bad.jsonl", "notes.txt", "shard-0.jsonl", "shard-1.jsonl"]
    assert storage.delete(f"{base}-copy", recursive=True) == 5  # four files + manifest


def test_local_crash_mid_write_leaves_previous_file(tmp_path: Path) -> None:
    """A writer killed between writing and renaming leaves the old file intact and no partial one."""
    target = tmp_path / "shard.jsonl"
    script = f"""
import os
from lemon_core import storage
storage.put_bytes({str(target)!r}, b"old\\n")
os.fsync = lambda fd: os._exit(3)   # die after the bytes are written, before the rename
storage.put_bytes({str(target)!r}, b"new\\n" * 100000)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert target.read_bytes() == b"old\n"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "shard.jsonl"]
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0]  # the dead writer's temp file...
    assert storage.list(str(tmp_path)) == [str(target)]  # ...which readers never see


def test_json_manifest_path_escape_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "evil"
    src.mkdir()
    (src / "a.txt").write_text("a")
    storage.upload_dir(src, str(tmp_path / "up"))
    manifest = tmp_path / "up" / storage.MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["files"]["../../escaped.txt"] = {}
    manifest.write_text(json.dumps(data))
    with pytest.raises(StorageError, match="escapes"):
        storage.download_dir(str(tmp_path / "up"), tmp_path / "dl")


def test_storage_command_line_round_trip_and_missing_prefix(tmp_path: Path) -> None:
    """``python -m lemon_core.storage`` is what the chart's model-sync init container runs."""
    from lemon_core.storage import main

    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "weights.bin").write_bytes(b"\x00\x01" * 100)
    assert main(["upload", str(src), f"file://{tmp_path}/remote"]) == 0
    assert main(["download", f"file://{tmp_path}/remote", str(tmp_path / "copy")]) == 0
    assert (tmp_path / "copy" / "sub" / "weights.bin").read_bytes() == b"\x00\x01" * 100
    assert main(["download", str(tmp_path / "absent"), str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
