"""What the API answers, as plain dataclasses. Each keeps the whole answer in `raw`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Decision:
    """The policy's verdict on one request (docs/architecture.md in the server, "API")."""

    allowed: bool
    effect: str
    reason_code: str | None
    rule_id: str | None
    message: str
    hint: str
    mode: str
    id: str | None = None
    policy_version: dict[str, Any] | None = None

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> Decision:
        return cls(allowed=bool(body.get("allowed")), effect=str(body.get("effect", "")),
                   reason_code=body.get("reason_code"), rule_id=body.get("rule_id"),
                   message=str(body.get("message", "")), hint=str(body.get("hint", "")),
                   mode=str(body.get("mode", "")), id=body.get("id"), policy_version=body.get("policy_version"))


@dataclass(frozen=True)
class Output:
    """A piece of a running command's output, as it streamed: `stream` is stdout or stderr."""

    stream: str
    data: str


@dataclass(frozen=True)
class CommandResult:
    """A command as stored: `output` is the tail the policy keeps (limits.output_tail_chars), redacted."""

    id: str
    state: str
    exit_code: int | None
    reason: str
    output: str
    truncated: bool
    decision: Decision
    duration_ms: int | None = None
    argv: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.state not in {"queued", "running"}

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> CommandResult:
        return cls(id=body["id"], state=body["state"], exit_code=body.get("exit_code"), reason=body.get("reason") or "",
                   output=body.get("output") or "", truncated=bool(body.get("truncated")),
                   decision=Decision.from_api(body.get("decision") or {}), duration_ms=body.get("duration_ms"),
                   argv=list(body.get("argv") or []), raw=body)


@dataclass(frozen=True)
class SessionInfo:
    id: str
    state: str
    conversation_id: str
    policy: str
    policy_version: int
    driver: str
    created_at: str
    ended_at: str | None
    expires_at: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> SessionInfo:
        version = body.get("policy_version") or {}
        return cls(id=body["id"], state=body["state"], conversation_id=body.get("conversation_id", ""),
                   policy=version.get("policy", ""), policy_version=version.get("number", 0),
                   driver=body.get("driver", ""), created_at=body.get("created_at", ""),
                   ended_at=body.get("ended_at"), expires_at=body.get("expires_at"), raw=body)


@dataclass(frozen=True)
class FileEntry:
    path: str
    type: str  # file, dir, symlink or other (a FIFO, socket or device)
    size: int | None
    mode: str
    mtime: int

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> FileEntry:
        return cls(path=body["path"], type=body["type"], size=body.get("size"), mode=body.get("mode", ""),
                   mtime=int(body.get("mtime") or 0))


class Listing(list[FileEntry]):
    """A directory's files, as a list; `truncated`: there were more than the server tells (10,000,
    or deeper than 32 levels)."""

    truncated: bool = False

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> Listing:
        listing = cls(FileEntry.from_api(entry) for entry in body.get("entries") or [])
        listing.truncated = bool(body.get("truncated"))
        return listing
