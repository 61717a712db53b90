"""The audit log's keyed hash chain, and its checkpoints outside the database.

Each tenant has its own chain: event n stores `prev_hash` (event n-1's hash, or GENESIS) and
`hash = HMAC-SHA256(key, prev_hash + canonical_json(event))`. The key is not in the database
(AIRLOCK_AUDIT_KEY, else derived from SECRET_KEY), so whoever can write the database can
neither edit an event and re-hash the rest nor forge a new one (events from before the chain
was keyed were re-chained by migration 0002). The database itself refuses UPDATE, DELETE and
TRUNCATE of audit rows (migration 0003).

What the database cannot prove is what it no longer holds. After every event the tenant's head
(count, last hash) is appended, signed with the same key, to a checkpoint file outside the
database (AIRLOCK_AUDIT_CHECKPOINTS), linked to the line before it, and written to the log;
`audit_verify` compares each chain with every one of its checkpoints, so the last events deleted
(even once as many were written again), a whole chain deleted (or its tenant), a chain
re-hashed and checkpoint lines cut out of the file are each found and named
(docs/architecture.md, "Audit")."""

import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.models import AuditEvent, Tenant

GENESIS = "0" * 64
TAIL_BYTES = 4096  # read back this much at a time for the last checkpoint line (~250 bytes)
LINE_MAX = 2**20
LOCK_WAIT_S = 1.0
_writers = threading.Lock()
log = logging.getLogger("airlock.audit")


