"""Issue #9 and #11 storage fixes: no S3 temp-key copy, verify-then-publish folder downloads, the manifest
required by default, a content-keyed download cache safe for concurrent processes, and clear errors for
malformed manifests, invalid UTF-8, folders where files are expected, NaN settings and symlinks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import test_storage
from test_storage import raw_client

from lemon_core import storage
from lemon_core.storage import S3Options, StorageError

MiB = 1024 * 1024
moto_server, s3, bucket = test_storage.moto_server, test_storage.s3, test_storage.bucket  # shared fixtures


def make_folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def folder_contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def count_calls(opts: S3Options, operation: str) -> list[int]:
    calls: list[int] = []
    storage.s3_client(opts).meta.events.register(f"before-call.s3.{operation}", lambda **kw: calls.append(1))
    return calls


# ------------------------------------------------------------------------------ S3: one write, no copy


def test_s3_writes_each_object_once_without_a_temporary_copy(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    import dataclasses

    opts = dataclasses.replace(s3, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    copies, puts = count_calls(opts, "CopyObject"), count_calls(opts, "PutObject")
    part_copies, parts = count_calls(opts, "UploadPartCopy"), count_calls(opts, "UploadPart")

    storage.put_bytes(f"s3://{bucket}/eval/metrics.json", b'{"acc": 1}', s3=opts)
    big = tmp_path / "model.safetensors"
    big.write_bytes(os.urandom(11 * MiB))
    storage.put_file(big, f"s3://{bucket}/ckpt/model.safetensors", s3=opts)

    assert (len(copies), len(part_copies)) == (0, 0)  # the bytes cross the wire once
    assert len(puts) == 1 and len(parts) == 3
    keys = sorted(o["Key"] for o in raw_client(s3).list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["ckpt/model.safetensors", "eval/metrics.json"]
    head = raw_client(s3).head_object(Bucket=bucket, Key="eval/metrics.json")
    assert head["ContentType"] == "application/json"
    assert head["Metadata"]["sha256"] == storage.sha256_bytes(b'{"acc": 1}')
    assert storage.get_bytes(f"s3://{bucket}/eval/metrics.json", s3=opts) == b'{"acc": 1}'


# ------------------------------------------------------------------ download_dir: verify, then publish


def _tamper(s3: S3Options, bucket: str, key: str, data: bytes) -> None:
    """Replace an object's bytes with self-consistent metadata: only the folder manifest can tell."""
    raw_client(s3).put_object(Bucket=bucket, Key=key, Body=data, Metadata={"sha256": storage.sha256_bytes(data)})


