"""Filters of the server's log (``LOGGING`` in config.settings)."""

import logging


class CallersMistakesAsWarnings(logging.Filter):
    """Django logs every request it refuses as suspicious (a Host header it does not serve, a
    broken session cookie) at ERROR with a full traceback. Those are the caller's mistakes, already
    answered with a 400: one WARNING line each, so that ERROR stays for the server's own faults.

    It changes the record, so it sits on the one handler of ``django.security``, which does not
    pass its records on: no other handler sees them changed (or, with DEBUG, unchanged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.exc_info, record.exc_text = None, None
        return True
