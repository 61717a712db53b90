"""Taking, checking, restoring, deleting and pruning snapshots and artifacts (docs/architecture.md,
"Persistence").

Taking one: the runner reads what it needs (`plan_for`, database), packs and seals the workspace
into storage (`take`, its threads: the sandbox's tar streams through the reader and the sealer,
never touching the runner's disk in plaintext), then records the signed manifest (`record`).

Resuming one is checked twice, each check named by the decision's rule (`persistence.<check>`):
the opener checks the claim from the database alone (`claim`: this tenant's and conversation's,
signed, not expired, the policy's requirements), the runner then checks the bytes before a single
one is in place (`restore`: the signature again, the blob opens under this tenant's key for this
object, every file's digest, size, mode and path is the manifest's, the root filesystem when the
policy asks). Checking and unpacking run at once (`unpack_checked`): the sandbox's tar reads each
segment once it has authenticated, into a stage no command sees, and the stage moves into the
workspace only when every check holds. A failure is a `ProvenanceError`, which the opener records
as a denial."""

import contextlib
import fcntl
import io
import logging
import os
import queue
import secrets
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import BinaryIO

from django.core.files.base import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.keys import KeyUnavailable, TenantKey, current_key, key_version
from controlplane.models import Tenant
from policies_app.document import Persistence
from sessions import admission
from sessions.models import Artifact, CommandRun, Packed, Session, Snapshot
from sessions.persistence import manifest as mf
from sessions.persistence.pack import Unreadable, pack, settle, unpack
from sessions.persistence.sealed import Sealer, Unsealable, unseal
from sessions.persistence.tarstream import BadTar, TarReader
from sessions.runtimes.base import Driver, Sandbox, SandboxError
from sessions.workspace import WorkspaceError

log = logging.getLogger("airlock.persistence")
KINDS = {"snapshot": Snapshot, "artifact": Artifact}


class ProvenanceError(Exception):
    """A stored tree failed a check: `reason_code` provenance_invalid (altered, forged, expired) or
    provenance_mismatch (valid, not for this request); `rule_id` names the check."""

    def __init__(self, reason_code: str, check: str, message: str, hint: str = ""):
        super().__init__(message)
        self.reason_code, self.rule_id, self.message = reason_code, f"persistence.{check}", message
        self.hint = hint or ("resume another snapshot of this conversation, or start empty; a security admin can "
                             "verify this one on the conversation's page")


def storage():
    return storages["persistence"]


def persistence_of(document: dict) -> Persistence:
    return Persistence.model_validate(document.get("persistence") or {})


# -- taking ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What the runner needs to take one, read once from the database."""

    kind: str
    object_id: str
    tenant_id: int
    key: TenantKey
    manifest: dict  # everything but the files, the skipped and the blob
    max_bytes: int
    name: str = ""


def plan_for(*, session_id, kind: str, object_id: str, name: str = "") -> Plan:
    session = Session.objects.select_related("tenant", "policy_version__policy").get(pk=session_id)
    version = session.policy_version
    policy = persistence_of(version.document)
    now = timezone.now()
    commands = list(CommandRun.objects.filter(session_id=session_id).order_by("created_at")
                    .values_list("id", "argv", "exit_code", "reason"))
    manifest = {
        "v": mf.VERSION, "kind": kind, "id": object_id, "name": name,
        "tenant": {"id": session.tenant_id, "slug": session.tenant.slug},
        "conversation_id": session.conversation_id, "session_id": str(session.pk),
        "parent": str(session.resumed_from_id) if kind == "snapshot" and session.resumed_from_id else None,
        "commands": [{"id": str(c), "argv": argv, "exit_code": code, "reason": reason}
                     for c, argv, code, reason in commands[-mf.MAX_COMMANDS:]],
        "commands_total": len(commands),
        "policy_version": {"policy": version.policy.name, "number": version.number, "sha256": version.sha256},
        "driver": session.driver, "rootfs_digest": session.rootfs_digest,
        "created_at": now.isoformat(), "expires_at": (now + timedelta(days=policy.retention_days)).isoformat(),
    }
    return Plan(kind=kind, object_id=object_id, tenant_id=session.tenant_id, key=current_key(session.tenant),
                manifest=manifest, max_bytes=policy.max_mb * 2**20, name=name)


