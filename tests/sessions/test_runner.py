"""The runner's duties beside running commands: TTL and idle expiry, dead runners, orphan
reaping, and workspaces checked out from allowlisted repositories."""

import subprocess
import uuid
from datetime import timedelta

from django.utils import timezone

from controlplane.models import ApiKeyScope
from sessions.models import Runner, Session
from sessions.runner import housekeeping
from sessions.runtimes import get_driver
from sessions.runtimes.base import SandboxSpec
from tests.sessions.conftest import Agent, run_on, running_runner


def sandbox_present(session_id: str) -> bool:
    driver = get_driver("bubblewrap")
    return session_id in driver.list_sandboxes() or (driver.sandbox_dir / session_id).exists()


def test_a_session_past_its_ttl_expires_and_its_token_is_revoked(agent, runner):
    session = agent.open()
    Session.objects.filter(pk=session["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    run_on(runner, housekeeping.housekeep_once(runner))
    expired = Session.objects.get(pk=session["id"])
    assert expired.state == "expired" and "time to live" in expired.state_reason
    assert not sandbox_present(session["id"])
    assert agent.as_session(session).get(f"/api/v1/sessions/{session['id']}").status_code == 401


def test_an_idle_session_expires_but_a_busy_one_does_not(agent, runner, settings):
    settings.AIRLOCK_SESSION_IDLE_TIMEOUT_S = 10
    idle, busy = agent.open(), agent.open()
    assert agent.run(busy, "sleep", "5", wait=False).status_code == 202
    long_ago = timezone.now() - timedelta(seconds=60)
    Session.objects.filter(pk__in=[idle["id"], busy["id"]]).update(last_activity_at=long_ago)
    run_on(runner, housekeeping.housekeep_once(runner))
    assert Session.objects.get(pk=idle["id"]).state == "expired"
    assert Session.objects.get(pk=busy["id"]).state == "ready"


def _ghost_session(acme_policy) -> Session:
    """A session whose runner died: its row still says ready, its sandbox is still on the host."""
    ghost = Runner.objects.create(id=f"ghost-{uuid.uuid4().hex[:6]}", hostname="elsewhere", pid=1,
                                  heartbeat_at=timezone.now() - timedelta(hours=1))
    session = Session.objects.create(
        tenant=acme_policy.policy.tenant, conversation_id="c", policy_version=acme_policy, driver="bubblewrap",
        runner=ghost, state="ready", token_hash=uuid.uuid4().hex, created_by="test",
        expires_at=timezone.now() + timedelta(hours=1))
    get_driver("bubblewrap").create(SandboxSpec(tenant="acme", session_id=str(session.pk)))
    return session


def test_a_dead_runners_sessions_fail_and_their_sandboxes_are_reaped(acme_policy, runner):
    session = _ghost_session(acme_policy)
    assert sandbox_present(str(session.pk))
    run_on(runner, housekeeping.housekeep_once(runner))
    session.refresh_from_db()
    assert session.state == "failed" and "stopped answering" in session.state_reason
    assert not sandbox_present(str(session.pk))
    assert Runner.objects.get(pk=session.runner_id).stopped_at is not None


def test_a_starting_runner_reaps_the_sandboxes_of_ended_sessions(acme_policy, transactional_db, sandboxes):
    session = _ghost_session(acme_policy)
    Session.objects.filter(pk=session.pk).update(state="ended")
    stranger = SandboxSpec(tenant="other", session_id=str(uuid.uuid4()))  # not a session of this database
    get_driver("bubblewrap").create(stranger)
    try:
        with running_runner():
            assert not sandbox_present(str(session.pk))
            assert sandbox_present(stranger.session_id)  # left alone: it is somebody else's
            assert sum(Runner.objects.values_list("reaped", flat=True)) == 1  # and counted
    finally:
        get_driver("bubblewrap").destroy_by_id(stranger.session_id)


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
                   check=True, capture_output=True)


def test_a_workspace_starts_from_a_filtered_checkout(acme, acme_policy, make_key, api, runner, tmp_path, settings):
    repo = tmp_path / "app"
    (repo / "tests").mkdir(parents=True)
    (repo / "deploy").mkdir()
    (repo / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests" / "test_app.py").write_text("from app import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    (repo / "conftest.py").write_text("")  # puts the repository root on sys.path for the tests
    (repo / ".env").write_text("DATABASE_PASSWORD=hunter2\n")
    (repo / "deploy" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (repo / "credentials.json").write_text("{}")
    _git(repo, "init", "-q")
    _git(repo, "remote", "add", "origin", "https://user:token123@git.example.com/app.git")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    (repo / "untracked.txt").write_text("not committed")
    settings.AIRLOCK_WORKSPACE_REPOS = [("acme:app", str(repo)), ("globex:theirs", str(repo))]
    agent = Agent(api, make_key(acme, scopes=[ApiKeyScope.SESSIONS]).key)
    session = agent.open(workspace={"repo": "app"})
    result = agent.run(session, "pytest", "tests/").json()
    assert result["exit_code"] == 0 and "1 passed" in result["output"]
    for secret in (".env", "deploy/id_rsa", "credentials.json", ".git/config", "untracked.txt"):
        assert agent.get(session, secret).status_code == 404, secret
    assert agent.get(session, "app.py").status_code == 200
    for name in ("elsewhere", "theirs"):  # unknown, and another tenant's
        refused = agent.client.post("/api/v1/sessions", {"conversation_id": "c", "workspace": {"repo": name}},
                                    content_type="application/json")
        assert refused.status_code == 400 and "not an allowlisted repository" in refused.json()["detail"]
