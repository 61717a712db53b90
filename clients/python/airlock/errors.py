"""Every error the client raises is an AirlockError; `code` is the server's `error` code (or the
client's own: `connection_failed`, `timeout`, `wait_timeout`), `detail` its sentence."""

from __future__ import annotations

from typing import Any

from airlock.models import Decision


class AirlockError(Exception):
    def __init__(self, code: str, detail: str = "", *, status: int | None = None,
                 fields: dict[str, Any] | None = None, body: dict[str, Any] | None = None):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code, self.detail, self.status = code, detail, status
        self.fields = fields or {}
        self.body = body or {}


class ConnectionFailed(AirlockError):
    """The server could not be reached (refused, reset, DNS), after the retries."""


class Timeout(AirlockError):
    """The server did not answer within the client's connect or read timeout."""


class WaitTimeout(Timeout):
    """`CommandHandle.wait(timeout=)` ran out; the command goes on running."""


class BadRequest(AirlockError):
    """400: `fields` names what is wrong with the request, field by field."""


class PolicyInvalid(BadRequest):
    """400 `invalid_policy`: `errors` lists each problem with its path and YAML line."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.body.get("errors") or [])


class Unauthorized(AirlockError):
    """401: no key, an unknown or revoked key, or an ended session's token."""


class Forbidden(AirlockError):
    """403: the key lacks a scope, or the role forbids it."""


class Denied(Forbidden):
    """403 with the policy's decision: why (`reason_code`, `rule`, `message`) and what to do (`hint`)."""

    def __init__(self, decision: Decision, *, code: str, detail: str = "", status: int | None = 403,
                 body: dict[str, Any] | None = None):
        super().__init__(code, detail or decision.message, status=status, body=body)
        self.decision = decision

    @property
    def reason_code(self) -> str | None:
        return self.decision.reason_code

    @property
    def rule(self) -> str | None:
        return self.decision.rule_id

    @property
    def message(self) -> str:
        return self.decision.message

    @property
    def hint(self) -> str:
        return self.decision.hint

    def __str__(self) -> str:
        text = f"denied ({self.reason_code}): {self.message}"
        return f"{text}; hint: {self.hint}" if self.hint else text


class CommandDenied(Denied):
    """The policy refused the command (`command_denied`, or `too_many_commands` past the tenant's limit)."""


class FileDenied(Denied):
    """The file operation was refused (`file_denied`: a path outside the workspace, an ended session)."""


class NotFound(AirlockError):
    """404: no such session, command, file or policy, as far as this key may know."""


class Conflict(AirlockError):
    """409: the object is not in a state that allows it (a session that already ended, say)."""


class TooLarge(AirlockError):
    """413: the file is larger than the server accepts or serves (AIRLOCK_MAX_FILE_BYTES)."""


class QuotaExceeded(AirlockError):
    """507: the workspace is full (the policy's limits.disk_mb)."""


class RateLimited(AirlockError):
    """429 after the retries: the tenant is at a limit. `retry_after` is the server's hint, in seconds."""

    @property
    def retry_after(self) -> float | None:
        value = self.body.get("_retry_after")
        return float(value) if value is not None else None


class Unavailable(AirlockError):
    """502, 503 or 504 after the retries: no runner, or the server is starting or overloaded."""


class ServerError(AirlockError):
    """500: a bug on the server's side."""


BY_STATUS: dict[int, type[AirlockError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    429: RateLimited, 502: Unavailable, 503: Unavailable, 504: Unavailable, 507: QuotaExceeded,
}
DENIALS: dict[str, type[Denied]] = {"command_denied": CommandDenied, "too_many_commands": CommandDenied,
                                    "file_denied": FileDenied}


def error_for(status: int, body: Any, retry_after: str | None = None) -> AirlockError:
    """The typed error for an answer of the server's `{error, detail, fields?, decision?}`."""
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("error") or f"http_{status}")
    detail = str(body.get("detail") or "")
    if retry_after is not None:
        body = {**body, "_retry_after": retry_after}
    if isinstance(body.get("decision"), dict):
        denied = DENIALS.get(code, Denied)
        return denied(Decision.from_api(body["decision"]), code=code, detail=detail, status=status, body=body)
    if code == "invalid_policy":
        return PolicyInvalid(code, detail, status=status, body=body)
    kind = BY_STATUS.get(status, ServerError if status >= 500 else AirlockError)
    return kind(code, detail, status=status, fields=body.get("fields"), body=body)
