"""The local-disk back end (``file://`` URIs and plain paths): atomic renames, no recorded checksums."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lemon_core.storage.atomic import atomic_path
from lemon_core.storage.base import Location, Progress, StorageError, is_temporary, join


def _missing(loc: Location) -> StorageError:
    return StorageError(f"{loc.uri} does not exist (local path {loc.path.resolve()})")


def _readable_file(loc: Location) -> Path:
    """The path, if it is a file; a clear error for a missing path or a folder."""
    if loc.path.is_dir():
        raise StorageError(f"{loc.uri} is a folder, not a file; give the path of a file in it "
                           "(or use download_dir for a whole folder)")
    if not loc.path.is_file():
        raise _missing(loc)
    return loc.path


class LocalStore:
    """Writes go through ``atomic_path`` (temp sibling, fsync, rename); local files carry no sha256 of
    their own, so ``get_*`` return None for it (directory manifests still verify every file)."""

    def put_bytes(self, loc: Location, data: bytes, digest: str) -> None:
        with atomic_path(loc.path) as tmp, open(tmp, "wb") as fh:
            fh.write(data)

    def put_file(self, src: Path, loc: Location, digest: str, progress: Progress | None) -> None:
        with atomic_path(loc.path) as tmp:
            shutil.copyfile(src, tmp)
        if progress:
            progress(src.stat().st_size)

    def get_bytes(self, loc: Location) -> tuple[bytes, str | None]:
        path = _readable_file(loc)
        try:
            return path.read_bytes(), None
        except OSError as err:
            raise StorageError(f"cannot read {loc.uri}: {err.strerror or err}") from None

    def get_file(self, loc: Location, dest: Path) -> str | None:
        path = _readable_file(loc)
        try:
            shutil.copyfile(path, dest)
        except OSError as err:
            raise StorageError(f"cannot copy {loc.uri} to {dest}: {err.strerror or err}") from None
        return None

    def exists(self, loc: Location) -> bool:
        return loc.path.exists()

    def list_prefix(self, prefix: str, include_tmp: bool) -> list[str]:
        """Walk the folder the prefix lives in, spelling each file as <that folder's spelling>/<rel>."""
        path = Path(prefix[len("file://"):] if prefix.startswith("file://") else prefix)
        is_dir = path.is_dir()
        if prefix.endswith("/") and not is_dir:  # a folder prefix that does not exist holds nothing
            return []
        root = path if is_dir else path.parent
        spelled_root = prefix.rstrip("/") if is_dir else os.path.dirname(prefix)
        if not root.is_dir():
            return []
        found = []
        for folder, dirs, names in os.walk(root):
            if not include_tmp:  # a temporary folder is an unfinished write: nothing in it is data
                dirs[:] = [d for d in dirs if not is_temporary(d)]
            for name in names:
                rel = Path(folder, name).relative_to(root).as_posix()
                text = join(spelled_root, rel) if spelled_root else rel
                wanted = include_tmp or not is_temporary(name)
                if wanted and text.startswith(prefix) and Path(folder, name).is_file():
                    found.append(text)
        return sorted(found)

    def delete(self, loc: Location, recursive: bool) -> int:
        if loc.path.is_dir() and not loc.path.is_symlink():
            if not recursive:
                raise StorageError(f"{loc.uri} is a folder: pass recursive=True to delete it")
            count = sum(len(names) for _, _, names in os.walk(loc.path))
            shutil.rmtree(loc.path)
            return count
        if loc.path.exists() or loc.path.is_symlink():
            loc.path.unlink()
            return 1
        return 0
