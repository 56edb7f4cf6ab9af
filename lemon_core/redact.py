"""Keep credentials out of log lines: ``scheme://user:password@host`` becomes ``scheme://***@host``.

A capacity level's ``base_url`` may carry ``user:password@`` (basic auth for a model server), and the
libraries lemon calls log URLs as they are: httpx logs every request (``HTTP Request: POST <url>``) at
INFO, and an exception's message often names the URL it failed on. Pod logs are read by far more people
than secrets are, so ``install_log_redaction`` rewrites every log record of the process, whoever logged it
and whichever handler will print it, before any handler sees it.

It works on the record, not on one handler or formatter: handlers are added later by uvicorn's log config,
by pytest, by a user's own setup, and a filter on one of them would miss the others. The record's message
template, its arguments (httpx passes an ``httpx.URL``, not a string) and any formatted traceback are
rewritten; arguments are rewritten one by one so formatters that read ``record.args`` (uvicorn's access
log) still get the tuple they expect.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

MASK = "***"
# scheme://userinfo@ where userinfo has no '/', '@' or whitespace (RFC 3986: userinfo ends at the first '@')
USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"'<>]+@")

_lock = threading.Lock()
_installed: list[Callable[..., logging.LogRecord]] = []  # the factory this module installed, once


def redact(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@``."""
    return USERINFO.sub(rf"\g<scheme>{MASK}@", text)


def _redacted_arg(value: Any) -> Any:
    if isinstance(value, (int, float)) or value is None:
        return value  # "%d" and "%.1f" arguments stay numbers
    text = str(value)
    clean = redact(text)
    return value if clean == text else clean


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with credentials removed from its message, arguments and traceback (changed in place)."""
    if isinstance(record.msg, str):  # a "%s" in the template's userinfo is an argument's place: left to the check below
        record.msg = USERINFO.sub(lambda m: m[0] if "%" in m[0] else f"{m['scheme']}{MASK}@", record.msg)
    elif record.msg is not None and redact(str(record.msg)) != str(record.msg):
        record.msg = redact(str(record.msg))
    if isinstance(record.args, tuple):
        record.args = tuple(_redacted_arg(a) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _redacted_arg(v) for k, v in record.args.items()}
    try:
        rendered = record.getMessage()
    except (TypeError, ValueError):  # a broken format string: logging itself reports it later
        rendered = ""
    if redact(rendered) != rendered:  # a credential assembled from several arguments
        record.msg, record.args = redact(rendered), None
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        if redact(text) != text:
            record.exc_text = redact(text)  # formatters print exc_text when it is set
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


def install_log_redaction() -> None:
    """Redact every log record created from now on in this process (idempotent)."""
    with _lock:
        if _installed and logging.getLogRecordFactory() is _installed[0]:
            return
        make = logging.getLogRecordFactory()

        def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return redact_record(make(*args, **kwargs))

        _installed[:] = [redacting_factory]
        logging.setLogRecordFactory(redacting_factory)
