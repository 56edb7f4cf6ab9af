"""``lemon data pull`` and ``lemon data list``: the benchmark files for a machine that has no shared copy.

Registered in ``lemon_core/cli.py`` as the ``data`` sub-app. The work is in ``lemon_core/data.py`` (what to
fetch, sha256 checks, atomic install) and ``lemon_core/benchmarks/base.py`` (where the loader looks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lemon_core.errors import cli_exit

data_app = typer.Typer(
    help="Benchmark data: fetch the raw files from their authors' repositories at pinned commits "
         "(sha256-checked) and show where each benchmark is loaded from.",
    no_args_is_help=True,
)

_fail = cli_exit  # one error line for every command (lemon_core/errors.py)


@data_app.command("pull")
def pull_command(
    names: Annotated[list[str] | None, typer.Argument(
        help="Benchmarks (mmlu gsm8k aqua multiarith svamp humaneval); default: all, or those --config names.",
        show_default=False)] = None,
    config: Annotated[str | None, typer.Option(
        help="Pipeline or train config (path or bundled name): pull the benchmarks its prepare / train / "
             "evaluate sections name; its data_dir, when set, is the only place checked.")] = None,
    base_url: Annotated[str | None, typer.Option(
        help="Fetch from <base-url>/<owner>/<repo>/<commit>/<path> (default: $LEMON_DATA_BASE_URL or "
             "https://raw.githubusercontent.com).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a bytes / total progress line per benchmark.")] = True,
) -> None:
    """Install benchmarks into $LEMON_CACHE_DIR/datasets (~/.cache/lemon/datasets), each file verified against
    its pinned sha256. Benchmarks the loader already finds ($LEMON_DATA_DIR, a shared/datasets folder) and
    installed files that still verify are not fetched again."""
    from lemon_core.data import NAMES, config_benchmarks, pull, source
    from lemon_core.errors import LemonError
    from lemon_core.progress import format_bytes

    wanted: list[str] = [n.strip().lower() for n in names or []]
    data_dir = None
    try:
        if config is not None:
            from_config, data_dir = config_benchmarks(config)
            wanted += from_config
        wanted = list(dict.fromkeys(wanted or (NAMES if config is None else [])))
        for name in wanted:
            source(name)  # every name checked before anything is fetched
        results = pull(wanted, data_dir=data_dir, base_url=base_url, progress=progress)
    except LemonError as e:
        raise _fail(str(e)) from None
    if not wanted:
        typer.echo(f"{config}: names no benchmarks (tasks_jsonl?); nothing to pull")
    for r in results:
        if r.state == "available":
            typer.echo(f"{r.name}: already available at {r.folder} ({r.where}); nothing to pull")
        elif r.state == "verified":
            typer.echo(f"{r.name}: already pulled, sha256 verified: {r.folder}")
        else:
            typer.echo(f"{r.name}: pulled {r.fetched_files} file(s), {format_bytes(r.fetched_bytes)}, "
                       f"sha256 verified: {r.folder}")


@data_app.command("list")
def list_command(
    data_dir: Annotated[Path | None, typer.Option(
        help="Show what the loader reads with this --data-dir (the only place it then looks).")] = None,
) -> None:
    """For each benchmark: where the loader reads it from (in its search order) and whether it is pulled."""
    from lemon_core.benchmarks.base import data_places, is_pulled
    from lemon_core.data import NAMES, datasets_dir
    from lemon_core.errors import LemonError

    typer.echo(f"{'benchmark':11s} {'pulled':7s} loads from")
    for name in NAMES:
        try:
            places = data_places(name, data_dir)
        except LemonError as e:
            raise _fail(str(e)) from None
        found = next((p for p in places if p.folder is not None), None)
        where = f"{found.folder} ({found.label})" if found else f"nowhere: run `lemon data pull {name}`"
        typer.echo(f"{name:11s} {'yes' if is_pulled(name) else 'no':7s} {where}")
    typer.echo(f"pull cache: {datasets_dir()}")