def test_failed_download_leaves_the_previous_good_copy(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    uri = f"s3://{bucket}/ckpt"
    v1 = {"a.bin": b"one-v1", "b.bin": b"two-v1", "sub/c.txt": b"three-v1"}
    storage.upload_dir(make_folder(tmp_path / "v1", v1), uri, s3=s3)
    dest = tmp_path / "models" / "ckpt"
    storage.download_dir(uri, dest, s3=s3)
    assert folder_contents(dest) == {**v1, storage.MANIFEST_NAME: folder_contents(dest)[storage.MANIFEST_NAME]}

    v2 = {"a.bin": b"one-v2", "b.bin": b"two-v2", "sub/c.txt": b"three-v2"}
    storage.upload_dir(make_folder(tmp_path / "v2", v2), uri, s3=s3)
    _tamper(s3, bucket, "ckpt/b.bin", b"corrupted")  # file 2 of 3 no longer matches the manifest
    with pytest.raises(StorageError, match=r"checksum mismatch for s3://.*/ckpt/b.bin: manifest sha256"):
        storage.download_dir(uri, dest, s3=s3)
    kept = folder_contents(dest)
    assert {k: v for k, v in kept.items() if k != storage.MANIFEST_NAME} == v1  # file 1 was not replaced
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ckpt"]  # no staging folder left behind

    _tamper(s3, bucket, "ckpt/b.bin", b"two-v2")  # repaired: the next download replaces v1 whole
    storage.download_dir(uri, dest, s3=s3)
    assert {k: v for k, v in folder_contents(dest).items() if k != storage.MANIFEST_NAME} == v2


def test_failed_first_download_leaves_nothing(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    uri = f"s3://{bucket}/ckpt"
    storage.upload_dir(make_folder(tmp_path / "src", {"a.bin": b"a", "b.bin": b"b"}), uri, s3=s3)
    _tamper(s3, bucket, "ckpt/b.bin", b"x")
    dest = tmp_path / "out" / "model"
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.download_dir(uri, dest, s3=s3)
    assert list((tmp_path / "out").iterdir()) == []  # not a partial checkpoint holding a.bin


def test_download_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    storage.upload_dir(make_folder(tmp_path / "src", {"w.bin": b"w"}), str(tmp_path / "remote"))
    home = make_folder(tmp_path / "home", {"thesis.tex": b"years of work"})
    with pytest.raises(StorageError, match="holds files that no lemon download put there"):
        storage.download_dir(str(tmp_path / "remote"), home)
    assert folder_contents(home) == {"thesis.tex": b"years of work"}
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(StorageError, match="a-file: it is a file; give a folder path"):
        storage.download_dir(str(tmp_path / "remote"), tmp_path / "a-file")


# ----------------------------------------------------------------- interrupted upload, manifest default


def test_killed_upload_is_refused_by_the_command_line(tmp_path: Path) -> None:
    """kill -9 after two of four files: the objects are there, the manifest is not."""
    src = make_folder(tmp_path / "model", {f"shard-{i}.bin": bytes([i]) * 1000 for i in range(4)})
    remote = f"file://{tmp_path}/remote/model"
    script = textwrap.dedent(f"""
        import os, shutil, signal
        from lemon_core import storage
        real, copied = shutil.copyfile, []
        def copy_then_die(*args, **kwargs):  # a local upload copies each file once
            if len(copied) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            copied.append(1)
            return real(*args, **kwargs)
        shutil.copyfile = copy_then_die
        storage.upload_dir({str(src)!r}, {remote!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -9, proc.stderr
    assert len(storage.list(remote + "/")) == 2

    dest = tmp_path / "models" / "orchestrator"
    down = subprocess.run([sys.executable, "-m", "lemon_core.storage", "download", remote, str(dest)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert down.returncode == 2
    assert "has no _lemon_manifest.json: its upload did not finish" in down.stderr
    assert "--allow-missing-manifest" in down.stderr
    assert not dest.exists()
    assert storage.main(["download", remote, str(dest), "--allow-missing-manifest"]) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["_lemon_manifest.json", "shard-0.bin", "shard-1.bin"]


@pytest.mark.parametrize(("manifest", "expected"), [
    (b"{not json", "is not a valid lemon manifest"),
    (b"[1, 2]", "is not a valid lemon manifest"),
    (b'{"format": "lemon-dir/1"}', r"\(files: Field required\)"),
    (b'{"files": {"a.bin": {"size": 1}}}', r"files\.a\.bin\.sha256"),
    (b'{"files": {"a.bin": {"sha256": "abc", "size": 1}}}', "should match pattern"),
    (b'{"files": {"a.bin": "deadbeef"}}', r"files\.a\.bin"),
    (b'{"files": {"/etc/passwd": {}}}', "escapes the folder"),
    (b'{"format": "other/9", "files": {}}', "format"),
])
def test_malformed_manifest_is_a_clear_error(tmp_path: Path, manifest: bytes, expected: str) -> None:
    storage.upload_dir(make_folder(tmp_path / "src", {"a.bin": b"a"}), str(tmp_path / "remote"))
    (tmp_path / "remote" / storage.MANIFEST_NAME).write_bytes(manifest)
    with pytest.raises(StorageError, match=expected) as err:
        storage.download_dir(str(tmp_path / "remote"), tmp_path / "dest")
    assert "_lemon_manifest.json is not a valid lemon manifest" in str(err.value)
    assert "re-upload the folder" in str(err.value)
    assert not (tmp_path / "dest").exists()


# ------------------------------------------------------------------------------- the download cache


def test_cache_is_keyed_by_content_not_by_uri(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    """A retrain writing the same artifact path again must never be served last run's checkpoint."""
    uri, cache = f"s3://{bucket}/run/iter-001/checkpoint", tmp_path / "cache"
    storage.upload_dir(make_folder(tmp_path / "run1", {"model.bin": b"run 1 weights"}), uri, s3=s3)
    first = storage.cached_download(uri, cache, s3=s3)
    assert (first / "model.bin").read_bytes() == b"run 1 weights"
    assert storage.cached_download(uri, cache, s3=s3) == first  # a hit: same entry

    storage.upload_dir(make_folder(tmp_path / "run2", {"model.bin": b"run 2 weights"}), uri, s3=s3)
    second = storage.cached_download(uri, cache, s3=s3)
    assert second != first
    assert (second / "model.bin").read_bytes() == b"run 2 weights"
    assert second.name == storage.sha256_bytes(storage.get_bytes(f"{uri}/_lemon_manifest.json", s3=s3))


def test_cache_verifies_before_publishing(tmp_path: Path, s3: S3Options, bucket: str) -> None:
    uri, cache = f"s3://{bucket}/ckpt", tmp_path / "cache"
    storage.upload_dir(make_folder(tmp_path / "src", {"a.bin": b"a", "b.bin": b"b"}), uri, s3=s3)
    _tamper(s3, bucket, "ckpt/b.bin", b"bad")
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.cached_download(uri, cache, s3=s3)
    assert list(cache.iterdir()) == []  # nothing published, no staging debris
    storage.delete(f"{uri}/_lemon_manifest.json", s3=s3)
    with pytest.raises(StorageError, match="upload did not finish"):
        storage.cached_download(uri, cache, s3=s3)


def test_cache_loser_of_a_publish_race_keeps_the_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic race: another process publishes the entry while this one is still downloading."""
    from lemon_core.storage import dirs

    uri, cache = str(tmp_path / "remote"), tmp_path / "cache"
    storage.upload_dir(make_folder(tmp_path / "src", {"a.bin": b"a" * 100}), uri)
    real_fetch, raced, calls = dirs._fetch_all, [], []

    def fetch_while_another_process_wins(*args, **kwargs):
        calls.append(1)
        manifest = real_fetch(*args, **kwargs)
        if len(calls) == 1:
            raced.append(storage.cached_download(uri, cache))  # the "other process" finishes first
        return manifest

    monkeypatch.setattr(dirs, "_fetch_all", fetch_while_another_process_wins)
    winner = storage.cached_download(uri, cache)
    assert raced == [winner] and len(calls) == 2  # both downloaded, one published
    assert (winner / "a.bin").read_bytes() == b"a" * 100
    assert sorted(p.name for p in cache.iterdir()) == [winner.name]  # the loser's copy was discarded


def test_cache_shared_by_concurrent_processes(tmp_path: Path) -> None:
    uri, cache = str(tmp_path / "remote"), tmp_path / "cache"
    files = {f"shard-{i}.bin": os.urandom(64 * 1024) for i in range(16)}
    storage.upload_dir(make_folder(tmp_path / "src", files), uri)
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from lemon_core import storage
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        print(storage.cached_download({uri!r}, {str(cache)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    entry = Path(paths.pop())
    assert {k: v for k, v in folder_contents(entry).items() if k != storage.MANIFEST_NAME} == files
    assert [p.name for p in cache.iterdir()] == [entry.name]  # losers left no staging folders


# ------------------------------------------------------------------------------------- bad inputs


def test_invalid_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    with pytest.raises(StorageError, match=r"rows.jsonl is not UTF-8 text: byte 16 \(line 2\) is b'\\xff'"):
        storage.read_jsonl(str(tmp_path / "rows.jsonl"))


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path: Path) -> None:
    rows = [{"text": "para\u2028graph\x85next\u2029end"}, {"text": "two"}]
    storage.write_jsonl(str(tmp_path / "r.jsonl"), rows)
    assert storage.read_jsonl(str(tmp_path / "r.jsonl")) == rows


def test_folder_where_a_file_is_expected(tmp_path: Path) -> None:
    (tmp_path / "shard.jsonl").mkdir()
    with pytest.raises(StorageError, match="shard.jsonl is a folder, not a file"):
        storage.read_text(str(tmp_path / "shard.jsonl"))
    with pytest.raises(StorageError, match="shard.jsonl is a folder, not a file"):
        storage.get_file(str(tmp_path / "shard.jsonl"), tmp_path / "copy")
    with pytest.raises(StorageError, match="cannot write .*shard.jsonl: it is a folder; give a file path"):
        storage.write_text(str(tmp_path / "shard.jsonl"), "x")
    assert (tmp_path / "shard.jsonl").is_dir()
    with pytest.raises(StorageError, match="it is a folder; use upload_dir"):
        storage.put_file(tmp_path / "shard.jsonl", str(tmp_path / "up.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.jsonl"]  # no temp files left


@pytest.mark.parametrize("name", ["LEMON_S3_CONNECT_TIMEOUT", "LEMON_S3_READ_TIMEOUT", "LEMON_S3_MAX_ATTEMPTS",
                                  "LEMON_S3_MULTIPART_THRESHOLD_MB"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_non_finite_or_non_positive_settings_are_refused(monkeypatch: pytest.MonkeyPatch, name: str,
                                                         value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(StorageError, match=f"{name}='{value}' must be a finite number > 0"):
        S3Options.from_env()


def test_fractional_attempts_and_words_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_S3_MAX_ATTEMPTS", "2.5")
    with pytest.raises(StorageError, match="LEMON_S3_MAX_ATTEMPTS='2.5' must be a whole number"):
        S3Options.from_env()
    monkeypatch.setenv("LEMON_S3_MAX_ATTEMPTS", "three")
    with pytest.raises(StorageError, match="LEMON_S3_MAX_ATTEMPTS='three' is not a number"):
        S3Options.from_env()


def test_upload_dir_symlinks(tmp_path: Path) -> None:
    """Links to files are uploaded as their content (Hugging Face snapshots); anything else is an error."""
    blobs = make_folder(tmp_path / "blobs", {"abc123": b"weights"})
    src = make_folder(tmp_path / "snapshot", {"config.json": b"{}"})
    (src / "model.safetensors").symlink_to(blobs / "abc123")
    manifest = storage.upload_dir(src, str(tmp_path / "up"))
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors"]
    assert (tmp_path / "up" / "model.safetensors").read_bytes() == b"weights"
    assert not (tmp_path / "up" / "model.safetensors").is_symlink()

    (src / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(StorageError, match=r"dangling: it is a symlink to .*gone', which does not exist"):
        storage.upload_dir(src, str(tmp_path / "up2"))
    (src / "dangling").unlink()
    (src / "loop").symlink_to(src)
    with pytest.raises(StorageError, match="loop: it is a symlink to a folder; copy the folder in"):
        storage.upload_dir(src, str(tmp_path / "up3"))
    assert not (tmp_path / "up3").exists()  # refused before anything was written


# ------------------------------------------------------------------------------ the atomic-write helper


def test_atomic_folder_replace_keeps_the_old_folder_on_failure(tmp_path: Path) -> None:
    final = make_folder(tmp_path / "ckpt-1", {"model.bin": b"old", "stale-shard.bin": b"old"})
    with pytest.raises(RuntimeError, match="save failed"), storage.atomic_path(final, directory=True) as tmp:
        (tmp / "model.bin").write_bytes(b"half")
        raise RuntimeError("save failed")
    assert folder_contents(final) == {"model.bin": b"old", "stale-shard.bin": b"old"}

    with storage.atomic_path(final, directory=True) as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert folder_contents(final) == {"model.bin": b"new"}  # replaced whole: no stale shard survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-1"]


def test_atomic_publish_without_replace_keeps_the_first(tmp_path: Path) -> None:
    storage.write_atomic(tmp_path / "a.txt", "first")
    with storage.atomic_path(tmp_path / "a.txt", replace=False) as tmp:
        tmp.write_text("second")
    assert (tmp_path / "a.txt").read_text() == "first"
    with pytest.raises(StorageError, match="nothing was written"), storage.atomic_path(tmp_path / "b.txt"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_files_inside_an_unfinished_folder_write_are_not_listed(tmp_path: Path) -> None:
    storage.write_text(str(tmp_path / "out" / "done.json"), "{}")
    debris = storage.temporary_sibling(tmp_path / "out" / "ckpt")  # a writer died before its rename
    make_folder(debris, {"model.bin": b"half"})
    assert storage.is_temporary(debris.name)
    assert storage.list(str(tmp_path / "out")) == [str(tmp_path / "out" / "done.json")]
    assert len(storage.list(str(tmp_path / "out"), include_tmp=True)) == 2


def test_cache_sweeps_dead_downloads_but_not_live_ones(tmp_path: Path) -> None:
    uri, cache = str(tmp_path / "remote"), tmp_path / "cache"
    storage.upload_dir(make_folder(tmp_path / "src", {"a.bin": b"a"}), uri)
    dead = make_folder(storage.temporary_sibling(cache / ("0" * 64)), {"model.bin": b"half"})
    live = make_folder(storage.temporary_sibling(cache / ("1" * 64)), {"model.bin": b"growing"})
    day_ago = time.time() - 86400
    for path in (dead, dead / "model.bin"):
        os.utime(path, (day_ago, day_ago))
    entry = storage.cached_download(uri, cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted([entry.name, live.name])
