"""The synchronous client. `Airlock(url, api_key)` → `client.sessions.create(…)` → a Session that
runs commands (streaming their output over the session's WebSocket), reads and writes workspace
files, and ends when its `with` block does. aio.py is the same client for asyncio."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import httpx2
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect

from airlock import _wire
from airlock._wire import Call, Demux, Retry
from airlock.errors import AirlockError, BadRequest, Conflict, NotFound, Unauthorized, WaitTimeout
from airlock.models import CommandResult, Decision, Listing, Output, SessionInfo

OnOutput = Callable[[Output], object]


class Airlock:
    """A client of one Airlock server, authenticated by a tenant's API key (scope `sessions` for
    sessions; `policies:read`/`policies:write` for policies). Arguments left out come from
    AIRLOCK_URL and AIRLOCK_API_KEY. 429 and 503 answers and refused connections are retried
    with backoff (`retry`); `connect_timeout` and `read_timeout` bound each request."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, connect_timeout: float = 5.0,
                 read_timeout: float = 60.0, retry: Retry | None = None):
        self.url, self._api_key = _wire.settings(url, api_key)
        self.retry = retry or Retry()
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._http = httpx2.Client(base_url=self.url, headers={"User-Agent": _wire.USER_AGENT},
                                   timeout=httpx2.Timeout(read_timeout, connect=connect_timeout))
        self.sessions = Sessions(self)
        self.policies = Policies(self)

    def request(self, call: Call, *, credential: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {credential or self._api_key}"}
        timeout = httpx2.Timeout(call.read_timeout or self.read_timeout, connect=self.connect_timeout)
        attempt = 0
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.json, content=call.content,
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
            time.sleep(delay)
            attempt += 1

    def denials(self, period: str = "24h", **filters: str) -> dict[str, Any]:
        """The denial summary (scope `policies:read`): totals, top reasons, rules, programs."""
        return self.request(Call("GET", "/api/v1/denials", params={"period": period, **filters}))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Airlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sessions:
    def __init__(self, client: Airlock):
        self._client = client

    def create(self, conversation_id: str, policy: str | None = None, *, repo: str | None = None,
               persist: bool = False, resume: str | None = None) -> Session:
        """A new sandboxed session under the policy (default: `default`); `with` it to end it."""
        body = _wire.session_body(conversation_id, policy, repo, persist, resume)
        answer = self._client.request(Call("POST", "/api/v1/sessions", json=body))
        return Session(self._client, SessionInfo.from_api(answer), answer["token"])

    def attach(self, session_id: str) -> Session:
        """A session created elsewhere, driven with the API key; leaving its `with` block ends it too."""
        return Session(self._client, self.get(session_id), None)

    def get(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(self._client.request(Call("GET", _wire.session_path(session_id))))

    def list(self, *, state: str = "", conversation_id: str = "") -> list[SessionInfo]:
        params = {key: value for key, value in (("state", state), ("conversation_id", conversation_id)) if value}
        return [SessionInfo.from_api(item) for item in self._client.request(Call("GET", "/api/v1/sessions",
                                                                                 params=params))]

    def end(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(self._client.request(Call("DELETE", _wire.session_path(session_id))))

    def kill(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_api(self._client.request(Call("POST", _wire.session_path(session_id, "/kill"))))


class Session:
    """One sandbox. Its own token (when this client created it) or the API key reaches it."""

    def __init__(self, client: Airlock, info: SessionInfo, token: str | None):
        self._client, self.info, self.token = client, info, token
        self.id = info.id
        self.files = Files(self)
        self._socket: ClientConnection | None = None
        self._sockets = contextlib.ExitStack()
        self._reading = threading.Lock()
        self._demux = Demux()

    def _request(self, call: Call) -> Any:
        try:
            return self._client.request(call, credential=self.token)
        except Unauthorized as exc:
            if self.token is None or exc.code != "session_ended":
                raise
            self.token = None  # revoked when the session ended: what is left to read, the key reads
            return self._client.request(call)

    def run(self, bin: str, args: Iterable[str] = (), *, cwd: str | None = None, timeout_s: int | None = None,
            on_output: OnOutput | None = None) -> CommandResult:
        """Run a command to its end. With `on_output`, each piece of output is handed to it as it
        streams, in order, before this returns. Raises CommandDenied with the policy's decision."""
        if on_output is not None:
            return self.start(bin, args, cwd=cwd, timeout_s=timeout_s, on_output=on_output).wait()
        answer = self._request(_wire.command_call(self.id, bin, tuple(args), cwd=cwd, timeout_s=timeout_s, wait=True))
        result = CommandResult.from_api(answer)
        return result if result.finished else CommandHandle(self, result.id, result.decision, None).wait()

    def start(self, bin: str, args: Iterable[str] = (), *, cwd: str | None = None, timeout_s: int | None = None,
              on_output: OnOutput | None = None) -> CommandHandle:
        """Queue a command and return at once; `on_output` is called from the handle's `wait()`."""
        self._stream()  # subscribed before the command exists: none of its output is missed
        answer = self._request(_wire.command_call(self.id, bin, tuple(args), cwd=cwd, timeout_s=timeout_s, wait=False))
        return CommandHandle(self, answer["id"], Decision.from_api(answer.get("decision") or {}), on_output)

    def command(self, command_id: str) -> CommandResult:
        answer = self._request(Call("GET", _wire.session_path(self.id, f"/commands/{command_id}")))
        return CommandResult.from_api(answer)

    def refresh(self) -> SessionInfo:
        self.info = SessionInfo.from_api(self._request(Call("GET", _wire.session_path(self.id))))
        return self.info

    def end(self) -> SessionInfo:
        """End the session: its sandbox goes, its token stops working."""
        self.info = SessionInfo.from_api(self._client.request(Call("DELETE", _wire.session_path(self.id))))
        self._close_stream()
        return self.info

    def kill(self) -> SessionInfo:
        """Kill it now: the running command ends `killed`, and so does the session."""
        self.info = SessionInfo.from_api(self._client.request(Call("POST", _wire.session_path(self.id, "/kill"))))
        return self.info

    def _stream(self) -> ClientConnection | None:
        """The session's event stream, connected once and kept; None when it cannot be had (the
        waits then ask the API instead)."""
        if self._socket is None:
            try:
                self._socket = self._sockets.enter_context(connect(
                    _wire.stream_url(self._client.url, self.id),
                    subprotocols=_wire.subprotocols(self.token),
                    open_timeout=self._client.connect_timeout, max_size=2**24, user_agent_header=_wire.USER_AGENT))
                if self.token is None:  # the API key: in the first message, not a header a proxy may log
                    self._socket.send(_wire.auth_message(self._client._api_key))
                self._demux.feed(self._socket.recv(timeout=self._client.read_timeout))  # the opening state
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed):
                self._close_stream()
        return self._socket

    def _next_event(self, timeout: float) -> bool:
        """Read what the stream sends within `timeout` s; False when there is no stream."""
        if self._socket is None:
            return False
        if not self._reading.acquire(timeout=timeout):  # another thread reads: it feeds the same demux
            return True
        try:
            self._demux.feed(self._socket.recv(timeout=timeout))
        except TimeoutError:
            pass
        except ConnectionClosed:
            self._close_stream()
            return False
        finally:
            self._reading.release()
        return True

    def _close_stream(self) -> None:
        self._socket = None
        with contextlib.suppress(Exception):
            self._sockets.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """End the session, unless it has ended already (killed, expired)."""
        try:
            with contextlib.suppress(Conflict, NotFound, Unauthorized):
                self.end()
        except AirlockError:
            if kind is None:  # do not hide the error that left the block
                raise
        finally:
            self._close_stream()


class CommandHandle:
    """A command that was queued: `wait()` for its end, `kill()` to stop it."""

    def __init__(self, session: Session, command_id: str, decision: Decision, on_output: OnOutput | None):
        self.session, self.id, self.decision = session, command_id, decision
        self._on_output = on_output
        self._seen = _wire.Seen(session._demux.lagged)

    def wait(self, timeout: float | None = None) -> CommandResult:
        """Its result once it ends, handing its output to `on_output` meanwhile. Raises
        WaitTimeout after `timeout` s: the command goes on, and `wait()` may be called again."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        demux, poll = self.session._demux, 0.05
        while True:
            self._deliver()
            if demux.over(self.id):
                break
            remaining = deadline - time.monotonic() if deadline is not None else 30.0
            if remaining <= 0:
                raise WaitTimeout("wait_timeout", f"command {self.id} still runs after {timeout} s")
            if not self.session._next_event(min(remaining, 30.0)):  # no stream: ask the API
                result = self.session.command(self.id)
                if result.finished:
                    return result
                time.sleep(min(poll, max(remaining, 0)))
                poll = min(poll * 2, 1.0)
        self._deliver()
        streamed = _wire.streamed_result(self.id, self.decision, demux, self._seen)
        if streamed is not None:
            return streamed
        result = self.session.command(self.id)
        while not result.finished:  # the session ended under it: its end is being written
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout("wait_timeout", f"command {self.id} still runs after {timeout} s")
            time.sleep(0.05)
            result = self.session.command(self.id)
        return result

    def kill(self) -> SessionInfo:
        """Stop it by killing its session (one sandbox, one process tree): the command ends `killed`."""
        return self.session.kill()

    def _deliver(self) -> None:
        for piece in self.session._demux.take(self.id):
            self._seen.add(piece)
            if self._on_output is not None:
                self._on_output(piece)


class Files:
    """The session's workspace (/workspace). Paths are relative to it; links are never followed."""

    def __init__(self, session: Session):
        self._session = session

    def write(self, path: str, data: bytes | str) -> None:
        content = data.encode() if isinstance(data, str) else bytes(data)
        self._session._request(Call("PUT", _wire.file_path(self._session.id, path), content=content, answer="none"))

    def read(self, path: str) -> bytes:
        return self._session._request(Call("GET", _wire.file_path(self._session.id, path), answer="bytes"))

    def list(self, path: str = ".") -> Listing:
        """The files under `path`, depth first; `.truncated` when there were more than it tells."""
        answer = self._session._request(Call("GET", _wire.session_path(self._session.id, "/files"),
                                             params={"path": _wire.workspace_relative(path)}))
        return Listing.from_api(answer)


class Policies:
    """A tenant's policies (scopes `policies:read`, `policies:write`)."""

    def __init__(self, client: Airlock):
        self._client = client

    def review(self, name: str, source: str, *, replay: bool = False) -> dict[str, Any]:
        """Check a document without saving it: lint, its own tests, the diff against what is
        published (nothing, for a policy that does not exist yet). Raises PolicyInvalid (with
        `errors` at their lines) when it is not valid."""
        return self._client.request(Call("POST", _wire.policy_path(name, "/review"),
                                         json={"source": source, "replay": replay}))

    def get(self, name: str) -> dict[str, Any]:
        return self._client.request(Call("GET", _wire.policy_path(name)))

    def publish(self, name: str, source: str, *, note: str) -> dict[str, Any]:
        """Save the document as a new version (creating the policy if need be) and publish it.
        Its own tests run first: when one fails, nothing is saved (BadRequest, field `tests`)."""
        review = self.review(name, source)
        if review["tests_failed"]:
            failures = [f"test {o['index']}: expected {o['expected']}, got {o['got']}" for o in review["tests"]
                        if not o["passed"]]
            raise BadRequest("invalid_request", "the document's own tests fail", fields={"tests": failures})
        try:
            self.get(name)
        except NotFound:
            self._client.request(Call("POST", "/api/v1/policies", json={"name": name}))
        version = self._client.request(Call("POST", _wire.policy_path(name, "/versions"),
                                            json={"source": source, "note": note}))
        return self._client.request(Call("POST", _wire.policy_path(name, f"/versions/{version['number']}/publish"),
                                         json={"note": note}))
