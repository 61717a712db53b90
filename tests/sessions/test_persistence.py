"""Snapshots and artifacts on real sandboxes (sessions/persistence/): what a session leaves comes
back in the next session of its conversation, whole; nothing altered, forged, moved, expired or
of another conversation or tenant is ever restored, and each refusal says which check failed."""

import io
import json
import tarfile
from datetime import timedelta

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from controlplane.keys import key_version
from controlplane.models import ApiKeyScope, AuditEvent, DataKey
from policies_app.models import DecisionRecord
from sessions import admission, lifecycle
from sessions.models import Artifact, Session, Snapshot
from sessions.persistence import manifest as mf
from sessions.persistence import services as persistence
from tests.sessions.conftest import POLICY, Agent, publish

PERSISTENT = POLICY + "persistence: {enabled: true, retention_days: 3, max_mb: 16}\n"
MARKER = b"airlock-plaintext-marker-7f3c"
# Run by the sandbox's python3: a tree with modes, an empty directory, a nested file, a FIFO and links.
MAKE_TREE = b"""
import os
os.makedirs("src/pkg", exist_ok=True)
os.makedirs("empty/inner", exist_ok=True)
open("src/pkg/mod.py", "wb").write(b"VALUE = 42\\n" + b"MARKER" * 1000)
open("run.sh", "wb").write(b"#!/bin/sh\\necho hi\\n")
os.chmod("run.sh", 0o750)
open("secret.txt", "wb").write(b"owner only")
os.chmod("secret.txt", 0o600)
open("locked", "wb").write(b"nobody may read me")
os.chmod("locked", 0o000)
os.chmod("empty/inner", 0o700)
os.mkfifo("pipe")
os.symlink("/etc/passwd", "link")
os.symlink("src", "dirlink")
""".replace(b"MARKER", MARKER)
SHOW_TREE = b"""
import json, os, stat
out = {}
for root, dirs, files in os.walk("."):
    for name in dirs + files:
        path = os.path.join(root, name)[2:]
        st = os.lstat(path)
        out[path] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size]
print(json.dumps(out, sort_keys=True))
"""


@pytest.fixture
def keeper(acme, make_key, api, runner):
    publish(acme, PERSISTENT)
    return Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)


def _script(agent, session, name: str, source: bytes) -> dict:
    assert agent.put(session, name, source).status_code == 204
    response = agent.run(session, "python3", name)
    assert response.status_code == 200, response.content
    return response.json()


def _end(agent, session) -> dict:
    response = agent.as_session(session).delete(f"/api/v1/sessions/{session['id']}")
    assert response.status_code == 200, response.content
    return response.json()


def _resume(agent, resume: str, conversation: str = "conv-1"):
    return agent.client.post("/api/v1/sessions", {"conversation_id": conversation, "resume": resume},
                             content_type="application/json")


def _tree(agent, session) -> dict:
    return json.loads(_script(agent, session, "show.py", SHOW_TREE)["output"])


def _snapshot_of(keeper) -> tuple[dict, Snapshot]:
    first = keeper.open(persist=True)
    _script(keeper, first, "make.py", MAKE_TREE)
    ended = _end(keeper, first)
    assert ended["snapshot"], ended
    return first, Snapshot.objects.get(pk=ended["snapshot"])


def test_a_persistent_session_comes_back_whole_in_the_next_session(keeper):
    first, snapshot = _snapshot_of(keeper)
    assert snapshot.manifest["conversation_id"] == "conv-1"
    assert snapshot.manifest["session_id"] == first["id"]
    assert snapshot.manifest["policy_version"]["policy"] == "default"
    assert snapshot.manifest["rootfs_digest"].startswith("sha256:")
    assert [c["argv"][:2] for c in snapshot.manifest["commands"]] == [["python3", "make.py"]]
    skipped = {item["path"]: item["why"] for item in snapshot.manifest["skipped"]}
    assert set(skipped) == {"pipe", "link", "dirlink"}  # never followed, never read

    response = _resume(keeper, "latest")
    assert response.status_code == 201, response.content
    second = response.json()
    assert second["resumed_from"] == str(snapshot.pk)
    assert keeper.get(second, "src/pkg/mod.py").content.startswith(b"VALUE = 42\n")
    tree = _tree(keeper, second)
    listed = {entry["path"]: entry for entry in snapshot.manifest["files"]}
    assert {"src/pkg/mod.py", "run.sh", "secret.txt", "locked", "empty/inner", "make.py"} <= set(listed)
    for path, entry in listed.items():
        assert tree[path][1] == entry["mode"], path
        if entry["type"] == "file":
            assert tree[path][2] == entry["size"], path
    assert tree["run.sh"][1] == 0o750 and tree["secret.txt"][1] == 0o600 and tree["locked"][1] == 0
    assert tree["empty/inner"][1] == 0o700
    assert "pipe" not in tree and "link" not in tree