@dataclass(frozen=True)
class Taken:
    plan: Plan
    manifest: dict
    signature: str
    blob_name: str
    stored_bytes: int
    plain_bytes: int


def blob_name(kind: str, tenant_id: int, object_id: str) -> str:
    return f"t{tenant_id}/{kind}s/{object_id}.alk"


class _Stream(File):
    """What the store reads while the sandbox is still packing: sealed pieces from a queue, in
    order, until the end (None). It can be read once, front to back."""

    def __init__(self, pieces, header: bytes):
        super().__init__(None, name="blob")
        self._pieces, self._rest, self._done, self._header = pieces, b"", False, header

    def _next(self) -> bytes | None:
        if self._header:
            header, self._header = self._header, b""
            return header
        piece = self._pieces.get()
        if piece is _ABORT:
            raise OSError("the packing failed; nothing is stored")
        return piece

    def chunks(self, chunk_size=None):
        while (piece := self._next()) is not None:
            yield piece

    def read(self, size=-1) -> bytes:
        while not self._done and (size < 0 or len(self._rest) < size):
            piece = self._next()
            if piece is None:
                self._done = True
            else:
                self._rest += piece
        data, self._rest = (self._rest, b"") if size < 0 else (self._rest[:size], self._rest[size:])
        return data

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        pass


_ABORT = object()


