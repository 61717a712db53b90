"""Egress conformance, on every driver (bubblewrap, Docker, gVisor), through the whole stack: the
API opens a session whose policy allows egress, real sandboxes run a probe, a real per-session
proxy judges each connection with the pinned version, and the decision log records it.

Every upstream is on loopback (tests/upstreams.py), reached by names that the test-only resolver
setting maps to it; what must be refused is proved with loopback, the host's own name and
addresses, and addresses that are refused before any packet is sent."""

import json
import os
import socket
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from policies_app import services as policy_services
from policies_app.decisions import compiled_version, replay
from policies_app.models import DecisionRecord
from sessions.models import CommandRun
from sessions.runner.egress import DENIAL_BURST, DENIALS_PER_S, egress_root
from sessions.runtimes import get_driver
from sessions.runtimes.base import RuntimeUnavailable
from tests.sessions.conftest import publish, running_runner
from tests.sessions.test_stream import communicator
from tests.upstreams import REPO_FILE, REPO_TEXT, WHEEL_VALUE, Upstreams

DRIVERS = ["bubblewrap", "docker", "gvisor"]
PROBE = (Path(__file__).parent / "egress_probe.py").read_bytes()
RUNTIME = {"bubblewrap": "{driver: bubblewrap}", "docker": "{driver: docker}", "gvisor": "{isolation: gvisor}"}
HOSTNAME = socket.gethostname().lower()


def policy(driver: str, *, network: str = "") -> str:
    return f"""
mode: enforce
runtime: {RUNTIME[driver]}
limits: {{cpus: 1, memory_mb: 512, pids: 128, disk_mb: 64, command_timeout_s: 90, output_tail_chars: 8000}}
commands:
  - {{id: python3, bin: python3}}
  - {{id: pip, bin: pip}}
  - {{id: git, bin: git}}
  - {{id: cat, bin: cat}}
network:
  egress: allowlist
  allow: [pypi.test:80, git.test:80, tls.test:443, echo.test:8080, cp.test:80, "localhost:8080", "{HOSTNAME}:8080"]
  {network}
"""


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    servers = Upstreams(tmp_path_factory.mktemp("upstreams"))
    yield servers
    servers.close()


@pytest.fixture(params=DRIVERS)
def driver(request, sandboxes):
    try:
        get_driver(request.param).check()
    except RuntimeUnavailable as exc:
        required = os.environ.get("AIRLOCK_REQUIRE_DOCKER") == "1" or request.param == "bubblewrap"
        if required and (request.param != "bubblewrap" or os.environ.get("CI") == "true"):
            pytest.fail(f"{request.param} is required here but unavailable: {exc}")
        pytest.skip(f"{request.param} unavailable: {exc}")
    return request.param


@pytest.fixture
def egress(settings, upstreams, acme, agent, driver):
    """Open sessions of a policy that allows egress on `driver`; run the probe in them."""
    settings.AIRLOCK_EGRESS_TEST_HOSTS = upstreams.test_hosts()
    settings.AIRLOCK_PORT = upstreams.port(upstreams.control_plane)
    return Egress(agent, acme, driver)


class Egress:
    def __init__(self, agent, tenant, driver: str):
        self.agent, self.tenant, self.driver = agent, tenant, driver

    def open(self, network: str = "") -> dict:
        publish(self.tenant, policy(self.driver, network=network))
        session = self.agent.open()
        assert self.agent.put(session, "probe.py", PROBE).status_code in {200, 201, 204}
        return session

    def run(self, session: dict, *argv: str) -> dict:
        response = self.agent.run(session, *argv)
        assert response.status_code == 200, response.content
        return response.json()

    def probe(self, session: dict, check: str, *args: str) -> dict:
        command = self.run(session, "python3", "probe.py", check, *args)
        assert command["exit_code"] == 0, command["output"]
        return {**json.loads(command["output"].strip().splitlines()[-1]), "command": command["id"]}