def test_the_stored_blob_holds_no_plaintext(keeper):
    _, snapshot = _snapshot_of(keeper)
    with storages["persistence"].open(snapshot.blob_name, "rb") as handle:
        stored = handle.read()
    assert MARKER not in stored and b"VALUE = 42" not in stored and b"mod.py" not in stored
    with persistence.download(snapshot) as archive:  # the same blob, opened with the tenant's key
        assert MARKER in archive.read()
    assert DataKey.objects.filter(tenant=snapshot.tenant).count() == 1
    assert MARKER not in bytes(DataKey.objects.get(tenant=snapshot.tenant).wrapped)


def _denied(response, reason_code: str, rule_id: str) -> dict:
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["error"] == "resume_denied"
    decision = body["decision"]
    assert (decision["reason_code"], decision["rule_id"]) == (reason_code, rule_id), decision
    assert DecisionRecord.objects.filter(pk=decision["id"], kind="resume", allowed=False).exists()
    return decision


def test_another_conversation_and_another_tenant_are_refused(keeper, globex, make_key, api):
    _, snapshot = _snapshot_of(keeper)
    _denied(_resume(keeper, str(snapshot.pk), conversation="conv-2"), "provenance_mismatch", "persistence.conversation")
    _denied(_resume(keeper, "latest", conversation="conv-2"), "provenance_mismatch", "persistence.conversation")
    publish(globex, PERSISTENT)
    other = Agent(api, make_key(globex, scopes=[ApiKeyScope.SESSIONS]).key)
    decision = _denied(_resume(other, str(snapshot.pk)), "provenance_mismatch", "persistence.tenant")
    assert "belongs to tenant globex" in decision["message"]  # never says whose it is
    assert other.client.get(f"/api/v1/snapshots/{snapshot.pk}").status_code == 404
    assert not Session.objects.filter(tenant=globex).exists()