class _BlobWriter:
    """Sealed segments go to storage as they are made, on a thread of their own: the store's
    writes overlap the sandbox's packing and the runner's hashing and sealing."""

    def __init__(self, name: str, header: bytes):
        self.name, self.saved, self.error = name, None, None
        self._header = header
        self._pieces: queue.Queue = queue.Queue(maxsize=32)
        self._thread = threading.Thread(target=self._save, name="airlock-blob-writer", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        try:
            self.saved = storage().save(self.name, _Stream(self._pieces, self._header))
        except BaseException as exc:
            self.error = exc

    def _hand(self, item) -> bool:
        """Queue `item` for the writer; False if the writer has stopped."""
        while self._thread.is_alive():
            try:
                self._pieces.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def put(self, piece) -> None:
        if self.error is not None or not self._hand(piece):
            raise self.error or OSError("the blob writer stopped")

    def close(self) -> str:
        self._hand(None)
        self._thread.join()
        if self.error is not None:
            raise self.error
        if self.saved != self.name:  # the store renamed it (a name taken): never two objects under one name
            discard_blob(self.saved)
            raise OSError(f"the storage would not keep {self.name} under its name")
        return self.saved

    def abort(self) -> None:
        self._hand(_ABORT)
        self._thread.join()
        if storage().exists(self.name):
            discard_blob(self.name)


def take(driver: Driver, sandbox: Sandbox, plan: Plan, roots: list[str]) -> Taken:
    """Pack `roots` of the workspace ([""] for all of it), seal and store it as it streams;
    nothing is recorded yet (`record` does). A failure stores nothing."""
    name = blob_name(plan.kind, plan.tenant_id, plan.object_id)
    careful = False
    while True:
        sealer = Sealer(plan.key, plan.object_id)
        writer, stored = _BlobWriter(name, sealer.header), len(sealer.header)

        def sink(data, sealer=sealer, writer=writer) -> None:
            nonlocal stored
            for piece in sealer.feed(data):
                stored += len(piece)
                writer.put(piece)

        try:
            packed = pack(driver, sandbox, roots, max_bytes=plan.max_bytes, sink=sink, careful=careful)
            last = sealer.finish()
            stored += len(last)
            writer.put(last)
            writer.close()
        except Unreadable:
            writer.abort()
            careful = True  # an entry its owner made unreadable: the careful packer opens it
            continue
        except BaseException:
            writer.abort()
            raise
        break
    manifest = {**plan.manifest, "files": packed.entries, "skipped": packed.skipped,
                "digest": mf.content_digest(packed.entries),
                "blob": {"bytes": stored, "key_version": plan.key.version, "format": "tar+aes-256-gcm-1mib"}}
    return Taken(plan=plan, manifest=manifest, signature=mf.sign(plan.key, manifest), blob_name=name,
                 stored_bytes=stored, plain_bytes=packed.file_bytes)


def record(*, taken: Taken, actor: str) -> Packed:
    """The row of what `take` stored, audited; if it cannot be written, the blob goes."""
    plan, manifest = taken.plan, taken.manifest
    model = KINDS[plan.kind]
    extra = {"name": plan.name} if plan.kind == "artifact" else {"parent_id": manifest["parent"]}
    try:
        with transaction.atomic():
            row = model.objects.create(
                id=plan.object_id, tenant_id=plan.tenant_id, conversation_id=manifest["conversation_id"],
                session_id=manifest["session_id"], manifest=manifest, signature=taken.signature,
                digest=manifest["digest"], blob_name=taken.blob_name, stored_bytes=taken.stored_bytes,
                plain_bytes=taken.plain_bytes, files=sum(e["type"] == "file" for e in manifest["files"]),
                created_at=datetime.fromisoformat(manifest["created_at"]),
                expires_at=datetime.fromisoformat(manifest["expires_at"]), **extra)
            audit_record(tenant=Tenant.objects.get(pk=plan.tenant_id), actor=actor, action=f"{plan.kind}.created",
                         target=row, data={"conversation_id": row.conversation_id, "session_id": manifest["session_id"],
                                           "digest": row.digest, "files": row.files, "bytes": row.plain_bytes})
    except Exception:
        discard_blob(taken.blob_name)
        raise
    return row


def discard_blob(name: str) -> None:
    try:
        storage().delete(name)
    except Exception:  # prune sweeps blobs without a row
        log.exception("the blob %s could not be deleted; prune_snapshots will sweep it", name)


# -- checking --------------------------------------------------------------------------------

def _key_of(row: Packed) -> TenantKey:
    try:
        return key_version(row.tenant_id, int((row.manifest.get("blob") or {}).get("key_version", 0)))
    except (KeyUnavailable, TypeError, ValueError) as exc:
        raise ProvenanceError("provenance_invalid", "key", f"its data key does not open: {exc}") from None


def check_manifest(row: Packed, *, now=None) -> TenantKey:
    """The checks the database alone allows: signed by this tenant's key, and saying what the row
    says (tenant, conversation, id), and not past its retention."""
    key = _key_of(row)
    manifest = row.manifest if isinstance(row.manifest, dict) else {}
    if not mf.signature_holds(key, manifest, row.signature):
        raise ProvenanceError("provenance_invalid", "signature", f"the manifest of {row.id} is not signed by this "
                              "tenant's key: it was altered, forged, or moved from another tenant")
    kind = "snapshot" if isinstance(row, Snapshot) else "artifact"
    if (manifest.get("tenant") or {}).get("id") != row.tenant_id:
        raise ProvenanceError("provenance_mismatch", "tenant", f"{row.id} was made by another tenant")
    if manifest.get("conversation_id") != row.conversation_id or manifest.get("id") != str(row.id) \
            or manifest.get("kind") != kind:
        raise ProvenanceError("provenance_mismatch", "conversation", f"the signed manifest of {row.id} names another "
                              "conversation, object or kind than its record")
    expires = datetime.fromisoformat(manifest["expires_at"])
    if expires <= (now or timezone.now()):
        raise ProvenanceError("provenance_invalid", "retention", f"{row.id} expired at {expires.isoformat()} (the "
                              "policy's persistence.retention_days); it is deleted at the next prune")
    return key


def check_stored(row: Packed, key: TenantKey, *, into: BinaryIO | None = None) -> None:
    """Every check of the stored bytes: they open under this tenant's key, as this object, and
    the tar's listing is the manifest's, entry by entry (path, type, mode, size, sha256). Each
    segment is written `into` a file once it has authenticated, before the listing is compared:
    what reads it keeps nothing until this returns (`unpack_checked`, `check_bytes`)."""
    reader = TarReader(max_bytes=max(row.plain_bytes, 0))
    try:
        with storage().open(row.blob_name, "rb") as handle:
            for part in unseal(key, str(row.id), handle):
                reader.feed(part)
                if into is not None:
                    into.write(part)
        entries = reader.close()
    except (OSError, ValueError) as exc:
        raise ProvenanceError("provenance_invalid", "blob", f"the stored blob of {row.id} cannot be read: {exc}") \
            from None
    except Unsealable as exc:
        raise ProvenanceError("provenance_invalid", "blob", str(exc)) from None
    except BadTar as exc:
        raise ProvenanceError("provenance_invalid", "digest", f"the stored tar is not well formed: {exc}") from None
    difference = mf.entries_match(row.manifest, entries)
    if difference is not None:
        raise ProvenanceError("provenance_invalid", "digest", difference)


def check_bytes(row: Packed, key: TenantKey) -> bytes:
    """The stored tar, once every check of `check_stored` holds."""
    archive = io.BytesIO()
    check_stored(row, key, into=archive)
    return archive.getvalue()


class _Pipe:
    """The write end of the pipe the sandbox's tar reads, each piece written whole. Should its
    reader go (EPIPE), the rest is dropped: the check runs to its end all the same, so a blob that
    fails a check is reported as such, whatever the tar did."""

    def __init__(self, descriptor: int):
        self.descriptor, self.gone = descriptor, False
        with contextlib.suppress(OSError):  # fewer, larger hand-offs; the default 64 KiB works too
            fcntl.fcntl(descriptor, fcntl.F_SETPIPE_SZ, 1 << 20)

    def write(self, data) -> None:
        view = memoryview(data)
        try:
            while view and not self.gone:
                view = view[os.write(self.descriptor, view):]
        except OSError:  # a failed write is the tar's, never the blob's
            self.gone = True


def _unread(archive: BinaryIO) -> int:
    """Bytes of the archive its reader left, read to the end (the check writes all of it)."""
    left = 0
    while piece := archive.read(1 << 20):
        left += len(piece)
    return left


def _pages(row: Packed) -> int:
    """What its files take on a tmpfs workspace: each a whole number of 4 KiB pages."""
    return sum(-(-int(entry.get("size", 0)) // 4096) * 4096 for entry in row.manifest.get("files", [])
               if entry.get("type") == "file")


def unpack_checked(driver: Driver, sandbox: Sandbox, row: Packed, key: TenantKey) -> None:
    """Check the stored bytes and unpack them at once, then settle: the sandbox's tar reads each
    segment as it authenticates (sealed.py), into a stage in the workspace, while another thread
    checks the rest; what the stage holds moves into place only once every check of
    `check_stored` holds and the tar has exited 0 having read the whole archive, and goes
    otherwise. (Where the driver hands the command the pipe itself, bubblewrap's, what the tar
    left unread is counted here; Docker's reads the whole input before the command starts, and
    the sandbox's GNU tar reads its input to the end.) A failed check is raised before anything
    the tar or the driver raised (a check cut short makes the tar fail). A tree that fits the
    workspace but not with the stage is checked whole, then unpacked in place. Should the last
    step (settle, or that unpack) fail part way, the session fails and its sandbox goes."""
    stage = f".airlock-restore-{secrets.token_hex(8)}"
    read_end, write_end = os.pipe()
    checked: list[BaseException | None] = []

    def check() -> None:
        try:
            check_stored(row, key, into=_Pipe(write_end))
            checked.append(None)
        except BaseException as exc:  # handed to the caller below
            checked.append(exc)
        finally:
            os.close(write_end)  # the tar's end of input, whole or cut short

    with open(read_end, "rb", buffering=0) as archive:
        try:
            threading.Thread(target=check, name="airlock-restore-check", daemon=True).start()
        except BaseException:
            os.close(write_end)
            raise
        unpacked: Exception | None = None
        try:
            unpack(driver, sandbox, archive, stage=stage)
        except Exception as exc:  # WorkspaceError, SandboxError, OSError: raised below, after the check's own
            unpacked = exc
        finally:
            unread = _unread(archive)  # to its end: the check has then closed its end, and appended
    failure = checked[0] or unpacked
    if failure is None and unread:  # the tar ended before the archive did: never kept
        failure = WorkspaceError("workspace_error", f"restoring the workspace failed (the sandbox's tar left the "
                                 f"archive's last {unread} bytes unread)")
    if failure is not None:
        try:
            settle(driver, sandbox, stage, keep=False)
        except (WorkspaceError, SandboxError, OSError):
            raise failure from None  # its sandbox is destroyed anyway
        if getattr(failure, "code", None) != "quota_exceeded" or checked[0] is not None \
                or _pages(row) > sandbox.spec.limits.disk_mb << 20:
            raise failure
        # Every check held and its files fit, yet it did not: the stage takes one inode more than
        # a workspace full of files had. Checked whole again (the blob is read anew), then unpacked in place.
        unpack(driver, sandbox, check_bytes(row, key), stage=None)
        return
    settle(driver, sandbox, stage, keep=True)


def claim(*, tenant: Tenant, conversation_id: str, resume: str, policy_name: str, policy: Persistence) -> Snapshot:
    """The snapshot a new session asks to resume, checked from the database; or ProvenanceError.
    Another tenant's id and an id that does not exist are refused alike."""
    snapshots = Snapshot.objects.filter(tenant=tenant)
    if resume == "latest":
        row = snapshots.filter(conversation_id=conversation_id, expires_at__gt=timezone.now()).first()
        if row is None:
            raise ProvenanceError("provenance_mismatch", "conversation", f"conversation {conversation_id!r} has no "
                                  "snapshot to resume", hint="start the session without `resume`; one with "
                                  "`persist: true` leaves a snapshot when it ends")
    else:
        row = snapshots.filter(pk=resume).first()
        if row is None:
            raise ProvenanceError("provenance_mismatch", "tenant", f"no snapshot {resume} belongs to tenant "
                                  f"{tenant.slug}", hint="list this conversation's snapshots with GET "
                                  "/api/v1/snapshots?conversation_id=…")
        if row.conversation_id != conversation_id:
            raise ProvenanceError("provenance_mismatch", "conversation", f"snapshot {resume} belongs to another "
                                  "conversation; a workspace is never shared between conversations",
                                  hint="resume a snapshot of this conversation")
    check_manifest(row)
    made_under = row.manifest["policy_version"]["policy"]
    if policy.resume_same_policy and made_under != policy_name:
        raise ProvenanceError("provenance_mismatch", "same_policy", f"snapshot {row.id} was made under policy "
                              f"{made_under!r}, and policy {policy_name!r} resumes only its own "
                              "(persistence.resume_same_policy)")
    return row


def restore(driver: Driver, sandbox: Sandbox, row: Snapshot, *, require_rootfs: bool) -> None:
    """Check every byte, then unpack into the new session's workspace."""
    key = check_manifest(row)
    if require_rootfs and row.manifest.get("rootfs_digest") != sandbox.rootfs_digest:
        raise ProvenanceError("provenance_mismatch", "same_rootfs", f"snapshot {row.id} was made on root filesystem "
                              f"{row.manifest.get('rootfs_digest') or 'unknown'}, this session runs "
                              f"{sandbox.rootfs_digest} (persistence.resume_same_rootfs)")
    unpack_checked(driver, sandbox, row, key)


def verify(row: Packed) -> dict:
    """Every check, for the Verify action: {valid, check, detail, files}. Holds one of the
    tenant's blob reads (admission.Refused when it has none left)."""
    try:
        with admission.blob_read(row.tenant):
            check_stored(row, check_manifest(row))
    except ProvenanceError as exc:
        return {"valid": False, "reason_code": exc.reason_code, "check": exc.rule_id, "detail": exc.message}
    return {"valid": True, "reason_code": None, "check": None,
            "detail": f"signature, tenant, conversation, retention and the digests of its {row.files} files hold"}


def download(row: Packed) -> "CheckedArchive":
    """The tar, once every check holds (ProvenanceError otherwise), in an unnamed temporary file
    at its start, so a download holds no archive in memory. It holds one of the tenant's blob
    reads (admission.Refused when none is left) from its check until it is closed, once sent:
    a client that stalls keeps at most that many such files open for its tenant."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(admission.blob_read(row.tenant))
        archive = held.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed with `held`
        check_stored(row, check_manifest(row), into=archive)
    except BaseException:
        held.close()
        raise
    archive.seek(0)
    return CheckedArchive(archive, held)


class CheckedArchive:
    """A checked tar to read once, front to back; closing it lets its blob read go."""

    def __init__(self, file: BinaryIO, held: contextlib.ExitStack):
        self.file, self.held = file, held

    def read(self, size: int = -1) -> bytes:
        return self.file.read(size)

    def size(self) -> int:
        return os.fstat(self.file.fileno()).st_size

    def close(self) -> None:
        self.held.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- deleting --------------------------------------------------------------------------------

def delete(row: Packed, *, actor, why: str) -> None:
    """The row and its audit event in one transaction, then the blob."""
    kind = "snapshot" if isinstance(row, Snapshot) else "artifact"
    with transaction.atomic():
        type(row).objects.filter(pk=row.pk).delete()
        audit_record(tenant=row.tenant, actor=actor, action=f"{kind}.deleted", target=row,
                     data={"conversation_id": row.conversation_id, "digest": row.digest, "why": why})
    transaction.on_commit(lambda: discard_blob(row.blob_name))


@dataclass
class Pruned:
    snapshots: int = 0
    artifacts: int = 0
    blobs: int = 0


def prune(*, now=None, sweep_blobs: bool = True) -> Pruned:
    """Delete what is past its retention (audited, actor `retention`), and blobs with no row
    older than an hour (left by a crash between storing and recording)."""
    now = now or timezone.now()
    result = Pruned()
    for model, field in ((Snapshot, "snapshots"), (Artifact, "artifacts")):
        for row in model.objects.filter(expires_at__lte=now).select_related("tenant"):
            delete(row, actor="retention", why="past its retention")
            setattr(result, field, getattr(result, field) + 1)
    if sweep_blobs:
        result.blobs = _sweep_blobs(now - timedelta(hours=1))
    return result


def _sweep_blobs(before) -> int:
    store, swept = storage(), 0
    known = set(Snapshot.objects.values_list("blob_name", flat=True)) | set(
        Artifact.objects.values_list("blob_name", flat=True))
    try:
        tenants, _ = store.listdir("")
    except (OSError, NotImplementedError):
        return 0
    for tenant in tenants:
        for kind in ("snapshots", "artifacts"):
            folder = f"{tenant}/{kind}"
            try:
                _, names = store.listdir(folder)
            except (OSError, NotImplementedError):
                continue
            for file_name in names:
                name = f"{folder}/{file_name}"
                if name in known:
                    continue
                try:
                    if store.get_modified_time(name) < before:
                        store.delete(name)
                        swept += 1
                except (OSError, NotImplementedError):
                    continue
    return swept


# -- usage -----------------------------------------------------------------------------------

def usage(tenant: Tenant | None = None) -> dict:
    """{tenant_id: {snapshots, artifacts, bytes}} of what is stored now."""
    figures: dict[int, dict] = {}
    for model, kind in ((Snapshot, "snapshots"), (Artifact, "artifacts")):
        rows = model.objects.all() if tenant is None else model.objects.filter(tenant=tenant)
        for item in rows.values("tenant_id").annotate(n=Count("id"), stored=Sum("stored_bytes")):
            entry = figures.setdefault(item["tenant_id"], {"snapshots": 0, "artifacts": 0, "bytes": 0})
            entry[kind] = item["n"]
            entry["bytes"] += item["stored"] or 0
    return figures
