"""lemon_core/redact.py: credentials of URLs never reach a log line, whoever logs them and however."""

from __future__ import annotations

import io
import logging

import httpx

from lemon_core.redact import install_log_redaction, redact

SECRET = "hunter" + "2x"  # never whole in the source


def test_redact_masks_userinfo_and_leaves_other_urls() -> None:
    text = f"POST http://bob:{SECRET}@vllm:8000/v1 then https://api.example/v1?next=a@b and mailto a@b"
    out = redact(text)
    assert SECRET not in out and "bob" not in out
    assert "http://***@vllm:8000/v1" in out and "https://api.example/v1?next=a@b" in out


def test_every_record_is_redacted_whatever_the_logger_handler_or_argument() -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger("some.library")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        url = httpx.URL(f"http://bob:{SECRET}@host/v1/chat/completions")
        logger.info("HTTP Request: %s %s %d", "POST", url, 200)  # httpx passes a URL object
        logger.info("split %s://%s@%s", "http", f"bob:{SECRET}", "host")  # assembled from several arguments
        try:
            raise ConnectionError(f"cannot reach http://bob:{SECRET}@host")
        except ConnectionError:
            logger.exception("failed")
        access = logger.makeRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s" %d',
                                   ("1.2.3.4", "GET", f"/x?u=http://bob:{SECRET}@h", 200), None)
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert SECRET not in out, out
    assert "HTTP Request: POST http://***@host/v1/chat/completions 200" in out
    assert "split http://***@host" in out and "ConnectionError: cannot reach http://***@host" in out
    assert isinstance(access.args, tuple) and len(access.args) == 4  # uvicorn's access formatter unpacks it
    assert SECRET not in access.getMessage()
