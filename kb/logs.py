"""How the server logs requests Django refused (``LOGGING`` in config.settings): the caller's
mistakes, already answered with a 4xx, are one WARNING line each, so that ERROR and tracebacks
stay for the server's own faults. Both loggers, ``django.security`` and ``django.request``, have
a handler of their own that passes nothing on, so no other handler sees their records changed."""

import logging

from starlette.requests import ClientDisconnect

from kb.errors import HTTP_STATUS, ErrorCode

# LOAD_FAILED is a 5xx in rag-mcp's table (502), yet what failed is the caller's file or a
# remote server, never this one.
NOT_OUR_FAULT_STATUSES = {HTTP_STATUS[ErrorCode.LOAD_FAILED]}


# The MCP SDK's SSE transport logs every message it cannot parse (a lone surrogate's escape is
# one) at ERROR with the parser's traceback; it answered 400.
CALLERS_MISTAKES_OF_THE_SDK = {("mcp.server.sse", "Failed to parse message")}
# Its Streamable HTTP transport logs a client that went away in the middle of its request body
# at ERROR with a traceback (Starlette's ClientDisconnect): nothing failed here.
CLIENT_GONE = ("mcp.server.streamable_http", "Error handling POST request", ClientDisconnect)


class CallersMistakesAsWarnings(logging.Filter):
    """Django logs every request it refuses as suspicious (a Host header it does not serve, a
    broken session cookie) at ERROR with a full traceback; it answered 400. And it logs every
    5xx answer at ERROR, LOAD_FAILED's 502 too."""

    def filter(self, record: logging.LogRecord) -> bool:
        suspicious = (
            record.name.startswith("django.security.")
            or (record.name, record.msg) in CALLERS_MISTAKES_OF_THE_SDK
            or _client_gone(record)
        )
        if suspicious or getattr(record, "status_code", None) in NOT_OUR_FAULT_STATUSES:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.exc_info, record.exc_text = None, None
        return True


def _client_gone(record: logging.LogRecord) -> bool:
    name, message, kind = CLIENT_GONE
    exception = record.exc_info[1] if record.exc_info else None
    return (record.name, record.msg) == (name, message) and isinstance(exception, kind)


class TracebacksForErrorsOnly(logging.Formatter):
    """``django.request`` logs a refused request (403, 404, 405) at WARNING with the exception
    that refused it: one line. Its errors (a 500) keep their traceback."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.ERROR and record.exc_info:
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)
