"""`airlock mcp`: Airlock's sandbox as MCP tools, on the official MCP SDK (`mcp`), over stdio or
streamable HTTP. A denial is a tool error whose text carries the reason code and the hint, for
the model to read and act on.

One Airlock session per MCP session. Over stdio the MCP session is the process: its Airlock
session opens at the first tool call and ends when the client goes. Over HTTP, a client that
holds an `Mcp-Session-Id` (protocol revisions up to 2025-11-25) gets one Airlock session per MCP
session, ended by its DELETE; revision 2026-07-28 has no MCP sessions at all (each request stands
alone), so there every result carries `session_id` and a call that passes it back reaches the
same workspace. Either way an Airlock session idle for `--idle-timeout` seconds is ended, and all
of them when the server stops."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from airlock.aio import AsyncAirlock, AsyncSession
from airlock.errors import AirlockError, Denied

SESSION_HEADER = "mcp-session-id"
MAX_SESSIONS = 32
IDLE_TIMEOUT_S = 1800.0
READ_LIMIT_CHARS = 100_000
LIST_LIMIT = 1000  # entries shown to the model; `truncated` says when there were more
INSTRUCTIONS = (
    "Run programs in an isolated Airlock sandbox whose policy decides what may run. The workspace is /workspace: "
    "write files there, run commands, read results. Pass back the `session_id` a result gave you to keep using the "
    "same workspace. A denied command comes back as an error with a reason code and a hint: follow the hint "
    "(another program, other arguments); do not retry the same command.")
T = TypeVar("T")
SessionArg = Annotated[str | None, Field(description="the session_id an earlier result gave; leave it out to use "
                                                     "this MCP session's (a new one if there is none)")]


@dataclass
class Entry:
    session: AsyncSession | None = None
    used: float = field(default_factory=time.monotonic)
    busy: int = 0  # calls in flight: an entry with one is never idle
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sessions:
    """The Airlock session of each MCP session, by key: `stdio`, the MCP session id, or (HTTP
    without MCP sessions) the Airlock session's own id."""

    def __init__(self, client: AsyncAirlock, *, policy: str | None, conversation_id: str | None,
                 max_sessions: int = MAX_SESSIONS):
        self.client, self.policy, self.conversation_id = client, policy, conversation_id
        self.max_sessions = max_sessions
        self.entries: dict[str, Entry] = {}

    async def get(self, key: str | None, session_id: str | None = None) -> tuple[str, AsyncSession]:
        """The key and Airlock session a call reaches: `session_id`'s, if this server opened it;
        else its MCP session's (`key`), opened now if need be. No key (a stateless request): a
        new session, its id the key."""
        if session_id:
            entry = self.entries.get(session_id) or next(
                (entry for entry in self.entries.values() if entry.session and entry.session.id == session_id), None)
            if entry is None:
                raise ToolError(f"unknown_session: {session_id} is not a session this server opened (or it ended "
                                "after being idle); leave session_id out to open a new one")
            key = next(k for k, e in self.entries.items() if e is entry)
        else:
            key = key or f"call-{uuid.uuid4().hex}"
            if key not in self.entries and len(self.entries) >= self.max_sessions:
                raise ToolError(f"too_many_sessions: this server holds {self.max_sessions} sessions already; pass "
                                "the session_id of one of yours, or wait for idle ones to end")
            entry = self.entries.setdefault(key, Entry())
        entry.used = time.monotonic()
        async with entry.lock:  # two first calls at once open one session
            if entry.session is None:
                conversation = self.conversation_id or f"mcp-{uuid.uuid4().hex[:12]}"
                try:
                    entry.session = await self.client.sessions.create(conversation, self.policy)
                except AirlockError:  # none was opened: the entry holds no place
                    self.entries.pop(key, None)
                    raise
        if key.startswith("call-"):  # stateless: found again by its session's id
            self.entries[entry.session.id] = self.entries.pop(key)
            key = entry.session.id
        return key, entry.session

    async def close(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None and entry.session is not None:
            with contextlib.suppress(AirlockError):
                await entry.session.__aexit__(None, None, None)

    async def close_idle(self, idle_s: float) -> None:
        now = time.monotonic()
        for key in [key for key, entry in self.entries.items()
                    if not entry.busy and not entry.lock.locked() and now - entry.used > idle_s]:
            await self.close(key)

    async def close_all(self) -> None:
        for key in list(self.entries):
            await self.close(key)


def _key(ctx: Context) -> str | None:
    """`stdio`; an HTTP request's MCP session id; or None (HTTP without MCP sessions)."""
    request = ctx.request_context.request
    if request is None:
        return "stdio"
    return request.headers.get(SESSION_HEADER)


def _tool_error(exc: AirlockError) -> ToolError:
    if isinstance(exc, Denied):
        text = f"denied: {exc.reason_code}: {exc.message}"
        return ToolError(f"{text}. hint: {exc.hint}" if exc.hint else text)
    return ToolError(f"{exc.code}: {exc.detail}" if exc.detail else exc.code)


def build(client: AsyncAirlock, *, policy: str | None = None, conversation_id: str | None = None,
          idle_timeout_s: float = IDLE_TIMEOUT_S) -> tuple[MCPServer, Sessions]:
    registry = Sessions(client, policy=policy, conversation_id=conversation_id)

    async def sweep() -> None:
        while True:
            await anyio.sleep(min(idle_timeout_s / 2, 30.0))
            await registry.close_idle(idle_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[Sessions]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sweep)
            try:
                yield registry
            finally:  # the client went (stdio) or the server stops: every sandbox goes with it
                tasks.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await registry.close_all()

    server = MCPServer("airlock", instructions=INSTRUCTIONS, lifespan=lifespan)

    async def using(ctx: Context, session_id: str | None, work: Callable[[AsyncSession], Awaitable[T]]) -> tuple[
            AsyncSession, T]:
        """The call's Airlock session and what `work` made of it; an Airlock error as a tool error."""
        key, entry = _key(ctx), None
        try:
            key, session = await registry.get(key, session_id)
            entry = registry.entries.get(key)
            if entry is not None:
                entry.busy += 1
            return session, await work(session)
        except AirlockError as exc:
            raise _tool_error(exc) from None
        finally:
            if entry is not None:
                entry.busy -= 1
                entry.used = time.monotonic()

    @server.tool(description="Run one program in the sandbox (no shell: a program name and its arguments) and "
                 "return its exit code, how it ended and the tail of its output. The policy decides what may run; "
                 "a denial is an error carrying the reason and a hint.")
    async def run_command(
        bin: Annotated[str, Field(description="the program, a bare name such as pytest or python3")],
        ctx: Context,
        args: Annotated[list[str] | None, Field(description="its arguments, one string each")] = None,
        cwd: Annotated[str, Field(description="the working directory, inside /workspace")] = "/workspace",
        timeout_s: Annotated[int | None, Field(ge=1, description="seconds; at most the policy's limit")] = None,
        session_id: SessionArg = None,
    ) -> dict[str, Any]:
        session, result = await using(ctx, session_id, lambda s: s.run(bin, args or [], cwd=cwd, timeout_s=timeout_s))
        return {"exit_code": result.exit_code, "reason": result.reason, "output": result.output,
                "truncated": result.truncated, "duration_ms": result.duration_ms, "session_id": session.id}

    @server.tool(description="Write a text file in the workspace, creating its directories; replaces the file "
                 "whole and atomically.")
    async def write_file(
        path: Annotated[str, Field(description="relative to /workspace, e.g. tests/test_app.py")],
        content: Annotated[str, Field(description="the whole new content, UTF-8")],
        ctx: Context,
        session_id: SessionArg = None,
    ) -> dict[str, Any]:
        session, _ = await using(ctx, session_id, lambda s: s.files.write(path, content))
        return {"path": path, "bytes": len(content.encode()), "session_id": session.id}

    @server.tool(description=f"Read a file of the workspace as text (its first {READ_LIMIT_CHARS} characters; "
                 "what is not UTF-8 is replaced; `truncated` says if there was more).")
    async def read_file(
        path: Annotated[str, Field(description="relative to /workspace")],
        ctx: Context,
        session_id: SessionArg = None,
    ) -> dict[str, Any]:
        session, data = await using(ctx, session_id, lambda s: s.files.read(path))
        text = data.decode(errors="replace")
        return {"path": path, "content": text[:READ_LIMIT_CHARS], "truncated": len(text) > READ_LIMIT_CHARS,
                "session_id": session.id}

    @server.tool(description="List the files under a directory of the workspace (default: all of it): path, "
                 "type (file, dir, symlink, other) and size in bytes. Links are listed, never followed.")
    async def list_files(
        ctx: Context,
        path: Annotated[str, Field(description="a directory relative to /workspace; . for all")] = ".",
        session_id: SessionArg = None,
    ) -> dict[str, Any]:
        session, entries = await using(ctx, session_id, lambda s: s.files.list(path))
        shown = entries[:LIST_LIMIT]
        return {"entries": [{"path": e.path, "type": e.type, "size": e.size} for e in shown],
                "truncated": entries.truncated or len(entries) > LIST_LIMIT, "session_id": session.id}

    return server, registry


def http_app(server: MCPServer, registry: Sessions, *, token: str, host: str = "127.0.0.1",
             idle_timeout_s: float = IDLE_TIMEOUT_S) -> Any:
    """The streamable HTTP app behind a bearer token (whoever holds it acts with this server's
    API key), and an MCP session's DELETE ending its Airlock session once the SDK accepted it."""
    app = server.streamable_http_app(session_idle_timeout=idle_timeout_s, host=host)
    expected = f"Bearer {token}".encode()

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if not hmac.compare_digest(headers.get(b"authorization", b""), expected):
            body = b'{"error": "unauthorized", "detail": "send Authorization: Bearer <the token airlock mcp printed>"}'
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="airlock-mcp"')]})
            await send({"type": "http.response.body", "body": body})
            return
        status: list[int] = []

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await app(scope, receive, watch)
        key = headers.get(SESSION_HEADER.encode())
        if scope["method"] == "DELETE" and key and status and status[0] < 400:
            await registry.close(key.decode("latin-1"))

    return wrapped


def serve(*, url: str | None, api_key: str | None, transport: str = "stdio", host: str = "127.0.0.1",
          port: int = 8765, policy: str | None = None, conversation_id: str | None = None,
          idle_timeout_s: float = IDLE_TIMEOUT_S, token: str | None = None) -> int:
    client = AsyncAirlock(url, api_key)
    server, registry = build(client, policy=policy, conversation_id=conversation_id, idle_timeout_s=idle_timeout_s)
    if transport == "stdio":
        anyio.run(server.run_stdio_async)
        return 0
    import uvicorn

    if not token:
        token = secrets.token_urlsafe(32)
        print(f"airlock mcp: http://{host}:{port}/mcp  token (send as Authorization: Bearer): {token}",
              file=sys.stderr, flush=True)
    uvicorn.run(http_app(server, registry, token=token, host=host, idle_timeout_s=idle_timeout_s), host=host,
                port=port, log_level="warning", lifespan="on")
    return 0
