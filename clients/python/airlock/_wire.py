"""What the sync and async clients share, free of any I/O: the requests each call makes, how an
answer becomes a value or a typed error, when to retry, and how a session's event stream is
sorted into each command's output and end. client.py and aio.py only move the bytes."""

from __future__ import annotations

import json
import os
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx2

from airlock.errors import AirlockError, BadRequest, ConnectionFailed, Timeout, error_for
from airlock.models import CommandResult, Decision, Output

VERSION = "0.1.0"
USER_AGENT = f"airlock-sdk/{VERSION}"
SUBPROTOCOL = "airlock.v1"
TOKEN_PROTOCOL = "airlock.token."  # noqa: S105 - a prefix, not a secret
WAIT_MARGIN_S = 60  # a waiting call's read timeout: the command's own timeout and this much more
BUFFERED_EVENTS = 10_000  # output kept for commands nobody is waiting on yet, per session stream
SEEN_CHARS = 2**20  # a waited command's streamed output kept to stand for its stored tail


def settings(url: str | None, api_key: str | None) -> tuple[str, str]:
    """The server's URL and the API key: given, or AIRLOCK_URL and AIRLOCK_API_KEY."""
    url = url or os.environ.get("AIRLOCK_URL", "")
    api_key = api_key or os.environ.get("AIRLOCK_API_KEY", "")
    if not url:
        raise AirlockError("configuration", "no server URL: pass url= or set AIRLOCK_URL (e.g. http://127.0.0.1:8000)")
    if urlsplit(url).scheme not in {"http", "https"}:
        raise AirlockError("configuration", f"AIRLOCK_URL must start with http:// or https://, not {url!r}")
    if not api_key:
        raise AirlockError("configuration", "no API key: pass api_key= or set AIRLOCK_API_KEY (alk_…)")
    return url.rstrip("/"), api_key


def stream_url(base_url: str, session_id: str) -> str:
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urlunsplit((scheme, parts.netloc, f"{parts.path}/ws/sessions/{session_id}/", "", ""))


def subprotocols(token: str | None) -> list[str]:
    """A session token goes as a subprotocol (it dies with its session); the API key does not."""
    return [SUBPROTOCOL, TOKEN_PROTOCOL + token] if token else [SUBPROTOCOL]


def auth_message(credential: str) -> str:
    return json.dumps({"type": "auth", "token": credential})


