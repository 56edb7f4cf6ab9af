"""``python -m lemon_core.storage download|upload SRC DEST``: what init containers run to sync model
folders between S3 and a volume (the Helm chart's vLLM model-sync step)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lemon_core.storage.base import StorageError
from lemon_core.storage.dirs import download_dir, upload_dir


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lemon_core.storage", description=__doc__)
    sub = ap.add_subparsers(dest="op", required=True)
    down = sub.add_parser("download", help="download a folder URI into a local folder (verified, then published whole)")
    down.add_argument("uri")
    down.add_argument("local_dir")
    down.add_argument("--allow-missing-manifest", action="store_true",
                      help="take whatever is under the prefix when it has no lemon manifest (default: refuse, "
                           "because a missing manifest means the upload did not finish)")
    down.add_argument("--require-manifest", action="store_true", help=argparse.SUPPRESS)  # the default now
    up = sub.add_parser("upload", help="upload a local folder to a folder URI (manifest written last)")
    up.add_argument("local_dir")
    up.add_argument("uri")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run one transfer; a ``StorageError`` is printed as one line and exits 2."""
    args = _parser().parse_args(argv)
    try:
        if args.op == "download":
            files = download_dir(args.uri, args.local_dir, require_manifest=not args.allow_missing_manifest)
            print(f"downloaded {len(files)} files from {args.uri} to {args.local_dir}")
        else:
            manifest = upload_dir(args.local_dir, args.uri)
            print(f"uploaded {len(manifest['files'])} files from {args.local_dir} to {args.uri}")
    except StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
