"""The containment eval: every probe passes on real bubblewrap sandboxes under the tests' policy
(Docker and gVisor run it by the command: see the closing note's figures), a deliberately
weakened driver or egress guard makes the matching probe fail, the scorecard is stored and shown,
and under a platform floor the eval runs what is within it and refuses what is not."""

import json

import pytest
from django.core.management import CommandError, call_command

from policies_app import egress
from policies_app import services as policy_services
from policies_app.models import ContainmentScore
from sessions.egress import proxy
from sessions.evals.probes import PROBES
from sessions.evals.suite import EvalRefused, run_suite
from tests.sessions.conftest import POLICY, publish

# Egress to the loopback upstreams of tests/upstreams.py (the test-only resolver maps the names).
WITH_EGRESS = POLICY + 'network: {egress: allowlist, allow: ["tls.test:443", "pypi.test:80"]}\n'
EGRESS_PROBES = ["egress-guards", "egress-tls", "egress-limits"]
PYTHON_RULE = '  - id: python3\n    bin: python3\n    deny_args: ["^-"]\n'


def test_every_probe_passes_on_bubblewrap_and_the_scorecard_is_stored_and_shown(acme, acme_policy, runner, alice,
                                                                                client_for, make_key, api):
    card = run_suite(tenant=acme, version=acme_policy, driver="bubblewrap")
    failed = [(result.probe, result.evidence) for result in card.results if not result.passed]
    assert failed == [] and len(card.results) == len(PROBES)
    assert card.seconds < 120  # the target is 60 s a driver; bench-free, a bound against a hang
    score = ContainmentScore.objects.get(version=acme_policy, driver="bubblewrap")
    assert score.passed and [r["probe"] for r in score.results] == [probe.name for probe in PROBES]
    page = client_for(alice).get("/t/acme/policies/default/").content.decode()
    section = page.split('data-testid="containment-scores"')[1].split("</section>")[0]
    assert "bubblewrap" in section and section.count(">pass<") == len(PROBES) and ">fail<" not in section
    reader = api(make_key(acme, scopes=["policies:read"]).key)  # and as JSON, through the API
    [exported] = reader.get(f"/api/v1/policies/default/versions/{acme_policy.number}").json()["containment"]
    assert exported["driver"] == "bubblewrap" and exported["passed"] and len(exported["results"]) == len(PROBES)
    derived = acme.policies.get(name="containment-eval").published_version()
    assert derived.number == card.eval_version and "python3 probe.py" in derived.source  # shown, like any policy


def test_a_workspace_without_its_quota_makes_the_disk_probe_fail(acme, acme_policy, runner, monkeypatch):
    from sessions.runtimes import bubblewrap

    real = bubblewrap.mount_tmpfs
    monkeypatch.setattr(bubblewrap, "mount_tmpfs",
                        lambda path, *, size_bytes, **options: real(path, size_bytes=size_bytes * 4, **options))
    card = run_suite(tenant=acme, version=acme_policy, driver="bubblewrap", only=["disk-bomb", "identity"])
    results = {result.probe: result for result in card.results}
    assert not results["disk-bomb"].passed and "written to /workspace" in results["disk-bomb"].evidence
    assert results["identity"].passed and not card.passed


def test_the_command_prints_json_and_exits_1_when_a_probe_fails(acme, acme_policy, runner, capsys, monkeypatch):
    call_command("containment_eval", "--tenant", "acme", "--policy", "default", "--probe", "timeout", "--json")
    [card] = json.loads(capsys.readouterr().out)
    assert card["passed"] and card["driver"] == "bubblewrap" and [r["probe"] for r in card["results"]] == ["timeout"]
    from sessions.evals import probes

    failing = probes.Probe("always-fails", "a probe that fails", lambda ctx: (False, "no"))
    monkeypatch.setattr(probes, "PROBES", [failing])
    with pytest.raises(CommandError) as failed:
        call_command("containment_eval", "--tenant", "acme", "--policy", "default")
    assert failed.value.returncode == 1
    with pytest.raises(CommandError, match="no published policy"):
        call_command("containment_eval", "--tenant", "acme", "--policy", "nothing")


def test_the_button_runs_the_eval_and_a_deployment_may_require_a_pass_before_publishing(
        acme, acme_policy, runner, alice, bob, client_for, settings):
    import time

    from policies_app import services

    settings.AIRLOCK_REQUIRE_CONTAINMENT_EVAL = True
    draft = services.version_create(policy=acme_policy.policy, source=acme_policy.source, actor=None)
    refused = client_for(alice).post(f"/t/acme/policies/default/v/{draft.number}/publish", {"note": "go"})
    assert refused.status_code == 400 and "needs a passing containment eval" in refused.content.decode()
    assert client_for(bob).post(f"/t/acme/policies/default/v/{draft.number}/eval").status_code == 403
    started = client_for(alice).post(f"/t/acme/policies/default/v/{draft.number}/eval")
    assert started.status_code == 302
    deadline = time.monotonic() + 120
    while not ContainmentScore.objects.filter(version=draft).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    score = ContainmentScore.objects.get(version=draft)
    assert score.passed, [(r["probe"], r["evidence"]) for r in score.results if not r["passed"]]
    page = client_for(alice).get(f"/t/acme/policies/default/v/{draft.number}/").content.decode()
    assert 'data-testid="containment-scores"' in page and page.count(">pass<") >= len(PROBES)
    published = client_for(alice).post(f"/t/acme/policies/default/v/{draft.number}/publish", {"note": "go"})
    assert published.status_code == 302 and acme_policy.policy.published_version() == draft


