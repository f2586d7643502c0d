"""How many MCP sessions one caller may hold open at once (MCP_MAX_SESSIONS_PER_CALLER).

The SDK caps sessions only in all (10,000 Streamable HTTP sessions per server, each kept until
it has been idle 30 minutes; SSE streams not at all), so one token that opened 10,000 and left
them locked every other client out of new sessions for half an hour. A caller is its token, or
its address when it has none. Streamable HTTP sessions are counted from the answer that opens
one (its Mcp-Session-Id) until it is deleted or has been idle as long as the SDK keeps it (a
session with a request in flight, such as its GET stream of notifications, is not idle: the SDK
keeps it too); SSE sessions while their stream is open.
"""

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

from mcp.server.streamable_http_manager import DEFAULT_SESSION_IDLE_TIMEOUT

from kb.access import Access


def caller_key(access: Access, client_address: str | None) -> str:
    return f"token {access.token.pk}" if access.token is not None else f"address {client_address}"


class SessionQuota:
    def __init__(self, limit: int, idle_seconds: float = DEFAULT_SESSION_IDLE_TIMEOUT) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._sessions: dict[str, dict[str, float]] = {}  # caller -> session id -> last seen
        self._streams: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()  # session id -> requests naming it being served

    def admits(self, caller: str) -> bool:
        """Whether ``caller`` may open one more session."""
        return self.open_sessions(caller) < self.limit

    def open_sessions(self, caller: str) -> int:
        sessions = self._sessions.get(caller, {})
        expired = time.monotonic() - self.idle_seconds
        idle = [key for key, seen in sessions.items() if seen < expired and not self._in_flight[key]]
        for session_id in idle:
            del sessions[session_id]
        return len(sessions) + self._streams[caller]

    def seen(self, caller: str, session_id: str) -> None:
        """The answer that opened this Streamable HTTP session was sent."""
        self._sessions.setdefault(caller, {})[session_id] = time.monotonic()

    @contextlib.contextmanager
    def serving(self, caller: str, session_id: str) -> Iterator[None]:
        """A request naming a session is served: the session is in use until it ends, and idle
        from then on, if it is one this caller opened (an unknown or expired id is not
        remembered, so made-up ids cost nothing)."""
        self._in_flight[session_id] += 1
        try:
            yield
        finally:
            self._in_flight[session_id] -= 1
            if not self._in_flight[session_id]:
                del self._in_flight[session_id]
            sessions = self._sessions.get(caller, {})
            if session_id in sessions:
                sessions[session_id] = time.monotonic()

    def closed(self, caller: str, session_id: str) -> None:
        self._sessions.get(caller, {}).pop(session_id, None)

    @contextlib.contextmanager
    def stream(self, caller: str) -> Iterator[None]:
        """An SSE session, open for as long as its stream is."""
        self._streams[caller] += 1
        try:
            yield
        finally:
            self._streams[caller] -= 1


class CallQuota:
    """How many requests one session may have waiting for their answers (MCP_MAX_CALLS_PER_SESSION).

    The tool threads are shared by every session, and an SSE session is answered on its stream,
    whose reader may never read: one session had sent 8 slow searches that held every reading
    thread for two minutes, and 3,000 searches whose answers waited unread, 960 MB. A Streamable
    HTTP request waits from its POST until the answer is sent; an SSE request from its accepted
    POST until its answer is written to the stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._waiting: Counter[str] = Counter()

    def admits(self, session_id: str) -> bool:
        return self._waiting[session_id] < self.limit

    def asked(self, session_id: str) -> None:
        self._waiting[session_id] += 1

    def answered(self, session_id: str) -> None:
        if self._waiting[session_id] > 1:
            self._waiting[session_id] -= 1
        else:
            self._waiting.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        self._waiting.pop(session_id, None)

    @contextlib.contextmanager
    def waiting(self, session_id: str) -> Iterator[None]:
        self.asked(session_id)
        try:
            yield
        finally:
            self.answered(session_id)