@dataclass(frozen=True)
class Retry:
    """How often and how long to wait before sending a refused (429, 503) or unsent (connection
    failed) request again: `backoff_s` doubling up to `max_backoff_s`, or the server's Retry-After."""

    attempts: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None: no more attempts."""
        if attempt + 1 >= self.attempts:
            return None
        try:
            hinted = float(retry_after) if retry_after is not None else None
        except ValueError:
            hinted = None
        return min(hinted if hinted is not None else self.backoff_s * 2**attempt, self.max_backoff_s)


@dataclass(frozen=True)
class Call:
    """One HTTP request; `answer` says how to read its body: json, bytes or none."""

    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    answer: str = "json"
    read_timeout: float | None = None  # None: the client's own


def unsent(exc: httpx2.TransportError, call: Call, url: str) -> tuple[bool, AirlockError]:
    """Whether a request that failed on the way was never sent (so may be sent again), and the
    error it is if it is not."""
    if isinstance(exc, httpx2.ConnectTimeout):
        return True, Timeout("timeout", f"cannot reach {url}: {exc}")
    if isinstance(exc, httpx2.ConnectError):
        return True, ConnectionFailed("connection_failed", f"cannot reach {url}: {exc}")
    if isinstance(exc, httpx2.TimeoutException):
        return False, Timeout("timeout", f"{call.method} {call.path}: no answer in time ({exc})")
    return False, ConnectionFailed("connection_failed", f"{call.method} {call.path}: {exc}")


UNSTARTED_503 = {"no_runner", "no_capacity", "runner_unreachable"}  # refused before anything was written


def retryable(method: str, status: int, content: bytes) -> bool:
    """Whether an answer may be sent again: a GET's 503, a 503 that says nothing happened (no
    runner, no capacity), and a 429 without a decision (the API's pace). Not a 503 after which
    the server kept a row (`sandbox_unavailable`: a failed session), nor a 429 that carries a
    decision (a tenant's limit, recorded as a denial: sending it again only records more)."""
    if status not in {429, 503}:
        return False
    try:
        body = json.loads(content)
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    if status == 503:
        return method == "GET" or body.get("error") in UNSTARTED_503
    return "decision" not in body


def outcome(call: Call, status: int, headers: Any, content: bytes) -> Any:
    """The value an answer carries, or the typed error it is."""
    if status >= 400:
        try:
            body = json.loads(content) if content else {}
        except ValueError:
            body = {"error": f"http_{status}", "detail": content[:200].decode(errors="replace")}
        raise error_for(status, body, headers.get("retry-after"))
    if call.answer == "bytes":
        return content
    if call.answer == "none" or not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        raise AirlockError("invalid_answer", f"{call.method} {call.path} answered {status} with something that "
                           f"is not JSON: {content[:120]!r}", status=status) from None


def session_path(session_id: str, rest: str = "") -> str:
    """`/api/v1/sessions/<id><rest>`, for a session id that is one (a UUID): anything else is
    refused here, before it could reach another endpoint."""
    try:
        canonical = str(uuid.UUID(str(session_id)))
    except ValueError:
        raise BadRequest("invalid_request", f"{session_id!r} is not a session id (a UUID)",
                         fields={"session": ["not a UUID"]}) from None
    return f"/api/v1/sessions/{canonical}{rest}"


def policy_path(name: str, rest: str = "") -> str:
    return f"/api/v1/policies/{quote(name, safe='')}{rest}"


def workspace_relative(path: str) -> str:
    """`/workspace/x` and `x` alike: paths are relative to the workspace."""
    return path.removeprefix("/workspace/") if path.startswith("/workspace/") else path


def file_path(session_id: str, path: str) -> str:
    """The file's URL, each segment escaped: `.` and `..` too, so that no URL normalisation on
    the way turns `../commands` into another endpoint (the server refuses them, with a decision)."""
    segments = [quote(part, safe="").replace(".", "%2E") if part in {".", ".."} else quote(part, safe="")
                for part in workspace_relative(path).split("/")]
    return session_path(session_id, f"/files/{'/'.join(segments)}")


def command_call(session_id: str, bin_name: str, args: list[str] | tuple[str, ...], *, cwd: str | None,
                 timeout_s: int | None, wait: bool) -> Call:
    """The command's POST; waiting, its read timeout is the command's own and WAIT_MARGIN_S more."""
    body: dict[str, Any] = {"bin": bin_name, "args": list(args), "wait": wait}
    if cwd is not None:
        body["cwd"] = cwd
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    read_timeout = (timeout_s or 3600) + WAIT_MARGIN_S if wait else None
    return Call("POST", session_path(session_id, "/commands"), json=body, read_timeout=read_timeout)


def session_body(conversation_id: str, policy: str | None, repo: str | None, persist: bool,
                 resume: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"conversation_id": conversation_id, "persist": persist}
    if policy:
        body["policy"] = policy
    if repo:
        body["workspace"] = {"repo": repo}
    if resume:
        body["resume"] = resume
    return body


ENDED = {"ended", "killed", "expired", "failed"}


@dataclass
class Demux:
    """A session's stream, sorted by command: output waits in order until its command is
    waited on, and each command's end is kept. A session that ended ends every wait on it."""

    output: dict[str, deque[Output]] = field(default_factory=lambda: defaultdict(deque))
    exited: dict[str, dict[str, Any]] = field(default_factory=dict)
    session_over: str | None = None  # the state it ended in
    lagged: int = 0  # pieces of output the server could not deliver (the stored tail has them)
    buffered: int = 0

    def feed(self, text: str | bytes) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind, command = event.get("event"), event.get("command")
        if kind == "command.output" and isinstance(command, str) and not event.get("snapshot"):
            if self.buffered >= BUFFERED_EVENTS:
                self._evict(command)
            if self.buffered >= BUFFERED_EVENTS:  # all of it is this command's, unread: no more
                self.lagged += 1
                return
            self.output[command].append(Output(str(event.get("stream", "stdout")), str(event.get("data", ""))))
            self.buffered += 1
        elif kind == "command.exited" and isinstance(command, str):
            self.exited[command] = event
        elif kind == "lagged":
            self.lagged += int(event.get("missed") or 1)
        elif kind == "session.state":
            for known in event.get("commands") or []:
                if known.get("state") not in {"queued", "running"}:
                    self.exited.setdefault(str(known.get("command")), known)
            if event.get("state") in ENDED:
                self.session_over = str(event["state"])

    def _evict(self, keep: str) -> None:
        """Make room: drop what waits for commands that ended (nobody waited on them) first, then
        the oldest. Whoever waits on one of them later reads its stored tail instead (a lag)."""
        ended = [command for command in self.output if command in self.exited and command != keep]
        victims = ended or [command for command in self.output if command != keep][:1]
        for command in victims:
            self.buffered -= len(self.output.pop(command))
            self.lagged += 1

    def take(self, command: str) -> list[Output]:
        pieces = list(self.output.pop(command, ()))
        self.buffered -= len(pieces)
        return pieces

    def over(self, command: str) -> bool:
        return command in self.exited or self.session_over is not None


@dataclass
class Seen:
    """What a handle saw of its command on the stream: its output (up to SEEN_CHARS) and the
    session's lag count when it started."""

    lagged_at_start: int
    pieces: list[str] = field(default_factory=list)
    chars: int = 0

    def add(self, piece: Output) -> None:
        self.chars += len(piece.data)
        if self.chars <= SEEN_CHARS:
            self.pieces.append(piece.data)


STATES = {"exited", "timeout", "killed"}  # a reason that is also the command's state (sessions/services.py)


def streamed_result(command_id: str, decision: Decision, demux: Demux, seen: Seen) -> CommandResult | None:
    """The result as the stream told it, when the stream told all of it: the command's own
    `command.exited` (not one reconciled from the database), nothing lagged, nothing cut from
    its tail. The stored tail is then exactly the streamed text (the runner keeps what it
    sends, sessions/output.py). None otherwise: read the command back."""
    end = demux.exited.get(command_id) or {}
    whole = (end.get("event") == "command.exited" and not end.get("reconciled") and not end.get("truncated")
             and end.get("reason") in STATES and demux.lagged == seen.lagged_at_start and seen.chars <= SEEN_CHARS)
    if not whole:
        return None
    output = "".join(seen.pieces)
    raw = {"id": command_id, "state": end["reason"], "exit_code": end.get("exit_code"), "reason": end["reason"],
           "output": output, "truncated": False, "duration_ms": end.get("duration_ms"), "streamed": True}
    return CommandResult(id=command_id, state=end["reason"], exit_code=end.get("exit_code"), reason=end["reason"],
                         output=output, truncated=False, decision=decision, duration_ms=end.get("duration_ms"),
                         raw=raw)