def canonical_json(event: AuditEvent) -> str:
    body = {
        "tenant": event.tenant_id,
        "seq": event.seq,
        "created_at": event.created_at.isoformat(),
        "actor": event.actor,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "data": event.data,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _key() -> bytes:
    if settings.AIRLOCK_AUDIT_KEY:
        return settings.AIRLOCK_AUDIT_KEY.encode()
    return hmac.new(settings.SECRET_KEY.encode(), b"airlock audit chain v1", hashlib.sha256).digest()


def _mac(text: str) -> str:
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()


def chain_hash(prev_hash: str, event: AuditEvent) -> str:
    return _mac(prev_hash + canonical_json(event))


def actor_label(actor) -> str:
    """'user:alice', 'apikey:alk_ab12cd34', 'system', or a label given as a string
    ('session:<id>' for a session's own token)."""
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    if hasattr(actor, "prefix"):
        return f"apikey:{actor.PREFIX}{actor.prefix}"
    return f"user:{actor.get_username()}"


def user_of(actor):
    """The user behind an actor, or None for an API key or the system."""
    return actor if actor is not None and not isinstance(actor, str) and not hasattr(actor, "prefix") else None


@transaction.atomic
def audit_record(
    *, tenant: Tenant, actor, action: str, target=None, data: dict | None = None
) -> AuditEvent:
    """Append one event to the tenant's chain, and checkpoint the new head once it commits. The
    tenant row is locked so that concurrent writers take sequence numbers one at a time (SQLite
    serialises writers by itself)."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    last = AuditEvent.objects.filter(tenant=tenant).order_by("-seq").values("seq", "hash").first()
    event = AuditEvent(
        tenant=tenant,
        seq=(last["seq"] + 1) if last else 1,
        created_at=timezone.now(),
        actor_user=user_of(actor),
        actor=actor_label(actor),
        action=action,
        target_type=type(target).__name__.lower() if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        data=json.loads(json.dumps(data or {}, default=str)),
        prev_hash=last["hash"] if last else GENESIS,
    )
    event.hash = chain_hash(event.prev_hash, event)
    event.save()
    transaction.on_commit(lambda: checkpoint(tenant, event.seq, event.hash))
    return event


# -- checkpoints ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    tenant_id: int
    tenant: str
    count: int
    hash: str
    at: str


def checkpoint(tenant: Tenant, count: int, head: str) -> None:
    """Append a signed line with the tenant's head to the checkpoint file, and log it. Each line
    also carries the SHA-256 of the line before it (`prev`), under its signature: a line cut
    from the file's middle breaks the next one's link. A failed write is logged, never raised:
    the event it follows has committed, and the next checkpoint of the tenant covers it."""
    line = {"tenant_id": tenant.pk, "tenant": tenant.slug, "count": count, "hash": head,
            "at": timezone.now().isoformat()}
    log.info("audit checkpoint: tenant %s has %d events, head %s", tenant.slug, count, head)
    try:
        descriptor = _open_checkpoints(os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            # The last line read is the one the new line follows: this process's writers take
            # turns, and each holds the file's lock against other processes (each wait bounded).
            if not _writers.acquire(timeout=LOCK_WAIT_S):
                raise OSError(errno.EWOULDBLOCK, f"this process's other writers held it for more than {LOCK_WAIT_S} s",
                              str(settings.AIRLOCK_AUDIT_CHECKPOINTS))
            try:
                _append(descriptor, line)
            finally:
                _writers.release()
        finally:
            os.close(descriptor)
    except Exception as exc:  # (never into the request: its event has committed)
        log.error("could not write the audit checkpoint to %s: %s", settings.AIRLOCK_AUDIT_CHECKPOINTS, exc)


def _append(descriptor: int, line: dict) -> None:
    _lock(descriptor)
    size = os.lseek(descriptor, 0, os.SEEK_END)
    last = _last_line(descriptor, size)
    if not last and (held := _events_held()):
        # The file begins (again) while the database holds events it did not see: it was deleted
        # or emptied, or checkpoints could not be written. Said in the first line, under its MAC.
        line = {**line, "events_before": held - 1}
    linked = {**line, "prev": _line_digest(last.rstrip(b"\n"))}
    text = json.dumps(linked, sort_keys=True, separators=(",", ":"))
    record = json.dumps({**linked, "mac": _mac(text)}, sort_keys=True, separators=(",", ":")) + "\n"
    # (A line cut short, by a crash or a full disk, is ended first: the new one stands alone.)
    data = (b"\n" if last and not last.endswith(b"\n") else b"") + record.encode()
    if os.write(descriptor, data) != len(data):  # a full disk: take the part back, say so
        os.ftruncate(descriptor, size)
        raise OSError(errno.ENOSPC, "the line was written in part (the disk is full?) and taken back",
                      str(settings.AIRLOCK_AUDIT_CHECKPOINTS))


def _events_held() -> int | None:
    try:
        return AuditEvent.objects.count()
    except Exception:  # no database here (a test's bare call): nothing to say
        return None


def _open_checkpoints(flags: int) -> int:
    """The checkpoint file, which must be a regular file: a FIFO or a device there would block
    or feed the reader (it is opened without waiting, then checked)."""
    descriptor = os.open(settings.AIRLOCK_AUDIT_CHECKPOINTS, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "the audit checkpoint file is not a regular file",
                      str(settings.AIRLOCK_AUDIT_CHECKPOINTS))
    return descriptor


def _lock(descriptor: int) -> None:
    """An exclusive lock on the file, waited for LOCK_WAIT_S at most: whoever else holds it (any
    process that may open the file) does not hold up the request that wrote the event."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OSError(errno.EWOULDBLOCK, f"another process holds its lock for more than {LOCK_WAIT_S} s",
                              str(settings.AIRLOCK_AUDIT_CHECKPOINTS)) from None
            time.sleep(0.005)


def _last_line(descriptor: int, size: int) -> bytes:
    """The file's last line (with its newline if it has one; b"" for an empty file), read back
    TAIL_BYTES at a time, LINE_MAX at most: a longer line is never an honest one."""
    chunks, position = [], size
    while position > 0 and size - position < LINE_MAX:
        start = max(0, position - TAIL_BYTES)
        chunk = os.pread(descriptor, position - start, start)
        chunks.append(chunk)
        if b"\n" in (chunk[:-1] if position == size else chunk):  # (the file's own last newline ends no line)
            break
        position = start
    tail = b"".join(reversed(chunks))
    return tail[tail.rfind(b"\n", 0, len(tail) - 1) + 1:]


def _line_digest(raw: bytes) -> str:
    """`prev` of the line after `raw` (the file's first line follows nothing: "")."""
    return hashlib.sha256(raw).hexdigest() if raw else ""


@dataclass(frozen=True)
class CheckpointFile:
    found: dict[int, list[Checkpoint]]  # the signed lines, by tenant id, in the file's order
    forged: list[int]  # numbers of lines whose signature does not hold
    cut: list[int]  # numbers of lines that do not follow the line before them (lines were cut out)
    restarted: list[tuple[int, int]]  # (line, events the database held before): the file begun again