def test_no_agent_opens_a_session_of_the_evals_own_wider_policy(acme, acme_policy, runner, agent):
    run_suite(tenant=acme, version=acme_policy, driver="bubblewrap", only=["identity"])  # it now exists
    response = agent.client.post("/api/v1/sessions", {"conversation_id": "c", "policy": "containment-eval"},
                                 content_type="application/json")
    assert response.status_code == 403 and response.json()["error"] == "policy_reserved"


@pytest.fixture
def loopback_egress(settings, upstreams):
    settings.AIRLOCK_EGRESS_TEST_HOSTS = upstreams.test_hosts()
    settings.AIRLOCK_PORT = upstreams.port(upstreams.control_plane)  # the stand-in is the control plane
    return upstreams


def test_every_egress_hardening_case_is_probed_against_real_upstreams(acme, runner, loopback_egress):
    version = publish(acme, WITH_EGRESS)
    card = run_suite(tenant=acme, version=version, driver="bubblewrap", only=EGRESS_PROBES)
    results = {result.probe: result for result in card.results}
    assert [(name, result.passed) for name, result in results.items()] == [(name, True) for name in EGRESS_PROBES], (
        [result.evidence for result in card.results])
    guards = results["egress-guards"].evidence
    assert "localhost:9: HTTP/1.1 403 Airlock egress_address_denied" in guards  # allowed by name, loopback
    assert f"localhost:{loopback_egress.port(loopback_egress.control_plane)}: HTTP/1.1 403 Airlock " \
           "egress_control_plane" in guards
    assert "its own name: tls; another name: cut; plain bytes: cut" in results["egress-tls"].evidence
    assert "network.max_connections" in results["egress-limits"].evidence
    assert loopback_egress.control_plane.connections == 0
    derived = acme.policies.get(name="containment-eval").published_version().document["network"]
    assert derived["max_bytes"] == 16384 and "localhost:9" in derived["allow"]  # what the eval added, shown


def test_an_egress_guard_weakened_on_purpose_makes_its_probe_fail(acme, runner, loopback_egress, monkeypatch):
    version = publish(acme, WITH_EGRESS)
    monkeypatch.setattr(proxy, "TLS_PORTS", set())  # no ClientHello read: fronting and non-TLS pass
    monkeypatch.setattr(egress, "denied_address", lambda address, **options: None)  # loopback names dialled
    card = run_suite(tenant=acme, version=version, driver="bubblewrap", only=EGRESS_PROBES)
    results = {result.probe: result for result in card.results}
    assert not results["egress-tls"].passed and "another name: tls" in results["egress-tls"].evidence
    assert not results["egress-guards"].passed  # localhost:9 dialled, and answered 502 (nothing listens there)
    assert results["egress-guards"].evidence.startswith("not refused as expected: ['localhost:9'")
    assert results["egress-limits"].passed and not card.passed


def test_under_a_platform_floor_the_eval_runs_a_version_within_it_and_refuses_one_beyond(
        acme, acme_policy, runner, alice, client_for):
    within = POLICY.replace(PYTHON_RULE, "")
    assert within != POLICY
    policy_services.floor_set(source=within, actor=None, note="no python3", accept_breaking=True)
    with pytest.raises(CommandError, match="widens the platform floor"):  # acme_policy has python3: beyond it
        call_command("containment_eval", "--tenant", "acme", "--policy", "default")
    page = client_for(alice).post(f"/t/acme/policies/default/v/{acme_policy.number}/eval", follow=True)
    assert "The containment eval cannot run: default v1 widens the platform floor" in page.content.decode()
    with pytest.raises(EvalRefused):
        run_suite(tenant=acme, version=acme_policy, driver="bubblewrap", only=["identity"])
    version = publish(acme, within)
    card = run_suite(tenant=acme, version=version, driver="bubblewrap", only=["identity"])
    assert card.passed  # its eval policy runs python3 probe.py, beyond the floor by design: no agent opens it
    on_gvisor = within.replace("mode: enforce\n", "mode: enforce\nruntime: {isolation: gvisor}\n")
    policy_services.floor_set(source=on_gvisor, actor=None, note="gVisor only", accept_breaking=True)
    publish(acme, on_gvisor)
    with pytest.raises(CommandError, match="does not let sessions run on bubblewrap"):  # not even for the eval
        call_command("containment_eval", "--tenant", "acme", "--policy", "default", "--driver", "bubblewrap")


def test_an_eval_opens_its_own_derived_version_even_after_another_eval_published_one(acme, acme_policy, runner):
    from sessions.evals.suite import Context, eval_version

    mine = eval_version(acme, acme_policy, "bubblewrap")
    theirs = eval_version(acme, acme_policy, "docker")  # another eval, started meanwhile, publishes its own
    assert theirs != mine and mine.policy.published_version() == theirs
    context = Context(acme, mine, "bubblewrap")
    try:
        assert context.open().session.policy_version_id == mine.pk
    finally:
        context.close()
