"""The one error type a person sees: ``lemon`` prints its message on one line and exits 2.

Anything a user can fix (a config field, a missing file, an unreachable endpoint) is raised as a
``LemonError`` (or a subclass) whose message names the field and the fix; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class LemonError(RuntimeError):
    """A problem the user can fix; the message says what to change."""


class ConfigError(LemonError, ValueError):
    """A config file or value that cannot be used (also a ValueError, as pydantic's are)."""


class ConfigNotFoundError(ConfigError, FileNotFoundError):
    """A config path that is neither a file nor a bundled config name."""


def format_validation_error(e: ValidationError) -> str:
    """``field.path: problem`` for every error, joined; what a person needs to fix the file."""
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling and section)"
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def cli_exit(message: str) -> Any:
    """Print ``error: message`` in red on stderr and return the ``typer.Exit(code=2)`` to raise: a command's
    own one-line error (the ``lemon`` entry point does the same for every ``LemonError``)."""
    import typer

    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=2)
