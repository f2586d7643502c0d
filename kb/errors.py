"""The one exception every service raises, carrying the error codes of the rag-mcp seed (001).

Front doors translate it: the API into ``{"error": {"code", "message"}}`` with the HTTP status
below, MCP into a tool error with the same body, commands into a message and exit status.
"""

from enum import StrEnum


class ErrorCode(StrEnum):
    DOCUMENT_NOT_FOUND = "DOCUMENT_NOT_FOUND"
    COLLECTION_NOT_FOUND = "COLLECTION_NOT_FOUND"
    COLLECTION_EXISTS = "COLLECTION_EXISTS"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_URI = "INVALID_URI"
    LOAD_FAILED = "LOAD_FAILED"
    TEXT_TOO_LONG = "TEXT_TOO_LONG"
    DATABASE_ERROR = "DATABASE_ERROR"
    EMBEDDING_ERROR = "EMBEDDING_ERROR"
    UNAUTHORIZED = "UNAUTHORIZED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # Not in the seed: a REST path that names no endpoint at all, or a source or sync run.
    NOT_FOUND = "NOT_FOUND"
    # Not in the seed: a REST path with a method it does not take.
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"


HTTP_STATUS = {
    ErrorCode.DOCUMENT_NOT_FOUND: 404,
    ErrorCode.COLLECTION_NOT_FOUND: 404,
    ErrorCode.COLLECTION_EXISTS: 409,
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.INVALID_URI: 400,
    ErrorCode.LOAD_FAILED: 502,
    ErrorCode.TEXT_TOO_LONG: 400,
    ErrorCode.DATABASE_ERROR: 500,
    ErrorCode.EMBEDDING_ERROR: 500,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
}


# A message names what the caller sent (an id, a name): one of 10,000 characters came back whole.
MAX_MESSAGE_CHARS = 1000


class KBError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}… [{len(message) - MAX_MESSAGE_CHARS} more characters]"
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": str(self.code), "message": self.message}}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


NUL_IN_TEXT = "Text values cannot contain NUL (0x00) characters"


def refuse_nul(text: str) -> None:
    """A NUL in a name or id looked up is the caller's to fix (Postgres cannot even compare it):
    INVALID_ARGUMENT at every door, before any query."""
    if "\x00" in text:
        raise KBError(ErrorCode.INVALID_ARGUMENT, NUL_IN_TEXT)


def database_error(exc: BaseException) -> KBError:
    """What a caller is told of a database failure: its SQLSTATE at most. The driver's message
    may name the server's socket path, tables or values; the log keeps it. A NUL character in a
    value (an id, a name) is the caller's error, whichever door let it through to the driver."""
    if _is_nul_in_text(exc):
        return KBError(ErrorCode.INVALID_ARGUMENT, NUL_IN_TEXT)
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or getattr(exc, "sqlstate", None)
    detail = f" (SQLSTATE {sqlstate})" if sqlstate else ""
    return KBError(ErrorCode.DATABASE_ERROR, f"The database failed{detail}; the server log has the details")


def _is_nul_in_text(exc: BaseException) -> bool:
    """psycopg refuses a NUL in a text parameter before sending it (DataError, no SQLSTATE)."""
    for error in (exc, exc.__cause__):
        if error is not None and type(error).__name__ == "DataError" and "NUL (0x00)" in str(error):
            return True
    return False