def decisions(session: dict, **filters) -> list[DecisionRecord]:
    return list(DecisionRecord.objects.filter(session_id=session["id"], kind="egress", **filters)
                .order_by("created_at"))


def test_without_the_proxy_a_sandbox_has_no_route_and_no_resolver(egress, upstreams):
    session = egress.open()
    assert egress.probe(session, "interfaces")["interfaces"] == ["lo"]
    host_address = socket.gethostbyname(HOSTNAME)
    for check, args in [("direct", ("127.0.0.1", str(upstreams.port(upstreams.http)))),  # the host's loopback
                        ("direct", (host_address, str(upstreams.port(upstreams.http)))),  # the host's own address
                        ("udp", (host_address, "53")), ("raw", ()), ("dns", ("pypi.test",)), ("dns", (HOSTNAME,))]:
        result = egress.probe(session, check, *args)
        assert result["ok"] is False, (check, args, result)
    assert egress.probe(session, "raw")["errno"] == "EPERM"
    assert decisions(session) == []  # nothing reached the proxy: nothing to decide
    # Behind the forwarder a command still ends as itself: its exit code, or its signal.
    assert egress.run(session, "python3", "-c", "raise SystemExit(3)")["exit_code"] == 3
    assert egress.run(session, "python3", "-c", "import os; os.kill(os.getpid(), 15)")["exit_code"] == 143


def test_pip_install_and_git_clone_go_through_the_proxy(egress):
    session = egress.open()
    pip = egress.run(session, "pip", "install", "--index-url", "http://pypi.test/simple/", "--trusted-host",
                     "pypi.test", "--disable-pip-version-check", "--no-cache-dir", "airlock-probe")
    assert pip["exit_code"] == 0, pip["output"]
    imported = egress.run(session, "python3", "-c", "import airlock_probe; print(airlock_probe.VALUE)")
    assert imported["output"].strip() == str(WHEEL_VALUE), imported["output"]
    clone = egress.run(session, "git", "clone", "-q", "http://git.test/repo.git", "repo")
    assert clone["exit_code"] == 0, clone["output"]
    assert egress.run(session, "cat", f"repo/{REPO_FILE}")["output"] == REPO_TEXT
    recorded = decisions(session)
    assert {record.subject for record in recorded} == {"pypi.test:80", "git.test:80"}
    assert all(record.allowed and record.rule_id == "network.allow" for record in recorded)
    assert {str(record.command_id) for record in recorded if record.subject == "pypi.test:80"} == {pip["id"]}
    assert {str(record.command_id) for record in recorded if record.subject == "git.test:80"} == {clone["id"]}


def test_a_denied_host_gets_a_403_saying_why_and_the_decision_is_recorded(egress):
    session = egress.open()
    result = egress.probe(session, "fetch", "http://files.test/data")
    assert result["status"] == 403 and result["reason"].startswith("Airlock egress_denied: files.test:80 is not on")
    text, json_line = result["body"].strip().rsplit("\n", 1)
    assert "hint: policy `default`" in text and "a security admin can add files.test:80" in text
    decision = json.loads(json_line)["decision"]
    record = DecisionRecord.objects.get(pk=decision["id"])
    assert (record.kind, record.subject, record.allowed, record.reason_code) == ("egress", "files.test:80", False,
                                                                                 "egress_denied")
    assert str(record.command_id) == result["command"] and str(record.session_id) == session["id"]
    assert CommandRun.objects.get(pk=result["command"]).exit_code == 0


