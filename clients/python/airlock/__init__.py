"""Airlock's Python client: run an agent's commands in Airlock sandboxes, under a tenant's policy.

    from airlock import Airlock

    client = Airlock("http://127.0.0.1:8000", "alk_…")
    with client.sessions.create(conversation_id="chat-42", policy="default") as s:
        s.files.write("test_app.py", "def test_ok():\\n    assert True\\n")
        result = s.run("pytest", ["-q"], on_output=lambda piece: print(piece.data, end=""))
        print(result.exit_code, result.reason)
"""

from airlock._wire import VERSION as __version__
from airlock._wire import Retry
from airlock.aio import AsyncAirlock, AsyncCommandHandle, AsyncSession
from airlock.client import Airlock, CommandHandle, Session
from airlock.errors import (
    AirlockError,
    BadRequest,
    CommandDenied,
    Conflict,
    ConnectionFailed,
    Denied,
    FileDenied,
    Forbidden,
    NotFound,
    PolicyInvalid,
    QuotaExceeded,
    RateLimited,
    ServerError,
    Timeout,
    TooLarge,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from airlock.models import CommandResult, Decision, FileEntry, Listing, Output, SessionInfo

__all__ = [  # noqa: RUF022 - grouped as imported
    "Airlock", "AsyncAirlock", "Session", "AsyncSession", "CommandHandle", "AsyncCommandHandle", "Retry",
    "CommandResult", "Decision", "FileEntry", "Listing", "Output", "SessionInfo",
    "AirlockError", "BadRequest", "CommandDenied", "Conflict", "ConnectionFailed", "Denied", "FileDenied", "Forbidden",
    "NotFound", "PolicyInvalid", "QuotaExceeded", "RateLimited", "ServerError", "Timeout", "TooLarge",
    "Unauthorized", "Unavailable", "WaitTimeout", "__version__",
]
