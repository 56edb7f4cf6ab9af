"""Bearer-token auth. Tokens come from a file (a mounted Kubernetes Secret), one per line.

Every presented token is compared with *every* configured token by ``hmac.compare_digest`` and no
early exit, so response time does not reveal how much of a token matched nor which one. The file is
re-read when its modification time changes: rotating the Secret needs no restart.

Tokens are compared as bytes: the file is read as UTF-8 and the header's raw bytes are used as
sent (HTTP header values are bytes; ASGI servers hand them over undecoded, and Starlette's ``str``
view of them is Latin-1), so a token with non-ASCII characters works when the client sends it UTF-8
encoded.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class AuthError(ValueError):
    """The token file is missing or empty; the message says what to fix."""


def read_tokens(path: str | Path) -> list[bytes]:
    """Non-empty, non-comment lines of the token file, as bytes."""
    p = Path(path)
    if not p.is_file():
        raise AuthError(f"auth token file {str(p)!r} not found; mount the auth Secret or fix "
                        "--auth-token-file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AuthError(f"auth token file {str(p)!r} is not UTF-8 text ({e.reason} at byte {e.start}); "
                        "write the tokens as UTF-8") from None
    tokens = [line.strip().encode("utf-8") for line in text.splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise AuthError(f"auth token file {str(p)!r} has no tokens; put one token per line")
    short = sum(1 for t in tokens if len(t) < 16)
    if short:
        log.warning("%d auth token(s) in %s are shorter than 16 characters; use long random tokens", short, p)
    return tokens


class TokenAuth:
    """Checks ``Authorization: Bearer <token>`` headers against the token file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._tokens = read_tokens(self.path)
        self._mtime = os.stat(self.path).st_mtime_ns

    def _current(self) -> list[bytes]:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:  # Secret being swapped: keep the last good tokens
            return self._tokens
        if mtime != self._mtime:
            with self._lock:
                try:
                    self._tokens = read_tokens(self.path)
                except AuthError as e:
                    log.error("keeping previous tokens: %s", e)
                self._mtime = mtime
        return self._tokens

    def check(self, authorization: bytes | str | None) -> bool:
        """True when the header (raw bytes, or Starlette's Latin-1 ``str`` of them) carries a token."""
        if not authorization:
            return False
        if isinstance(authorization, str):
            try:
                authorization = authorization.encode("latin-1")  # back to the bytes on the wire
            except UnicodeEncodeError:
                return False
        scheme, _, presented = authorization.partition(b" ")
        given = presented.strip()
        if scheme.lower() != b"bearer" or not given:
            return False
        ok = False
        for token in self._current():
            ok |= hmac.compare_digest(given, token)
        return ok
