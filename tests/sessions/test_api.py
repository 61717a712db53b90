"""The agent-facing session API on real bubblewrap sandboxes (docs/architecture.md, "API")."""

import json
import os
import time
from pathlib import Path

import pytest

from controlplane.models import ApiKeyScope, AuditEvent
from policies_app.models import DecisionRecord, PolicyVersion
from sessions import admission, services
from sessions.api.serializers import CommandSerializer
from sessions.models import CommandRun, Session
from sessions.runtimes import get_driver
from tests.sessions.conftest import POLICY, Agent, publish, run_on, running_runner

DECISION_FIELDS = {"id", "allowed", "effect", "reason_code", "rule_id", "message", "hint", "policy_version", "mode"}


def sandbox_dir(session_id: str) -> Path:
    return get_driver("bubblewrap").sandbox_dir / session_id


def test_creating_a_session_returns_its_token_version_and_stream(agent, acme_policy):
    session = agent.open(conversation_id="conv-42")
    assert session["state"] == "ready"
    assert session["conversation_id"] == "conv-42"
    assert session["tenant"] == "acme"
    assert session["policy_version"] == {"policy": "default", "number": acme_policy.number,
                                         "sha256": acme_policy.sha256}
    assert session["token"].startswith("ast_")
    assert session["stream_url"] == f"/ws/sessions/{session['id']}/"
    assert session["rootfs_digest"].startswith("sha256:")
    assert sandbox_dir(session["id"]).is_dir()
    again = agent.as_session(session).get(f"/api/v1/sessions/{session['id']}").json()
    assert again["state"] == "ready" and "token" not in again
    stored = Session.objects.get(pk=session["id"])  # what the Metrics page reads
    assert stored.prepare_ms is not None and stored.cache_hit is True and stored.ready_at > stored.created_at


def test_a_command_runs_in_the_sandbox_and_returns_its_result_when_waited_for(agent):
    session = agent.open()
    response = agent.run(session, "printf", "%s-%s", "a", "b")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "exited" and body["exit_code"] == 0 and body["reason"] == "exited"
    assert body["output"] == "a-b"
    assert body["decision"]["allowed"] is True and body["decision"]["rule_id"] == "printf"
    assert set(body["decision"]) == DECISION_FIELDS


def test_a_command_reads_the_same_in_the_schema_s_serializer_as_in_the_answer(agent):
    """The API answers with a plain dict built for speed; the schema describes CommandSerializer.
    They must not drift apart: the same stored command, both ways."""
    session = agent.open()
    answered = agent.run(session, "printf", "x").json()
    listed = agent.as_session(session).get(f"/api/v1/sessions/{session['id']}/commands").json()
    described = CommandSerializer(CommandRun.objects.select_related("decision__policy_version__policy")
                                  .get(pk=answered["id"])).data
    assert answered == listed[-1] == json.loads(json.dumps(described))


def test_a_command_without_wait_is_accepted_then_readable(agent):
    session = agent.open()
    response = agent.run(session, "python3", "--version", wait=False)
    assert response.status_code == 403  # `-` options are denied to python3: the body says why
    assert response.json()["decision"]["reason_code"] == "arg_denied"
    response = agent.run(session, "sleep", "0", wait=False)
    assert response.status_code == 202
    assert response.json()["state"] in {"queued", "running", "exited"}
    command_url = f"/api/v1/sessions/{session['id']}/commands/{response.json()['id']}"
    followed = agent.run(session, "printf", "after", wait=True)  # commands of a session run in order
    assert followed.json()["output"] == "after"
    assert agent.as_session(session).get(command_url).json()["state"] == "exited"


def test_an_exception_lets_exactly_its_command_run_in_a_session(agent, acme_policy):
    from datetime import timedelta

    from django.utils import timezone

    from policies_app.exceptions import exception_grant

    session = agent.open()
    assert agent.run(session, "echo", "hotfix").status_code == 403
    grant = exception_grant(policy=acme_policy.policy, bin_name="echo", args=["hotfix"], reason="incident 7",
                            expires_at=timezone.now() + timedelta(minutes=5), actor=None)
    body = agent.run(session, "echo", "hotfix").json()
    assert body["output"] == "hotfix\n" and body["decision"]["rule_id"] == f"exception:{grant.id}"
    assert agent.run(session, "echo", "hotfix", "now").status_code == 403
    grant.refresh_from_db()
    assert grant.use_count == 1