def test_what_egress_never_reaches_whatever_the_policy_says(egress, upstreams):
    session = egress.open()
    refused = {
        "localhost:8080": "egress_address_denied",  # a name that resolves to loopback
        f"{HOSTNAME}:8080": "egress_address_denied",  # the host's own name, hence its own address
        "169.254.169.254:80": "egress_address_denied",  # the cloud metadata address (refused before any packet)
        "[::1]:8080": "egress_address_denied",
        "[::ffff:127.0.0.1]:8080": "egress_address_denied",  # loopback spelt IPv4-mapped
        "cp.test:80": "egress_control_plane",  # the control plane's port on this host, mapped or not
    }
    for target, reason in refused.items():
        result = egress.probe(session, "tunnel", target)
        assert result["status"].startswith(f"HTTP/1.1 403 Airlock {reason}"), (target, result)
    assert upstreams.control_plane.connections == 0
    # Fronting: a tunnel to tls.test whose TLS asks for another name is cut before a byte goes.
    assert egress.probe(session, "tunnel", "tls.test:443", "", "evil.test")["answered"] == 0
    # Not TLS on a TLS port: cut too.
    assert egress.probe(session, "tunnel", "tls.test:443", "plain")["answered"] == 0
    egress.agent.put(session, "ca.pem", upstreams.certificate.read_bytes())
    tls = egress.probe(session, "fetch", "https://tls.test/simple/airlock-probe/", "ca.pem")
    assert tls["status"] == 200 and "airlock_probe" in tls["body"]  # real TLS with the right name passes
    recorded = [(record.subject, record.reason_code) for record in decisions(session, allowed=False)]
    assert recorded == [(target.replace("[", "").replace("]", ""), reason) for target, reason in refused.items()] + [
        ("tls.test:443", "egress_fronting"), ("tls.test:443", "egress_not_tls")]


def test_the_byte_budget_and_the_connection_cap_hold_with_a_clear_reason(egress):
    session = egress.open("max_bytes: 300000\n  max_connections: 2")
    cut = egress.probe(session, "fetch", "http://pypi.test/bytes/2000000")
    assert cut["status"] is None or cut.get("bytes", 0) < 2_000_000 or cut["ok"] is False, cut
    after = egress.probe(session, "fetch", "http://pypi.test/simple/airlock-probe/")
    assert after["status"] == 403 and "network.max_bytes" in after["body"], after
    capped = egress.open("max_connections: 2")
    statuses = egress.probe(capped, "hold", "3", "echo.test:8080")["statuses"]
    assert statuses[:2] == ["HTTP/1.1 200 Connection established"] * 2
    assert statuses[2].startswith("HTTP/1.1 403 Airlock limit_exceeded"), statuses
    assert {record.rule_id for record in decisions(session, allowed=False)} == {"network.max_bytes"}
    assert [record.rule_id for record in decisions(capped, allowed=False)] == ["network.max_connections"]


def test_each_session_reaches_only_its_own_proxy_which_goes_with_the_session(egress):
    first, second = egress.open(), egress.open()
    second_socket = egress_root() / second["id"] / "proxy.sock"
    assert second_socket.is_socket()
    assert egress.probe(first, "unix", "own")["ok"] is True
    reach = egress.probe(first, "unix", str(second_socket).lstrip("/"))
    assert reach["ok"] is False and reach["errno"] == "ENOENT"  # not even there to be named
    response = egress.agent.as_session(second).delete(f"/api/v1/sessions/{second['id']}")
    assert response.status_code in {200, 204}, response.content
    assert not (egress_root() / second["id"]).exists()
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(OSError):
        probe.connect(str(second_socket))
    assert egress.probe(first, "fetch", "http://pypi.test/simple/airlock-probe/")["status"] == 200


def test_the_egress_mount_shows_no_host_path(egress, settings):
    if egress.driver == "docker":
        pytest.skip("Docker's own overlay names its layers' host paths in every container's mountinfo")
    session = egress.open()
    seen = egress.run(session, "python3", "-c", "print(open('/proc/self/mountinfo').read())")["output"]
    assert "/run/airlock" in seen or egress.driver == "gvisor", seen  # (gVisor shows its own table)
    assert str(settings.AIRLOCK_SANDBOX_DIR) not in seen and session["id"] not in seen, seen
    assert egress.probe(session, "fetch", "http://pypi.test/simple/airlock-probe/")["status"] == 200


