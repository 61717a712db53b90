"""The asyncio client: the same calls as client.py, awaited. `on_output` may be a plain function
or a coroutine function."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

import httpx2
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from airlock import _wire
from airlock._wire import Call, Demux, Retry
from airlock.errors import AirlockError, Conflict, NotFound, Unauthorized, WaitTimeout
from airlock.models import CommandResult, Decision, Listing, Output, SessionInfo

OnOutput = Callable[[Output], object] | Callable[[Output], Awaitable[object]]


class AsyncAirlock:
    """See airlock.Airlock: the same arguments, the same retries and timeouts."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, connect_timeout: float = 5.0,
                 read_timeout: float = 60.0, retry: Retry | None = None):
        self.url, self._api_key = _wire.settings(url, api_key)
        self.retry = retry or Retry()
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._http = httpx2.AsyncClient(base_url=self.url, headers={"User-Agent": _wire.USER_AGENT},
                                        timeout=httpx2.Timeout(read_timeout, connect=connect_timeout))
        self.sessions = AsyncSessions(self)

    async def request(self, call: Call, *, credential: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {credential or self._api_key}"}
        timeout = httpx2.Timeout(call.read_timeout or self.read_timeout, connect=self.connect_timeout)
        attempt = 0
        while True:
            try:
                response = await self._http.request(call.method, call.path, json=call.json, content=call.content,
                                                    params=call.params, headers=headers, timeout=timeout)
            except httpx2.TransportError as exc:
                again, error = _wire.unsent(exc, call, self.url)
                delay = self.retry.delay(attempt) if again else None
                if delay is None:
                    raise error from None
            else:
                again = _wire.retryable(call.method, response.status_code, response.content)
                delay = self.retry.delay(attempt, response.headers.get("retry-after")) if again else None
                if delay is None:
                    return _wire.outcome(call, response.status_code, response.headers, response.content)
            await asyncio.sleep(delay)
            attempt += 1

    async def denials(self, period: str = "24h", **filters: str) -> dict[str, Any]:
        return await self.request(Call("GET", "/api/v1/denials", params={"period": period, **filters}))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAirlock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSessions:
    def __init__(self, client: AsyncAirlock):
        self._client = client

    def create(self, conversation_id: str, policy: str | None = None, *, repo: str | None = None,
               persist: bool = False, resume: str | None = None) -> _Creating:
        """`async with client.sessions.create(…) as s:` ends it on exit; or `s = await …create(…)`."""
        body = _wire.session_body(conversation_id, policy, repo, persist, resume)
        return _Creating(self._client, body)

    async def attach(self, session_id: str) -> AsyncSession:
        return AsyncSession(self._client, await self.get(session_id), None)

    async def get(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(await self._client.request(Call("GET", _wire.session_path(session_id))))

    async def list(self, *, state: str = "", conversation_id: str = "") -> list[SessionInfo]:
        params = {key: value for key, value in (("state", state), ("conversation_id", conversation_id)) if value}
        answer = await self._client.request(Call("GET", "/api/v1/sessions", params=params))
        return [SessionInfo.from_api(item) for item in answer]

    async def end(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(await self._client.request(Call("DELETE", _wire.session_path(session_id))))

    async def kill(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(await self._client.request(Call("POST", _wire.session_path(session_id, "/kill"))))


class _Creating:
    """What `sessions.create` returns: awaitable, or an async context manager that ends the session."""

    def __init__(self, client: AsyncAirlock, body: dict[str, Any]):
        self._client, self._body = client, body
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        answer = await self._client.request(Call("POST", "/api/v1/sessions", json=self._body))
        return AsyncSession(self._client, SessionInfo.from_api(answer), answer["token"])

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._session is not None
        await self._session.__aexit__(kind, exc, tb)


class AsyncSession:
    def __init__(self, client: AsyncAirlock, info: SessionInfo, token: str | None):
        self._client, self.info, self.token = client, info, token
        self.id = info.id
        self.files = AsyncFiles(self)
        self._socket: ClientConnection | None = None
        self._sockets = contextlib.AsyncExitStack()
        self._reading = asyncio.Lock()
        self._demux = Demux()

    async def _request(self, call: Call) -> Any:
        try:
            return await self._client.request(call, credential=self.token)
        except Unauthorized as exc:
            if self.token is None or exc.code != "session_ended":
                raise
            self.token = None
            return await self._client.request(call)

    async def run(self, bin: str, args: Iterable[str] = (), *, cwd: str | None = None, timeout_s: int | None = None,
                  on_output: OnOutput | None = None) -> CommandResult:
        if on_output is not None:
            handle = await self.start(bin, args, cwd=cwd, timeout_s=timeout_s, on_output=on_output)
            return await handle.wait()
        call = _wire.command_call(self.id, bin, tuple(args), cwd=cwd, timeout_s=timeout_s, wait=True)
        result = CommandResult.from_api(await self._request(call))
        return result if result.finished else await AsyncCommandHandle(self, result.id, result.decision, None).wait()

    async def start(self, bin: str, args: Iterable[str] = (), *, cwd: str | None = None,
                    timeout_s: int | None = None, on_output: OnOutput | None = None) -> AsyncCommandHandle:
        await self._stream()
        call = _wire.command_call(self.id, bin, tuple(args), cwd=cwd, timeout_s=timeout_s, wait=False)
        answer = await self._request(call)
        return AsyncCommandHandle(self, answer["id"], Decision.from_api(answer.get("decision") or {}), on_output)

    async def command(self, command_id: str) -> CommandResult:
        answer = await self._request(Call("GET", _wire.session_path(self.id, f"/commands/{command_id}")))
        return CommandResult.from_api(answer)

    async def refresh(self) -> SessionInfo:
        self.info = SessionInfo.from_api(await self._request(Call("GET", _wire.session_path(self.id))))
        return self.info

    async def end(self) -> SessionInfo:
        self.info = SessionInfo.from_api(await self._client.request(Call("DELETE", _wire.session_path(self.id))))
        await self._close_stream()
        return self.info

    async def kill(self) -> SessionInfo:
        self.info = SessionInfo.from_api(await self._client.request(Call("POST", _wire.session_path(self.id, "/kill"))))
        return self.info

    async def _stream(self) -> ClientConnection | None:
        if self._socket is None:
            try:
                self._socket = await self._sockets.enter_async_context(connect(
                    _wire.stream_url(self._client.url, self.id),
                    subprotocols=_wire.subprotocols(self.token),
                    open_timeout=self._client.connect_timeout, max_size=2**24, user_agent_header=_wire.USER_AGENT))
                if self.token is None:
                    await self._socket.send(_wire.auth_message(self._client._api_key))
                self._demux.feed(await asyncio.wait_for(self._socket.recv(), self._client.read_timeout))
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed):
                await self._close_stream()
        return self._socket

    async def _next_event(self, timeout: float) -> bool:
        if self._socket is None:
            return False
        if self._reading.locked():  # another task reads: it feeds the same demux
            await asyncio.sleep(min(timeout, 0.01))
            return True
        async with self._reading:
            try:
                self._demux.feed(await asyncio.wait_for(self._socket.recv(), timeout))
            except TimeoutError:
                pass
            except ConnectionClosed:
                await self._close_stream()
                return False
        return True

    async def _close_stream(self) -> None:
        self._socket = None
        with contextlib.suppress(Exception):
            await self._sockets.aclose()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            with contextlib.suppress(Conflict, NotFound, Unauthorized):
                await self.end()
        except AirlockError:
            if kind is None:
                raise
        finally:
            await self._close_stream()


class AsyncCommandHandle:
    def __init__(self, session: AsyncSession, command_id: str, decision: Decision, on_output: OnOutput | None):
        self.session, self.id, self.decision = session, command_id, decision
        self._on_output = on_output
        self._seen = _wire.Seen(session._demux.lagged)

    async def wait(self, timeout: float | None = None) -> CommandResult:
        deadline = time.monotonic() + timeout if timeout is not None else None
        demux, poll = self.session._demux, 0.05
        while True:
            await self._deliver()
            if demux.over(self.id):
                break
            remaining = deadline - time.monotonic() if deadline is not None else 30.0
            if remaining <= 0:
                raise WaitTimeout("wait_timeout", f"command {self.id} still runs after {timeout} s")
            if not await self.session._next_event(min(remaining, 30.0)):
                result = await self.session.command(self.id)
                if result.finished:
                    return result
                await asyncio.sleep(min(poll, max(remaining, 0)))
                poll = min(poll * 2, 1.0)
        await self._deliver()
        streamed = _wire.streamed_result(self.id, self.decision, demux, self._seen)
        if streamed is not None:
            return streamed
        result = await self.session.command(self.id)
        while not result.finished:  # the session ended under it: its end is being written
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout("wait_timeout", f"command {self.id} still runs after {timeout} s")
            await asyncio.sleep(0.05)
            result = await self.session.command(self.id)
        return result

    async def kill(self) -> SessionInfo:
        return await self.session.kill()

    async def _deliver(self) -> None:
        for piece in self.session._demux.take(self.id):
            self._seen.add(piece)
            if self._on_output is not None:
                called = self._on_output(piece)
                if inspect.isawaitable(called):
                    await called


class AsyncFiles:
    def __init__(self, session: AsyncSession):
        self._session = session

    async def write(self, path: str, data: bytes | str) -> None:
        content = data.encode() if isinstance(data, str) else bytes(data)
        await self._session._request(Call("PUT", _wire.file_path(self._session.id, path), content=content,
                                          answer="none"))

    async def read(self, path: str) -> bytes:
        return await self._session._request(Call("GET", _wire.file_path(self._session.id, path), answer="bytes"))

    async def list(self, path: str = ".") -> Listing:
        answer = await self._session._request(Call("GET", _wire.session_path(self._session.id, "/files"),
                                                   params={"path": _wire.workspace_relative(path)}))
        return Listing.from_api(answer)