def test_a_flipped_byte_in_the_stored_blob_is_refused_before_anything_is_restored(keeper):
    _, snapshot = _snapshot_of(keeper)
    store = storages["persistence"]
    with store.open(snapshot.blob_name, "rb") as handle:
        blob = bytearray(handle.read())
    blob[len(blob) // 2] ^= 0x01
    with open(store.path(snapshot.blob_name), "wb") as handle:
        handle.write(blob)
    decision = _denied(_resume(keeper, "latest"), "provenance_invalid", "persistence.blob")
    assert "does not authenticate" in decision["message"]
    failed = Session.objects.get(resumed_from=snapshot)
    assert failed.state == "failed"
    assert persistence.verify(snapshot)["valid"] is False


def test_a_forged_manifest_is_refused(keeper):
    _, snapshot = _snapshot_of(keeper)
    forged = dict(snapshot.manifest)
    forged["files"] = [dict(e, mode=0o777) if e["path"] == "run.sh" else e for e in forged["files"]]
    Snapshot.objects.filter(pk=snapshot.pk).update(manifest=forged)
    _denied(_resume(keeper, "latest"), "provenance_invalid", "persistence.signature")


def test_a_manifest_signed_but_of_another_tree_is_refused_on_its_digests(keeper):
    """Whoever holds the key could sign anything: the bytes must still be the manifest's."""
    _, snapshot = _snapshot_of(keeper)
    key = key_version(snapshot.tenant_id, 1)
    forged = dict(snapshot.manifest)
    forged["files"] = [dict(e, sha256="0" * 64) if e["path"] == "run.sh" else e for e in forged["files"]]
    Snapshot.objects.filter(pk=snapshot.pk).update(manifest=forged, signature=mf.sign(key, forged))
    _denied(_resume(keeper, "latest"), "provenance_invalid", "persistence.digest")


def test_a_snapshot_swapped_between_tenants_is_refused(keeper, globex, make_key, api):
    _, mine = _snapshot_of(keeper)
    publish(globex, PERSISTENT)
    other = Agent(api, make_key(globex, scopes=[ApiKeyScope.SESSIONS]).key)
    theirs_session = other.open(persist=True)
    _script(other, theirs_session, "make.py", MAKE_TREE)
    theirs = Snapshot.objects.get(pk=_end(other, theirs_session)["snapshot"])
    store = storages["persistence"]
    # Their blob under my snapshot's name: it does not open with my key for my snapshot.
    with store.open(theirs.blob_name, "rb") as src, open(store.path(mine.blob_name), "wb") as dst:
        dst.write(src.read())
    _denied(_resume(keeper, "latest"), "provenance_invalid", "persistence.blob")
    # Their row moved into my tenant and conversation: its signature is not under my key.
    Snapshot.objects.filter(pk=theirs.pk).update(tenant=mine.tenant, created_at=timezone.now())
    _denied(_resume(keeper, str(theirs.pk)), "provenance_invalid", "persistence.signature")


def _expire(snapshot: Snapshot) -> None:
    """As time passing would: the signed manifest's retention is over."""
    key = key_version(snapshot.tenant_id, 1)
    past = dict(snapshot.manifest, expires_at=(timezone.now() - timedelta(minutes=1)).isoformat())
    Snapshot.objects.filter(pk=snapshot.pk).update(manifest=past, signature=mf.sign(key, past),
                                                   expires_at=timezone.now() - timedelta(minutes=1))


def test_an_expired_snapshot_is_refused_and_pruned(keeper):
    _, snapshot = _snapshot_of(keeper)
    Snapshot.objects.filter(pk=snapshot.pk).update(expires_at=timezone.now() + timedelta(days=30))
    _expire(snapshot)  # the row's own date says nothing: the signed one decides
    Snapshot.objects.filter(pk=snapshot.pk).update(expires_at=timezone.now() + timedelta(days=30))
    _denied(_resume(keeper, str(snapshot.pk)), "provenance_invalid", "persistence.retention")
    Snapshot.objects.filter(pk=snapshot.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    store = storages["persistence"]
    assert store.exists(snapshot.blob_name)
    pruned = persistence.prune()
    assert pruned.snapshots == 1
    assert not Snapshot.objects.filter(pk=snapshot.pk).exists()
    assert not store.exists(snapshot.blob_name)
    assert AuditEvent.objects.filter(action="snapshot.deleted", target_id=str(snapshot.pk)).exists()


def test_a_workspace_at_its_quota_snapshots_and_restores(keeper):
    first = keeper.open(persist=True)
    fill = b"""
import os
n = 0
try:
    while True:
        with open(f"block{n}", "wb") as f:
            f.write(os.urandom(256 * 1024))
        n += 1
except OSError as exc:
    print("full", exc.errno, n)
"""
    result = _script(keeper, first, "fill.py", fill)
    assert "full 28" in result["output"]  # ENOSPC: the 8 MB workspace is full
    snapshot = Snapshot.objects.get(pk=_end(keeper, first)["snapshot"])
    assert snapshot.plain_bytes > 7 * 2**20
    response = _resume(keeper, "latest")
    assert response.status_code == 201, response.content
    second = response.json()
    blocks = [e for e in snapshot.manifest["files"] if e["path"].startswith("block")]
    assert len(blocks) >= 28
    for entry in blocks[:1] + blocks[-1:]:  # the restored workspace is full again, to its last partial block
        assert len(keeper.get(second, entry["path"]).content) == entry["size"]
    assert keeper.put(second, "more", b"x" * 65536).status_code == 507


def test_persistence_needs_a_policy_that_keeps_things(agent):
    response = agent.client.post("/api/v1/sessions", {"conversation_id": "c", "persist": True},
                                 content_type="application/json")
    assert response.status_code == 403
    decision = response.json()["decision"]
    assert (decision["reason_code"], decision["rule_id"]) == ("default_deny", "persistence.enabled")
    assert "persistence: {enabled: true" in decision["hint"]
    bad = agent.client.post("/api/v1/sessions", {"conversation_id": "c", "resume": "yesterday"},
                            content_type="application/json")
    assert bad.status_code == 400 and "resume" in bad.json()["fields"]


def test_artifacts_pack_named_paths_with_their_provenance(keeper, globex, make_key, api, settings):
    session = keeper.open()
    _script(keeper, session, "make.py", MAKE_TREE)
    client = keeper.as_session(session)
    url = f"/api/v1/sessions/{session['id']}/artifacts"
    response = client.post(url, {"name": "pkg", "paths": ["src", "run.sh"]}, content_type="application/json")
    assert response.status_code == 201, response.content
    artifact = response.json()
    assert artifact["name"] == "pkg" and artifact["files"] == 2
    assert [e["path"] for e in artifact["manifest"]["files"]] == ["src", "src/pkg", "src/pkg/mod.py", "run.sh"]
    assert artifact["manifest"]["policy_version"]["policy"] == "default"
    for path, code in (("dirlink", "symlink_refused"), ("dirlink/pkg/mod.py", "symlink_refused"),
                       ("missing", "not_found")):
        refused = client.post(url, {"name": "x", "paths": [path]}, content_type="application/json")
        assert refused.json()["error"] == code, (path, refused.content)
    outside = client.post(url, {"name": "x", "paths": ["../etc"]}, content_type="application/json")
    assert outside.status_code == 403 and outside.json()["decision"]["reason_code"] == "path_outside_workspace"

    download = keeper.client.get(f"/api/v1/artifacts/{artifact['id']}/download")
    assert download.status_code == 200
    assert download.is_async  # sent from its checked file a piece at a time, not read whole into memory
    # Until it is sent, its checked file holds the tenant's one blob read: a stalled client keeps one.
    assert keeper.client.get(f"/api/v1/artifacts/{artifact['id']}/download").status_code == 429
    tar = b"".join(download)
    assert int(download["Content-Length"]) == len(tar)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        assert archive.extractfile("run.sh").read() == b"#!/bin/sh\necho hi\n"
        assert archive.getmember("run.sh").mode == 0o750
    assert keeper.client.post(f"/api/v1/artifacts/{artifact['id']}/verify").json()["valid"] is True
    # Reading and checking a blob waits like a command with `wait`: one of the tenant's waiting calls.
    settings.AIRLOCK_API_WAITING_PER_TENANT = 1
    with admission.waiting_call(Artifact.objects.get(pk=artifact["id"]).tenant):
        for busy in (keeper.client.get(f"/api/v1/artifacts/{artifact['id']}/download"),
                     keeper.client.post(f"/api/v1/artifacts/{artifact['id']}/verify")):
            assert busy.status_code == 429 and busy.json()["error"] == "too_many_waiting_calls"
    settings.AIRLOCK_API_WAITING_PER_TENANT = 16
    with admission.blob_read(Artifact.objects.get(pk=artifact["id"]).tenant):  # one check at a time per tenant
        for busy in (keeper.client.get(f"/api/v1/artifacts/{artifact['id']}/download"),
                     keeper.client.post(f"/api/v1/artifacts/{artifact['id']}/verify")):
            assert busy.status_code == 429 and busy.json()["error"] == "too_many_blob_reads"
            assert "AIRLOCK_BLOB_READS_PER_TENANT" in busy.json()["detail"]
    listed = keeper.client.get("/api/v1/artifacts?conversation_id=conv-1").json()
    assert [item["id"] for item in listed] == [artifact["id"]]

    other = Agent(api, make_key(globex, scopes=[ApiKeyScope.SESSIONS]).key)
    assert other.client.get(f"/api/v1/artifacts/{artifact['id']}").status_code == 404
    assert other.client.delete(f"/api/v1/artifacts/{artifact['id']}").status_code == 404
    assert client.delete(f"/api/v1/artifacts/{artifact['id']}").status_code == 403  # a session token may not
    assert keeper.client.delete(f"/api/v1/artifacts/{artifact['id']}").status_code == 204
    assert not Artifact.objects.filter(pk=artifact["id"]).exists()
    assert AuditEvent.objects.filter(action="artifact.deleted", target_id=artifact["id"]).exists()


def test_the_whole_workspace_path_leaves_links_and_fifos_out(keeper):
    """Without an unreadable entry the sandbox's GNU tar packs it: links and FIFOs are still left out."""
    first = keeper.open(persist=True)
    _script(keeper, first, "make.py", MAKE_TREE.replace(b'os.chmod("locked", 0o000)', b""))
    snapshot = Snapshot.objects.get(pk=_end(keeper, first)["snapshot"])
    assert {item["path"] for item in snapshot.manifest["skipped"]} == {"pipe", "link", "dirlink"}
    assert "link" not in {e["path"] for e in snapshot.manifest["files"]}
    second = _resume(keeper, "latest").json()
    tree = _tree(keeper, second)
    assert "pipe" not in tree and "dirlink" not in tree and tree["run.sh"][1] == 0o750


@pytest.mark.parametrize(("checks", "told"), [("hold", True), ("fail", True), ("hold", False)])
def test_a_session_ended_while_its_restore_runs_leaves_no_snapshot(keeper, monkeypatch, checks, told):
    """Its owner ends it after the tar has unpacked, before the stage is settled: what the stage
    holds was never the session's workspace (and, when a check failed, never checked), so no
    snapshot is taken of it; the conversation's latest stays what it was. Its runner may be told
    (a release) or find out only when the session will not become ready: either way the session
    says why it has no snapshot."""
    _, snapshot = _snapshot_of(keeper)
    if checks == "fail":
        store = storages["persistence"]
        with store.open(snapshot.blob_name, "rb") as handle:
            blob = bytearray(handle.read())
        blob[-100] ^= 1
        with open(store.path(snapshot.blob_name), "wb") as handle:
            handle.write(blob)
    settle = persistence.settle

    def ended_first(driver, sandbox, stage, *, keep):
        creating = Session.objects.get(state="creating", conversation_id="conv-1")
        if told:
            lifecycle.session_stop(session=creating, state="ended", actor=None, reason="ended by its owner")
        else:
            lifecycle.session_finish(session_id=creating.pk, state="ended", reason="ended by its owner")
        return settle(driver, sandbox, stage, keep=keep)

    monkeypatch.setattr(persistence, "settle", ended_first)
    response = keeper.client.post("/api/v1/sessions", {"conversation_id": "conv-1", "resume": "latest",
                                                       "persist": True}, content_type="application/json")
    assert response.status_code != 201, response.content
    assert list(Snapshot.objects.filter(conversation_id="conv-1")) == [snapshot]
    ended = Session.objects.get(resumed_from=snapshot)
    assert "ended before it was ready" in ended.snapshot_error


def test_a_session_starts_from_a_snapshot_or_a_checkout_never_both(keeper, acme, settings):
    """A restore moves its stage into an empty workspace: the API refuses both, and so does the
    session's opening for any caller that does not pass through the API."""
    settings.AIRLOCK_WORKSPACE_REPOS = [("demo", "/nonexistent")]
    both = keeper.client.post("/api/v1/sessions", {"conversation_id": "conv-1", "resume": "latest",
                                                   "workspace": {"repo": "demo"}}, content_type="application/json")
    assert both.status_code == 400 and "resume" in both.json()["fields"]
    with pytest.raises(lifecycle.LifecycleError) as refused:
        lifecycle.session_open(tenant=acme, conversation_id="conv-1", policy_name="default", repository="demo",
                               actor_label="test", resume="latest")
    assert refused.value.status == 400 and "not both" in str(refused.value)
    assert not Session.objects.filter(conversation_id="conv-1").exists()