def test_a_denied_command_gets_403_with_the_whole_decision(agent):
    session = agent.open()
    response = agent.run(session, "bash", "-c", "id")
    assert response.status_code == 403
    body = response.json()
    assert body["error"] == "command_denied"
    decision = body["decision"]
    assert set(decision) == DECISION_FIELDS
    assert decision["reason_code"] == "bin_not_allowed" and decision["allowed"] is False
    assert "`pytest`" in decision["hint"] and '{"bin": "id", "args": []}' in decision["hint"]  # not "add `bash`"
    assert "can add `bash`" not in decision["hint"]
    assert DecisionRecord.objects.get(pk=decision["id"]).session_id is not None
    assert not CommandRun.objects.filter(session_id=session["id"]).exists()


def test_path_escapes_and_limits_are_denied_with_their_reason(agent):
    session = agent.open()
    assert agent.run(session, "python3", "../../etc/passwd").json()["decision"]["reason_code"] == \
        "path_outside_workspace"
    assert agent.run(session, "printf", "x", cwd="/etc").json()["decision"]["reason_code"] == "path_outside_workspace"
    assert agent.run(session, "sleep", "1", timeout_s=999).json()["decision"]["reason_code"] == "limit_exceeded"


def test_malformed_requests_get_400_with_field_errors(agent):
    session = agent.open()
    client = agent.as_session(session)
    url = f"/api/v1/sessions/{session['id']}/commands"
    response = client.post(url, {"args": "not a list", "timeout_s": 0}, content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request"
    assert set(body["fields"]) == {"bin", "args", "timeout_s"}
    unparsed = client.post(url, "{", content_type="application/json")
    assert unparsed.status_code == 400 and unparsed.json()["error"] == "invalid_request"
    assert "JSON parse error" in unparsed.json()["fields"]["non_field_errors"][0]
    numbers = client.post(url, {"bin": 5, "args": [1, "x"], "cwd": 7}, content_type="application/json").json()
    assert set(numbers["fields"]) == {"bin", "args", "cwd"}  # a number is not a program name, an argument, a path
    huge = client.post(url, {"bin": "printf", "args": ["x" * 60_000] * 5}, content_type="application/json")
    assert huge.status_code == 400 and "workspace file" in huge.json()["fields"]["args"][0]
    bad = agent.client.post("/api/v1/sessions", {"conversation_id": 7, "workspace": {"repo": 3}},
                            content_type="application/json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"conversation_id", "workspace"}


def test_a_command_that_outlives_its_timeout_ends_as_timeout(agent):
    session = agent.open()
    body = agent.run(session, "sleep", "30", timeout_s=1).json()
    assert body["state"] == "timeout" and body["reason"] == "timeout" and body["exit_code"] is None


def test_a_secret_in_a_cwd_is_never_stored(agent, settings):
    settings.AIRLOCK_REDACT_VALUES = ["supersecretvalue123"]
    session = agent.open()
    body = agent.run(session, "printf", "x", cwd="/workspace/supersecretvalue123").json()
    assert CommandRun.objects.get(pk=body["id"]).cwd == "/workspace/[redacted]"


def test_output_is_redacted_and_only_its_tail_is_kept(agent):
    session = agent.open()
    script = b"print('key AKIAABCDEFGHIJKLMNOP and token=hunter2hunter2')\nprint('x' * 5000)\nprint('end')\n"
    assert agent.put(session, "leak.py", script).status_code == 204
    body = agent.run(session, "python3", "leak.py").json()
    assert body["truncated"] is True
    assert len(body["output"]) == 2000  # the policy's output_tail_chars
    assert body["output"].endswith("end\n")
    command = CommandRun.objects.get(pk=body["id"])
    assert command.output_bytes > 5000
    head = agent.run(session, "python3", "leak.py").json()["output"]
    assert "AKIA" not in head
    first_line = agent.run(session, "printf", "AKIAABCDEFGHIJKLMNOP token=hunter2hunter2").json()["output"]
    assert first_line == "[redacted] token=[redacted]"


def test_the_environment_comes_from_the_policy_only(agent, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "runner-secret-value")
    session = agent.open()
    agent.put(session, "env.py", b"import os\nprint(sorted(os.environ.items()))\n")
    output = agent.run(session, "python3", "env.py").json()["output"]
    assert "('GREETING', 'hello')" in output
    assert "runner-secret-value" not in output and "AWS_SECRET" not in output


def test_workspace_files_round_trip_and_stay_inside(agent):
    session = agent.open()
    assert agent.put(session, "tests/test_sum.py", b"def test_sum():\n    assert sum([1, 2]) == 3\n").status_code == 204
    read = agent.get(session, "tests/test_sum.py")
    assert read.status_code == 200 and read.content.startswith(b"def test_sum")
    result = agent.run(session, "pytest", "tests/").json()
    assert result["exit_code"] == 0 and "1 passed" in result["output"]
    assert agent.get(session, "missing.txt").status_code == 404
    denied = agent.put(session, "a/../../x", b"x")
    assert denied.status_code == 403
    assert denied.json()["decision"]["reason_code"] == "path_outside_workspace"
    assert DecisionRecord.objects.filter(kind="file", session_id=session["id"]).count() >= 4


def test_a_symlink_planted_in_the_workspace_is_never_followed(agent):
    session = agent.open()
    agent.put(session, "plant.py", b"import os\nos.symlink('/etc/passwd', 'link')\nos.symlink('/etc', 'dir')\n")
    assert agent.run(session, "python3", "plant.py").json()["exit_code"] == 0
    assert agent.get(session, "link").json()["error"] == "symlink_refused"
    assert agent.put(session, "dir/evil", b"x").json()["error"] == "symlink_refused"


def test_the_workspace_quota_holds_for_files(agent):
    session = agent.open()  # disk_mb: 8
    response = agent.put(session, "big.bin", b"\0" * (3 * 2**20))
    assert response.status_code == 204
    response = agent.put(session, "bigger.bin", b"\0" * (3 * 2**20))
    assert response.status_code == 204
    response = agent.put(session, "too-much.bin", b"\0" * (3 * 2**20))
    assert response.status_code == 507
    assert response.json()["error"] == "quota_exceeded"


LIST_FILES = (b"import os\nfor root, dirs, files in os.walk('.'):\n"
              b"    for name in files:\n        print(os.path.join(root, name))\n")


def workspace_files(agent, session) -> set[str]:
    """Every file in the workspace, hidden ones too, as the sandbox itself lists them."""
    assert agent.put(session, "ls.py", LIST_FILES).status_code == 204
    result = agent.run(session, "python3", "ls.py").json()
    assert result["exit_code"] == 0, result
    return set(result["output"].split()) - {"./ls.py"}


def test_a_write_refused_for_quota_or_size_leaves_the_old_file_exactly_as_it_was(agent, settings):
    session = agent.open()  # disk_mb: 8
    original = b"def test_keep():\n    assert True\n"
    assert agent.put(session, "keep.py", original).status_code == 204
    for filler in ("a.bin", "b.bin"):
        assert agent.put(session, filler, b"\0" * (3 * 2**20)).status_code == 204
    response = agent.put(session, "keep.py", b"# larger\n" * (400 * 1024))  # 3.6 MB: does not fit
    assert response.status_code == 507, response.content
    assert response.json()["error"] == "quota_exceeded"
    assert agent.get(session, "keep.py").content == original
    too_large = agent.put(session, "keep.py", b"#" * (settings.AIRLOCK_MAX_FILE_BYTES + 1))
    assert too_large.status_code == 413 and agent.get(session, "keep.py").content == original
    assert workspace_files(agent, session) == {"./keep.py", "./a.bin", "./b.bin"}  # no partial or hidden file
    assert agent.run(session, "pytest", "keep.py").json()["exit_code"] == 0  # still the file it was


def test_a_write_removes_what_a_killed_write_left_behind(agent):
    session = agent.open()
    # What a write SIGKILLed mid-way (its sandbox killed, say) leaves: a hidden temporary file.
    agent.put(session, "plant.py", b"open('.airlock-put-0123456789abcdef', 'w').write('half')\n"
                                   b"import os\nos.makedirs('d', exist_ok=True)\n"
                                   b"open('d/.airlock-put-feedfacefeedface', 'w').write('half')\n")
    assert agent.run(session, "python3", "plant.py").json()["exit_code"] == 0
    assert agent.put(session, "d/new.py", b"x = 1\n").status_code == 204
    assert agent.put(session, "top.py", b"y = 2\n").status_code == 204
    assert workspace_files(agent, session) == {"./plant.py", "./d/new.py", "./top.py"}


def test_a_write_keeps_the_mode_of_the_file_it_replaces(agent):
    session = agent.open()
    agent.put(session, "run.py", b"print('v1')\n")
    agent.put(session, "chmod.py", b"import os\nos.chmod('run.py', 0o750)\n")
    assert agent.run(session, "python3", "chmod.py").json()["exit_code"] == 0
    assert agent.put(session, "run.py", b"print('v2')\n").status_code == 204
    agent.put(session, "mode.py", b"import os\nprint(oct(os.stat('run.py').st_mode & 0o777))\n")
    assert agent.run(session, "python3", "mode.py").json()["output"].strip() == "0o750"
    assert agent.get(session, "run.py").content == b"print('v2')\n"


def test_a_listing_shows_the_workspace_as_it_is_and_follows_no_link(agent):
    session = agent.open()
    agent.put(session, "src/app/main.py", b"print(1)\n")
    agent.put(session, "plant.py", b"import os\nos.symlink('/etc', 'etc')\nos.mkfifo('pipe')\n"
                                   b"open('.airlock-put-0123456789abcdef', 'w').write('half')\n")
    assert agent.run(session, "python3", "plant.py").json()["exit_code"] == 0
    files = agent.as_session(session)
    listing = files.get(f"/api/v1/sessions/{session['id']}/files")
    assert listing.status_code == 200, listing.content
    body = listing.json()
    kinds = {entry["path"]: entry["type"] for entry in body["entries"]}
    assert kinds == {"etc": "symlink", "pipe": "other", "plant.py": "file", "src": "dir", "src/app": "dir",
                     "src/app/main.py": "file"}  # /etc not walked, the write's leftover not shown
    assert body["truncated"] is False
    assert next(e for e in body["entries"] if e["path"] == "src/app/main.py")["size"] == 9
    under = files.get(f"/api/v1/sessions/{session['id']}/files", {"path": "src"}).json()
    assert [entry["path"] for entry in under["entries"]] == ["src/app", "src/app/main.py"]
    through_link = files.get(f"/api/v1/sessions/{session['id']}/files", {"path": "etc"})
    assert through_link.status_code == 400 and through_link.json()["error"] == "symlink_refused"
    not_a_directory = files.get(f"/api/v1/sessions/{session['id']}/files", {"path": "plant.py"})
    assert not_a_directory.status_code == 400 and not_a_directory.json()["error"] == "not_a_directory"
    outside = files.get(f"/api/v1/sessions/{session['id']}/files", {"path": "../"})
    assert outside.status_code == 403 and outside.json()["decision"]["reason_code"] == "path_outside_workspace"
    missing = files.get(f"/api/v1/sessions/{session['id']}/files", {"path": "nothing"})
    assert missing.status_code == 404


def test_a_listing_survives_what_a_program_can_plant_and_says_when_it_is_cut(agent):
    session = agent.open()
    agent.put(session, "plant.py", b"import os\nos.mkdir(b'bad\\xff')\nos.makedirs('/'.join(['d'] * 40))\n")
    assert agent.run(session, "python3", "plant.py").json()["exit_code"] == 0
    body = agent.as_session(session).get(f"/api/v1/sessions/{session['id']}/files").json()
    paths = [entry["path"] for entry in body["entries"]]
    assert "bad\\xff" in paths  # a name that is not UTF-8, shown escaped
    assert body["truncated"] is True and max(path.count("/") for path in paths) == 32  # 33 levels shown, no more


def test_a_fifo_or_socket_in_the_workspace_is_neither_read_nor_replaced(agent):
    session = agent.open()
    agent.put(session, "make.py", b"import os, socket\nos.mkfifo('pipe')\n"
                                  b"socket.socket(socket.AF_UNIX).bind('sock')\n")
    assert agent.run(session, "python3", "make.py").json()["exit_code"] == 0
    for name in ("pipe", "sock"):
        started = time.monotonic()
        read = agent.get(session, name)  # opening a FIFO would block until a writer came: it must not
        assert read.status_code == 400 and read.json()["error"] == "not_a_regular_file", read.content
        assert time.monotonic() - started < 10  # far below the 90 s a blocked read would take
        write = agent.put(session, name, b"data")
        assert write.status_code == 400 and write.json()["error"] == "not_a_regular_file", write.content


def test_a_directory_or_an_overlong_name_says_so(agent):
    session = agent.open()
    agent.put(session, "tests/test_x.py", b"")
    for method in (agent.get, lambda session, path: agent.put(session, path, b"x")):
        response = method(session, "tests")
        assert response.status_code == 400 and response.json()["error"] == "is_a_directory", response.content
        response = method(session, "a" * 300)
        assert response.status_code == 400 and response.json()["error"] == "name_too_long", response.content


def test_one_tenant_holds_at_most_its_share_of_the_waiting_threads(agent, acme, globex, make_key, api, settings):
    """Calls that wait for a runner hold a server thread each: past AIRLOCK_API_WAITING_PER_TENANT
    a tenant's next one is refused at once, and another tenant's calls go on."""
    import threading

    settings.AIRLOCK_API_WAITING_PER_TENANT = 2
    session = agent.open()
    assert agent.run(session, "sleep", "2", wait=False).status_code == 202  # the session's jobs queue behind it
    answers = []
    readers = [threading.Thread(target=lambda: answers.append(agent.get(session, "nothing").status_code))
               for _ in range(2)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 20
    while admission._waiting[acme.pk] < 2:  # both reads hold their thread now
        assert time.monotonic() < deadline, "the two reads never started waiting"
        time.sleep(0.02)
    refused = agent.get(session, "nothing")
    assert refused.status_code == 429 and refused.json()["error"] == "too_many_waiting_calls"
    assert refused["Retry-After"] == "1" and "AIRLOCK_API_WAITING_PER_TENANT" in refused.json()["detail"]
    publish(globex)
    other = Agent(api, make_key(globex).key)
    theirs = other.open()  # waits for its sandbox: another tenant's share is untouched
    assert other.run(theirs, "printf", "ok").json()["output"] == "ok"
    for reader in readers:
        reader.join(30)
    assert answers == [404, 404]  # the two that waited were answered once the command ended


def test_a_write_queued_past_its_deadline_never_lands(agent, runner):
    """A write waiting behind a long command gives up at its deadline, and stays given up: the
    command ending later does not let it land (the API's 504 means never)."""
    session = agent.open()
    agent.put(session, "keep.py", b"old\n")
    agent.put(session, "wait.py", b"import time\ntime.sleep(3)\n")
    assert agent.run(session, "python3", "wait.py", wait=False).status_code == 202
    reply = run_on(runner, runner.handle({"type": "file.put", "session": session["id"], "path": "keep.py",
                                          "data": b"new\n", "deadline": time.time() + 1}), timeout=30)
    assert reply["ok"] is False and reply["error"] == "runner_timeout", reply
    assert agent.run(session, "sleep", "1").json()["exit_code"] == 0  # after wait.py, in the same queue
    assert agent.get(session, "keep.py").content == b"old\n"
    assert workspace_files(agent, session) == {"./keep.py", "./wait.py"}


def test_a_policy_that_names_no_driver_runs_on_the_deployments_default(agent, settings):
    settings.AIRLOCK_RUNTIME = "docker"  # the test policy has no runtime section
    response = agent.client.post("/api/v1/sessions", {"conversation_id": "default-driver"},
                                 content_type="application/json")
    session = Session.objects.get(conversation_id="default-driver")
    assert session.driver == "docker"
    if response.status_code == 201:  # a Docker engine here: the session runs on it
        assert response.json()["driver"] == "docker"
        assert agent.run(response.json(), "printf", "on docker").json()["output"] == "on docker"
        agent.as_session(response.json()).delete(f"/api/v1/sessions/{session.pk}")
    else:  # none: refused, and the answer says which driver and who chose it
        assert os.environ.get("AIRLOCK_REQUIRE_DOCKER") != "1", response.content
        assert response.status_code == 503, response.content
        detail = response.json()["detail"]
        assert "docker driver" in detail and "AIRLOCK_RUNTIME" in detail, detail


def test_a_policy_that_names_a_driver_runs_there_whatever_the_default(agent, acme, settings):
    settings.AIRLOCK_RUNTIME = "docker"
    publish(acme, POLICY + "runtime: {driver: bubblewrap}\n")
    session = agent.open()
    assert session["driver"] == "bubblewrap"
    assert agent.run(session, "printf", "on bubblewrap").json()["output"] == "on bubblewrap"


def test_a_version_stored_before_the_driver_was_optional_follows_its_source(acme_policy, settings):
    """Such a version's document says `driver: bubblewrap` whether or not its author wrote it."""
    settings.AIRLOCK_RUNTIME = "docker"
    document = {**acme_policy.document, "runtime": {**acme_policy.document["runtime"], "driver": "bubblewrap"}}
    old = PolicyVersion.objects.create(policy=acme_policy.policy, number=acme_policy.number + 1, document=document,
                                       source=acme_policy.source, sha256="0" * 64)
    assert services.driver_of(old) == ("docker", False)
    named = PolicyVersion.objects.create(policy=acme_policy.policy, number=acme_policy.number + 2, document=document,
                                         source=acme_policy.source + "runtime: {driver: bubblewrap}\n", sha256="1" * 64)
    assert services.driver_of(named) == ("bubblewrap", True)


def test_ending_a_session_destroys_its_workspace_and_revokes_its_token(agent):
    session = agent.open()
    client = agent.as_session(session)
    response = client.delete(f"/api/v1/sessions/{session['id']}")
    assert response.status_code == 200 and response.json()["state"] == "ended"
    assert not sandbox_dir(session["id"]).exists()
    assert session["id"] not in get_driver("bubblewrap").list_sandboxes()
    refused = client.get(f"/api/v1/sessions/{session['id']}")
    assert refused.status_code == 401 and refused.json()["error"] == "session_ended"
    # The tenant's key still reads it, and a command is refused with session_not_active.
    body = agent.client.post(f"/api/v1/sessions/{session['id']}/commands", {"bin": "printf", "args": ["x"]},
                             content_type="application/json").json()
    assert body["decision"]["reason_code"] == "session_not_active"
    assert agent.client.delete(f"/api/v1/sessions/{session['id']}").status_code == 409


def test_killing_a_session_stops_what_runs_and_is_audited(agent, acme):
    session = agent.open()
    started = agent.run(session, "sleep", "600", wait=False, timeout_s=20)
    assert started.status_code == 202
    response = agent.client.post(f"/api/v1/sessions/{session['id']}/kill")
    assert response.status_code == 200 and response.json()["state"] == "killed"
    command = CommandRun.objects.get(pk=started.json()["id"])
    assert command.state == "killed"
    assert not sandbox_dir(session["id"]).exists()
    event = AuditEvent.objects.get(tenant=acme, action="session.killed")
    assert event.actor.startswith("apikey:alk_") and event.target_id == session["id"]


def test_a_token_reaches_only_its_own_session(agent, api):
    first, second = agent.open(), agent.open()
    response = agent.as_session(first).get(f"/api/v1/sessions/{second['id']}")
    assert response.status_code == 403 and response.json()["error"] == "wrong_session"
    assert agent.as_session(first).post(f"/api/v1/sessions/{second['id']}/kill").status_code == 403
    assert agent.as_session(first).post("/api/v1/sessions", {"conversation_id": "x"},
                                        content_type="application/json").status_code == 403
    assert api("ast_not-a-real-token").get(f"/api/v1/sessions/{first['id']}").json()["error"] == "invalid_token"


def test_another_tenant_never_reaches_a_session(agent, globex, make_key, api):
    session = agent.open()
    publish(globex)
    outsider = api(make_key(globex).key)
    assert outsider.get(f"/api/v1/sessions/{session['id']}").status_code == 404
    assert outsider.post(f"/api/v1/sessions/{session['id']}/kill").status_code == 404
    assert outsider.get(f"/api/v1/sessions/{session['id']}/files/x").status_code == 404
    assert Session.objects.get(pk=session["id"]).state == "ready"


def test_a_key_without_the_sessions_scope_cannot_open_sessions(acme, acme_policy, make_key, api, runner):
    key = make_key(acme, scopes=[ApiKeyScope.POLICIES_READ]).key
    response = api(key).post("/api/v1/sessions", {"conversation_id": "c"}, content_type="application/json")
    assert response.status_code == 403


def test_a_session_needs_a_policy_of_that_name_and_a_published_version(acme, make_key, api, runner):
    from policies_app.services import policy_create

    policy_create(tenant=acme, name="draft", actor=None)
    client = api(make_key(acme).key)
    response = client.post("/api/v1/sessions", {"conversation_id": "c", "policy": "nope"},
                           content_type="application/json")
    assert response.status_code == 404 and response.json()["error"] == "policy_not_found"
    response = client.post("/api/v1/sessions", {"conversation_id": "c", "policy": "draft"},
                           content_type="application/json")
    assert response.status_code == 409 and response.json()["error"] == "policy_not_published"


def test_a_session_keeps_its_pinned_version_after_a_new_publish(agent, acme):
    old = agent.open()
    stricter = publish(acme, source="commands:\n  - {id: printf, bin: printf}\n")
    assert agent.run(old, "sleep", "0").status_code == 200  # still v1: sleep allowed
    new = agent.open()
    assert new["policy_version"]["number"] == stricter.number
    denied = agent.run(new, "sleep", "0")
    assert denied.status_code == 403
    assert denied.json()["decision"]["policy_version"]["number"] == stricter.number


def test_a_token_past_its_sessions_ttl_is_refused_even_before_the_runner_notices(agent):
    from datetime import timedelta

    from django.utils import timezone

    session = agent.open()
    Session.objects.filter(pk=session["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = agent.as_session(session).get(f"/api/v1/sessions/{session['id']}")
    assert response.status_code == 401 and response.json()["error"] == "session_ended"
    refused = agent.client.post(f"/api/v1/sessions/{session['id']}/commands", {"bin": "printf", "args": ["x"]},
                                content_type="application/json").json()  # the tenant's key
    assert refused["decision"]["reason_code"] == "session_not_active"
    assert "time to live" in refused["decision"]["message"]


@pytest.mark.parametrize(("field", "value"), [("wait", "yes"), ("wait", 1), ("wait", "true"),
                                              ("timeout_s", "5"), ("timeout_s", True), ("timeout_s", 5.0)])
def test_command_fields_take_their_json_type_only(field, value, agent):
    session = agent.open()
    response = agent.run(session, "python3", "-V", **{"wait": True, field: value})
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == [field]


SPLIT_SECRET = "configured-Secret-0123456789"
# Half the secret on stdout, half on stderr, no newline: each stream alone holds no secret.
SPLITTER = (b"import sys, time\nsecret = open('secret.txt').read(); half = len(secret) // 2\n"
            b"sys.stdout.write(secret[:half]); sys.stdout.flush(); time.sleep(0.2)\n"
            b"sys.stderr.write(secret[half:]); sys.stderr.flush()\n")


@pytest.fixture
def redacting_agent(acme, acme_policy, make_key, api, settings, transactional_db, sandboxes):
    """An agent whose runner started knowing a configured secret (AIRLOCK_REDACT_VALUES)."""
    settings.AIRLOCK_REDACT_VALUES = [SPLIT_SECRET]
    with running_runner():
        yield Agent(api, make_key(acme).key)


def test_a_secret_split_across_stdout_and_stderr_is_never_stored(redacting_agent):
    agent = redacting_agent
    session = agent.open()
    assert agent.put(session, "secret.txt", SPLIT_SECRET.encode()).status_code == 204
    assert agent.put(session, "split.py", SPLITTER).status_code == 204
    body = agent.run(session, "python3", "split.py").json()
    assert body["exit_code"] == 0
    stored = CommandRun.objects.get(pk=body["id"]).output
    assert SPLIT_SECRET not in stored and SPLIT_SECRET not in body["output"]
    assert stored == "[redacted]"


def test_a_tenant_opens_at_most_its_limit_of_sessions_and_the_refusal_is_recorded(agent, acme, globex, make_key,
                                                                                   api, settings):
    settings.AIRLOCK_MAX_SESSIONS_PER_TENANT = 2
    first, _ = agent.open(), agent.open()
    refused = agent.client.post("/api/v1/sessions", {"conversation_id": "conv-1"}, content_type="application/json")
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    body = refused.json()
    assert body["error"] == "too_many_sessions" and "AIRLOCK_MAX_SESSIONS_PER_TENANT" in body["detail"]
    assert body["decision"]["reason_code"] == "tenant_limit" and body["decision"]["hint"]
    record = DecisionRecord.objects.get(pk=body["decision"]["id"])
    assert (record.tenant, record.kind, record.allowed) == (acme, "session", False)
    assert Session.objects.filter(tenant=acme).count() == 2  # nothing of the refused one was written
    publish(globex)
    Agent(api, make_key(globex).key).open()  # another tenant's count is its own
    assert agent.as_session(first).delete(f"/api/v1/sessions/{first['id']}").status_code == 200
    agent.open()  # room again


def test_a_tenant_queues_at_most_its_limit_of_commands(agent, acme, settings):
    settings.AIRLOCK_MAX_COMMANDS_PER_TENANT = 1
    busy, other = agent.open(), agent.open()
    assert agent.run(busy, "sleep", "2", wait=False).status_code == 202
    refused = agent.run(other, "printf", "x")
    assert refused.status_code == 429 and refused.json()["error"] == "too_many_commands"
    assert refused.json()["decision"]["reason_code"] == "tenant_limit"
    assert "AIRLOCK_MAX_COMMANDS_PER_TENANT" in refused.json()["detail"]
    assert not CommandRun.objects.filter(session_id=other["id"]).exists()
    deadline = time.monotonic() + 20
    while CommandRun.objects.filter(session_id=busy["id"], state__in=["queued", "running"]).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert agent.run(other, "printf", "x").json()["output"] == "x"  # the slot is free again


def test_sessions_are_placed_only_where_their_memory_fits(agent, acme_policy, runner, settings):
    from sessions.admission import reserved_mb
    from sessions.models import Runner

    need = reserved_mb(acme_policy.document["limits"])
    Runner.objects.filter(pk=runner.id).update(memory_mb=need + need // 2)  # room for one
    settings.AIRLOCK_RUNNER_MEMORY_MB = need + need // 2
    settings.AIRLOCK_TENANT_MEMORY_SHARE = 1.0  # the runner's room is the question here, not the tenant's share
    agent.open()
    refused = agent.client.post("/api/v1/sessions", {"conversation_id": "c"}, content_type="application/json")
    assert refused.status_code == 503 and refused.json()["error"] == "no_capacity"
    assert "AIRLOCK_RUNNER_MEMORY_MB" in refused.json()["detail"]
    # Placement that raced (the row says there is room): the runner itself refuses.
    Runner.objects.filter(pk=runner.id).update(memory_mb=10 * need)
    raced = agent.client.post("/api/v1/sessions", {"conversation_id": "c"}, content_type="application/json")
    assert raced.status_code == 503 and raced.json()["error"] == "no_capacity"
    assert "AIRLOCK_RUNNER_MEMORY_MB" in raced.json()["detail"]


FLOOD = b"import sys\nfor _ in range(400):\n    sys.stdout.write('password=hunter2hunter2 ' * 100 + '\\n')\n"


def test_a_flooding_command_is_read_at_the_sessions_output_rate(agent, settings):
    """About 1 MB of output read at 256 KiB/s: the command waits on its own writes (its pipe stays
    full), so it takes at least the time the rate gives it."""
    settings.AIRLOCK_OUTPUT_BYTES_PER_S = 256 * 1024
    session = agent.open()
    assert agent.put(session, "flood.py", FLOOD).status_code == 204
    body = agent.run(session, "python3", "flood.py").json()
    assert body["exit_code"] == 0 and body["output_bytes"] > 900_000
    paced = (body["output_bytes"] - 256 * 1024) / (256 * 1024)  # seconds past the first burst
    assert body["duration_ms"] >= 0.8 * paced * 1000, body["duration_ms"]
    assert "hunter2" not in body["output"]


def test_the_default_output_cap_ends_a_command_at_16_mib(agent, settings):
    settings.AIRLOCK_OUTPUT_BYTES_PER_S = 1 << 30  # not paced: the cap is what this test is about
    session = agent.open()
    script = b"import sys\nblock = 'y' * 65535 + '\\n'\nwhile True:\n    sys.stdout.write(block)\n"
    assert agent.put(session, "endless.py", script).status_code == 204
    body = agent.run(session, "python3", "endless.py").json()
    assert body["reason"] == "output_limit" and body["exit_code"] is None
    assert 15 * 2**20 <= body["output_bytes"] <= 16 * 2**20 + 65536  # (the read that crossed it counts)


def test_a_tenant_reserves_at_most_its_share_of_the_runners_memory(agent, acme_policy, globex, make_key, api,
                                                                   runner, settings):
    from sessions.admission import reserved_mb
    from sessions.models import Runner

    memory = Runner.objects.get(pk=runner.id).memory_mb
    settings.AIRLOCK_TENANT_MEMORY_SHARE = 1.5 * reserved_mb(acme_policy.document["limits"]) / memory  # one fits
    agent.open()
    refused = agent.client.post("/api/v1/sessions", {"conversation_id": "c"}, content_type="application/json")
    assert refused.status_code == 429 and refused.json()["decision"]["reason_code"] == "tenant_limit"
    assert "AIRLOCK_TENANT_MEMORY_SHARE" in refused.json()["detail"]
    publish(globex)
    Agent(api, make_key(globex).key).open()  # the room it could not take is another tenant's


def test_a_session_queues_at_most_sixteen_jobs_behind_its_running_one(agent, settings):
    from sessions.runner.core import MAX_QUEUED

    settings.AIRLOCK_MAX_COMMANDS_PER_TENANT = 2 * MAX_QUEUED  # the runner's limit, not the tenant's
    session = agent.open()
    assert agent.run(session, "sleep", "2", wait=False).status_code == 202
    deadline = time.monotonic() + 10
    while not CommandRun.objects.filter(session_id=session["id"], state="running").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    queued = [agent.run(session, "printf", str(n), wait=False).json()["id"] for n in range(MAX_QUEUED + 1)]
    deadline = time.monotonic() + 30
    while CommandRun.objects.filter(session_id=session["id"], state__in=["queued", "running"]).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    states = [(c.state, c.reason) for c in (CommandRun.objects.get(pk=pk) for pk in queued)]
    assert states[:MAX_QUEUED] == [("exited", "exited")] * MAX_QUEUED
    assert states[MAX_QUEUED] == ("failed", "session busy")


def test_a_key_lists_its_tenants_sessions_newest_first_and_filters_them(agent, globex, make_key, api):
    first, second = agent.open(conversation_id="conv-a"), agent.open(conversation_id="conv-b")
    agent.client.delete(f"/api/v1/sessions/{first['id']}")
    listed = agent.client.get("/api/v1/sessions").json()
    assert [item["id"] for item in listed] == [second["id"], first["id"]] and "token" not in listed[0]
    assert [item["id"] for item in agent.client.get("/api/v1/sessions", {"state": "active"}).json()] == [second["id"]]
    assert [item["id"] for item in agent.client.get("/api/v1/sessions", {"conversation_id": "conv-a"}).json()] == [
        first["id"]]
    bad = agent.client.get("/api/v1/sessions", {"state": "sideways"})
    assert bad.status_code == 400 and "state" in bad.json()["fields"]
    assert api(make_key(globex).key).get("/api/v1/sessions").json() == []