def checkpoints() -> CheckpointFile:
    """Every signed checkpoint, and what is wrong with the file's lines. FileNotFoundError when
    there is no file, OSError when it is not a regular file. A tenant is its id, not its slug,
    which may be renamed. Lines written before lines were linked carry no `prev`; once one does,
    every later line must."""
    found: dict[int, list[Checkpoint]] = {}
    forged: list[int] = []
    cut: list[int] = []
    restarted: list[tuple[int, int]] = []
    previous, linked = b"", False
    with os.fdopen(_open_checkpoints(os.O_RDONLY), "rb") as lines:
        for number, raw in enumerate(lines, 1):
            raw = raw.rstrip(b"\n")
            try:
                line = json.loads(raw)
                mac = line.pop("mac")
                valid = hmac.compare_digest(mac, _mac(json.dumps(line, sort_keys=True, separators=(",", ":"))))
                point = Checkpoint(line["tenant_id"], line["tenant"], line["count"], line["hash"], line["at"])
            except (ValueError, KeyError, TypeError, AttributeError):
                valid = False
            if not valid:
                forged.append(number)
            else:
                found.setdefault(point.tenant_id, []).append(point)
                if isinstance(line.get("events_before"), int) and line["events_before"] > 0:
                    restarted.append((number, line["events_before"]))
                if "prev" in line or linked:
                    linked = True
                    if line.get("prev") != _line_digest(previous):
                        cut.append(number)
            previous = raw
    return CheckpointFile(found, forged, cut, restarted)


# -- verification ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokenLink:
    tenant: str
    seq: int
    problem: str


_FROM_FILE = object()


def audit_verify(tenant: Tenant, points=_FROM_FILE) -> BrokenLink | None:
    """The first broken link of the tenant's chain, or None when it is whole and agrees with
    every one of its checkpoints (`points`: a list of Checkpoints, or by default the file's).
    Every checkpoint is compared, not only the latest: events deleted from the end and as many
    written again since carry the counts of older checkpoints, but not their hashes."""
    if points is _FROM_FILE:
        try:
            points = checkpoints().found.get(tenant.pk, [])
        except FileNotFoundError:
            points = []
    by_count: dict[int, list[Checkpoint]] = {}
    for point in points:
        by_count.setdefault(point.count, []).append(point)
    prev_hash, expected_seq = GENESIS, 1
    for event in _events_in_order(tenant):
        if event.seq != expected_seq:
            return BrokenLink(tenant.slug, expected_seq, f"event #{expected_seq} is missing (found #{event.seq})")
        if event.prev_hash != prev_hash:
            return BrokenLink(tenant.slug, event.seq, "prev_hash does not match the previous event's hash")
        if not hmac.compare_digest(chain_hash(prev_hash, event), event.hash):
            return BrokenLink(tenant.slug, event.seq, "the event's content does not match its hash (edited, or "
                                                      "hashed without the key)")
        for point in by_count.get(event.seq, ()):
            if not hmac.compare_digest(point.hash, event.hash):
                return BrokenLink(tenant.slug, event.seq, f"re-hashed: event #{event.seq}'s hash is not the one "
                                                          f"checkpointed at {point.at} (the chain was re-hashed, or "
                                                          f"its events from #{event.seq} on were deleted and others "
                                                          "written in their place)")
        prev_hash, expected_seq = event.hash, expected_seq + 1
    count = expected_seq - 1
    if not points:
        return None
    top = max(points, key=lambda point: point.count)
    if count == 0:
        return BrokenLink(tenant.slug, 1, f"the whole chain was deleted: the checkpoint of {top.at} recorded "
                                          f"{top.count} events")
    if count < top.count:
        return BrokenLink(tenant.slug, count + 1, f"truncated: the chain ends at #{count}, the checkpoint of "
                                                  f"{top.at} recorded {top.count} events (#{count + 1}-"
                                                  f"#{top.count} were deleted)")
    return None


def _events_in_order(tenant: Tenant) -> Iterator[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).order_by("seq").iterator(chunk_size=2000)
