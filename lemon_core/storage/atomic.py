"""Temp-then-rename writes: one helper for every file or folder that must appear whole or not at all.

A writer that dies (kill -9, OOM, node loss) between starting and finishing a write must leave the
previous version in place and no half-written one under the final name. POSIX gives exactly one tool
for that: ``rename`` within a filesystem is atomic. So everything is written to a temporary sibling
(``<name>.tmp-<32 hex>``, same directory, hence same filesystem), flushed to disk, then renamed.

- A file is replaced with ``os.replace`` (atomic, also over an existing file).
- A folder cannot be renamed over a non-empty folder, so the old one is first renamed aside (to its
  own temporary name), the new one renamed in, and the old one deleted. A crash in the microseconds
  between the two renames leaves the final name absent and the old copy under a temporary name:
  never a mix of old and new files.
- ``replace=False`` is for caches shared by concurrent processes: when the final name already exists
  (another process published first), ours is discarded and theirs kept, so readers never see a folder
  replaced under them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from lemon_core.storage.base import StorageError


def temporary_sibling(path: str | os.PathLike[str]) -> Path:
    """A fresh name next to ``path``, hidden from ``storage.list`` and recognised by ``is_temporary``."""
    final = Path(path)
    return final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex}")


def _fsync_path(path: Path) -> None:
    """Flush a file, or a directory entry, to disk (best effort for directories: not every FS allows it)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _publish_dir(tmp: Path, final: Path, replace: bool) -> bool:
    """Rename the finished folder ``tmp`` onto ``final``; returns False when ``final`` was kept instead."""
    if final.exists() or final.is_symlink():
        if not replace:
            _remove(tmp)
            return False
        if not final.is_dir() or final.is_symlink():
            raise StorageError(f"cannot replace {final} with a folder: it is a file; move it away or pick another path")
        aside = temporary_sibling(final)
        os.rename(final, aside)
        os.rename(tmp, final)
        _remove(aside)
        return True
    try:
        os.rename(tmp, final)
    except OSError:
        if replace or not final.is_dir():
            raise
        _remove(tmp)  # another process published between our check and our rename: keep theirs
        return False
    return True


def _publish_file(tmp: Path, final: Path, replace: bool) -> bool:
    if final.is_dir() and not final.is_symlink():
        raise StorageError(f"cannot write {final}: it is a folder; give a file path")
    if not replace and final.exists():
        _remove(tmp)
        return False
    os.replace(tmp, final)
    return True


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str], *, directory: bool = False, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` to write; when the block ends normally it becomes ``final``.

    ``directory=True`` yields an empty, created folder; else a path for one file (not created). On an
    exception the temporary is deleted and ``final`` is untouched. The written data is fsync'ed before
    the rename and the parent directory after it, so a power cut cannot publish an empty file.

    Use it for every temp-then-rename write::

        with atomic_path(out / "plot.png") as tmp:
            fig.savefig(tmp, format="png")      # name the format: the temp name ends in .tmp-<hex>
    """
    target = Path(final)
    tmp = temporary_sibling(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if directory:
            tmp.mkdir()
        yield tmp
        if not directory and not tmp.exists():
            raise StorageError(f"nothing was written to the temporary file for {target}")
        _fsync_tree(tmp) if directory else _fsync_path(tmp)
        (_publish_dir if directory else _publish_file)(tmp, target, replace)
        _fsync_path(target.parent)
    except OSError as err:
        raise StorageError(f"cannot write {target}: {err.strerror or err}") from None
    finally:
        if tmp.exists() or tmp.is_symlink():  # failed, or discarded in favour of an existing copy
            _remove(tmp)


def _fsync_tree(root: Path) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                _fsync_path(path)
    _fsync_path(root)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` all-or-nothing; returns the path."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(payload)
    return Path(path)
