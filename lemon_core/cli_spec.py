"""``lemon spec show``: look at a spec file as a picture (SVG/PNG) or as a text tree in the terminal.

Registered in ``lemon_core/cli.py`` as the ``spec`` sub-app. The file is read with ``parse_spec``, the
same reader the orchestrator's output goes through, so a file that shows here also runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lemon_core.errors import cli_exit

spec_app = typer.Typer(help="Look at orchestration specs.", no_args_is_help=True)


@spec_app.callback()
def spec_group() -> None:
    """Look at orchestration specs (a callback keeps ``show`` a subcommand, with room for more)."""


_fail = cli_exit  # one error line for every command (lemon_core/errors.py)


@spec_app.command("show")
def show_command(
    file: Annotated[Path, typer.Argument(help="Spec file (YAML or JSON, or raw orchestrator output containing one).")],
    out: Annotated[Path | None, typer.Option(
        help="Write the picture here (.svg or .png). Without it: a text tree.")] = None,
    pool: Annotated[str | None, typer.Option(
        help="Pool YAML path or built-in name (cpu, gpu, simulated): checks the capacities and orders the "
             "colour scale by the pool's levels.")] = None,
) -> None:
    """Show a spec: its agents, their capacity levels and who reads whom, with the output agent marked."""
    from lemon_core.spec import SpecError
    from lemon_core.spec_picture import SpecPictureError, spec_text, write_spec_picture
    from lemon_core.spec_text import parse_spec

    if not file.is_file():
        raise _fail(f"spec file {file} does not exist; pass the path of a YAML or JSON spec")
    levels = None
    if pool is not None:
        from lemon_core.pool import PoolError, load_pool

        try:
            levels = load_pool(pool).level_names
        except (PoolError, OSError, ValueError) as exc:
            raise _fail(f"--pool {pool}: {exc}") from None
    try:
        spec = parse_spec(file.read_text(encoding="utf-8"), pool=levels).spec
    except UnicodeDecodeError:
        raise _fail(f"{file} is not UTF-8 text; pass the YAML or JSON spec file itself") from None
    except SpecError as exc:
        raise _fail(f"{file}: {exc}") from None
    if out is None:
        typer.echo(spec_text(spec), nl=False)
        return
    try:
        write_spec_picture(spec, out, levels)
    except SpecPictureError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"wrote {out}")