@pytest.mark.django_db(transaction=True)
async def test_each_connection_is_a_live_decision_event_on_the_sessions_websocket(settings, upstreams, acme,
                                                                                  async_agent):
    settings.AIRLOCK_EGRESS_TEST_HOSTS = upstreams.test_hosts()
    await sync_to_async(publish)(acme, policy("bubblewrap"))
    session = await sync_to_async(async_agent.open)()
    await sync_to_async(async_agent.put)(session, "probe.py", PROBE)
    socket_ = communicator(session, token=session["token"])
    assert (await socket_.connect())[0]
    await socket_.receive_json_from()  # the opening state
    response = await sync_to_async(async_agent.run)(session, "python3", "probe.py", "fetch", "http://files.test/x",
                                                    wait=False)
    command = response.json()["id"]
    seen = []
    while not seen or seen[-1]["event"] != "command.exited":
        seen.append(await socket_.receive_json_from(timeout=20))
    egress_events = [event for event in seen if event["event"] == "decision" and "host" in event["request"]]
    assert [(event["request"], event["command"], event["decision"]["reason_code"]) for event in egress_events] == [
        ({"host": "files.test", "port": 80}, command, "egress_denied")]
    assert egress_events[0]["decision"]["hint"].endswith("a security admin can add files.test:80")
    await socket_.disconnect()


@pytest.mark.parametrize("driver", ["bubblewrap"], indirect=True)  # the proxy's side: the same on every driver
def test_a_shadow_candidate_judges_each_connection_too_and_replay_shows_what_it_would_open(egress, acme):
    session = egress.open()
    policy_row = acme.policies.get(name="default")
    candidate = policy_services.version_create(policy=policy_row, actor=None, source=policy(
        "bubblewrap", network="").replace("cp.test:80,", "cp.test:80, files.test:80,"))
    policy_services.policy_set_shadow(policy=policy_row, version=candidate, actor=None)
    assert egress.probe(session, "fetch", "http://files.test/x")["status"] == 403  # the pinned version decides
    assert egress.probe(session, "tunnel", "localhost:8080")["status"].startswith("HTTP/1.1 403")  # a guard's
    files, guard = decisions(session, allowed=False)
    assert (files.subject, files.shadow_allowed, files.shadow_version_id) == ("files.test:80", True, candidate.pk)
    assert (guard.reason_code, guard.shadow_allowed) == ("egress_address_denied", None)  # no rule decided it
    result = replay(policy=policy_row, compiled=compiled_version(candidate))
    assert [(group.direction, group.examples) for group in result.groups] == [
        ("widening", [{"host": "files.test", "port": 80}])]


def test_a_runner_warns_at_start_while_the_test_only_resolver_is_set(settings, caplog, transactional_db, sandboxes):
    settings.AIRLOCK_EGRESS_TEST_HOSTS = {"pypi.test": ("127.0.0.1", 8081)}
    with caplog.at_level("WARNING", logger="airlock.runner"), running_runner():
        pass
    assert "AIRLOCK_EGRESS_TEST_HOSTS is set: sandboxes reach pypi.test" in caplog.text
    assert "never set it in production" in caplog.text


@pytest.mark.parametrize("driver", ["bubblewrap"], indirect=True)  # the proxy's side: the same on every driver
def test_a_flood_of_refused_connections_is_cut_short_and_recorded_once_a_second(egress):
    session = egress.open()
    flood = egress.probe(session, "flood", "600", "files.test:80")
    answers = flood["answers"]
    judged, flooded = answers.get("HTTP/1.1 403 Airlock egress_denied", 0), answers.get(
        "HTTP/1.1 403 Airlock limit_exceeded", 0)
    assert judged + flooded == 600 and flooded > 0, answers
    refilled = DENIALS_PER_S * (flood["seconds"] + 1)  # what the rate gave back while the flood ran
    assert judged <= DENIAL_BURST + refilled, flood
    records = decisions(session, allowed=False)
    assert len([record for record in records if record.reason_code == "egress_denied"]) == judged
    rate = [record for record in records if record.rule_id == "egress.refusal_rate"]
    assert 1 <= len(rate) <= 10 and rate[0].mode == "enforce" and rate[0].policy_version_id is not None
