"""The platform floor: every kind of widening refused with its reason, narrower rules admitted,
publishing refused with one error per widening at its line, a floor change's preview and its
audit, and the command that staff use."""

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import DatabaseError, transaction

from controlplane.models import AuditEvent
from policies_app import floor, services
from policies_app.document import parse_yaml
from policies_app.models import FloorVersion

FLOOR = """mode: enforce
limits: {cpus: 2, memory_mb: 1024, command_timeout_s: 60}
commands:
  - {id: pytest, bin: pytest, prepend_args: ["-q"], deny_args: ["^-c"]}
  - {id: make, bin: make, allow_args: ["^test$", "^lint$"]}
  - {id: git, bin: git, exact_args: ["status"]}
network: {egress: allowlist, allow: ["pypi.org:443", "*.pythonhosted.org:443"], max_bytes: 1000000}
env: {pass: [CI]}
persistence: {enabled: true, retention_days: 7, max_mb: 256}
"""


def widened(source: str, floor_source: str = FLOOR) -> list[tuple[str, str]]:
    return [(".".join(map(str, w.location)), w.message)
            for w in floor.widenings(parse_yaml(source), parse_yaml(floor_source))]


def test_a_policy_within_the_floor_widens_nothing():
    narrower = """limits: {cpus: 1, memory_mb: 512, command_timeout_s: 30}
commands:
  - {id: pytest, bin: pytest, prepend_args: ["-q", "-x"], deny_args: ["^-c", "^-p"]}
  - {id: make-test, bin: make, exact_args: ["test"]}
  - {id: make-any, bin: make, allow_args: ["^lint$"]}
  - {id: git, bin: git, exact_args: ["status"]}
network: {egress: allowlist, allow: ["pypi.org:443", "files.pythonhosted.org:443", "*.a.pythonhosted.org:443"],
          max_bytes: 5000}
env: {pass: [CI]}
persistence: {enabled: true, retention_days: 1, max_mb: 10}
"""
    assert widened(narrower) == []
    assert widened("commands: []\n") == []  # the schema's defaults are within this floor too


@pytest.mark.parametrize("source, where, says", [
    ("mode: audit\n", "mode", "mode audit lets what the rules deny run"),
    ("limits: {memory_mb: 2048}\n", "limits.memory_mb", "limits.memory_mb 2048 is above the platform floor's 1024"),
    ("limits: {cpus: 4}\n", "limits.cpus", "limits.cpus 4 is above the platform floor's 2"),
    ("commands: [{id: curl, bin: curl}]\n", "commands.0", "`curl` is not a program the platform floor allows"),
    ("commands: [{id: p, bin: pytest}]\n", "commands.0", "it drops prepend_args ['-q']"),
    ("commands: [{id: p, bin: pytest, prepend_args: ['-q']}]\n", "commands.0", "does not keep deny_args ['^-c']"),
    ("commands: [{id: m, bin: make}]\n", "commands.0", "it allows any arguments"),
    ("commands: [{id: m, bin: make, allow_args: ['.*']}]\n", "commands.0", "allow_args ['.*'] are not among"),
    ("commands: [{id: m, bin: make, exact_args: ['install']}]\n", "commands.0", "exact_args ['install'] are not"),
    ("commands: [{id: g, bin: git, exact_args: ['push']}]\n", "commands.0", "allows exactly ['status']"),
    ("network: {egress: allowlist, allow: ['github.com:443'], max_bytes: 10}\n", "network.allow.0",
     "`github.com:443` is not on the platform floor's allowlist"),
    ("network: {egress: allowlist, allow: ['pypi.org:80'], max_bytes: 10}\n", "network.allow.0", "pypi.org:80"),
    ("network: {egress: allowlist, allow: ['*.pypi.org:443'], max_bytes: 10}\n", "network.allow.0", "*.pypi.org:443"),
    ("network: {egress: allowlist, allow: ['pypi.org:443']}\n", "network.max_bytes", "at most the platform floor's"),
    ("env: {pass: [AWS_PROFILE]}\n", "env.pass.0", "env.pass `AWS_PROFILE` is not one the platform floor passes"),
    ("env: {set: {DEBUG: '1'}}\n", "env.set.DEBUG", "env.set `DEBUG`"),
    ("persistence: {enabled: true, retention_days: 30}\n", "persistence.retention_days", "30 is above"),
    ("filesystem: {arg_paths: any}\n", "filesystem.arg_paths", "keeps path arguments inside the workspace"),
])
def test_each_kind_of_widening_is_refused_with_its_reason(source, where, says):
    found = widened(source)
    assert [location for location, _ in found] == [where], found
    assert says in found[0][1]


def test_a_floor_without_egress_persistence_or_audit_refuses_them():
    strict = "commands: []\n"  # egress none, persistence off, mode enforce, the schema's limits
    assert [where for where, _ in widened("network: {egress: allowlist, allow: ['pypi.org:443']}\n", strict)] == [
        "network.egress"]
    assert [where for where, _ in widened("persistence: {enabled: true}\n", strict)] == ["persistence.enabled"]
    gvisor = "runtime: {isolation: gvisor}\n"
    assert [where for where, _ in widened("runtime: {driver: docker}\n", gvisor)] == ["runtime"]
    assert widened("runtime: {driver: bubblewrap, isolation: gvisor}\n", gvisor) == []


@pytest.fixture
def tenant_policy(acme):
    policy = services.policy_create(tenant=acme, name="default", actor=None)
    version = services.version_create(policy=policy, source="commands: [{id: curl, bin: curl}]\n", actor=None)
    services.version_publish(version=version, actor=None, note="first")
    return policy


def test_a_floor_that_breaks_published_versions_is_shown_before_it_is_saved(acme, globex, tenant_policy):
    other = services.policy_create(tenant=globex, name="tight", actor=None)
    services.version_publish(version=services.version_create(policy=other, source="commands: []\n", actor=None),
                             actor=None, note="first")
    broken = floor.preview(parse_yaml(FLOOR))
    assert [(b.policy.tenant.slug, b.policy.name, b.version.number) for b in broken] == [("acme", "default", 1)]
    with pytest.raises(services.FloorBreaks) as refused:
        services.floor_set(source=FLOOR, actor=None, note="tighten")
    assert refused.value.broken[0].widenings[0].message.startswith("rule `curl`")
    assert not FloorVersion.objects.exists()  # nothing saved
    version = services.floor_set(source=FLOOR, actor=None, note="tighten", accept_breaking=True)
    assert floor.current() == version and version.number == 1
    for tenant in (acme, globex):  # in every tenant's audit chain, with what it refuses of that tenant
        event = AuditEvent.objects.get(tenant=tenant, action="platform.floor_set")
        assert event.data["refuses"] == (["default v1"] if tenant == acme else [])


def test_publishing_a_version_that_widens_the_floor_fails_with_one_error_per_widening_at_its_line(acme, tenant_policy):
    services.floor_set(source=FLOOR, actor=None, note="tighten", accept_breaking=True)
    source = "mode: audit\ncommands:\n  - {id: curl, bin: curl}\nlimits: {cpus: 8}\n"
    draft = services.version_create(policy=tenant_policy, source=source, actor=None)
    with pytest.raises(ValidationError) as refused:
        services.version_publish(version=draft, actor=None, note="wide")
    assert refused.value.message_dict["floor"] == [
        "line 1: mode audit lets what the rules deny run; the platform floor enforces",
        "line 4: limits.cpus 8 is above the platform floor's 2",
        "line 3: rule `curl`: `curl` is not a program the platform floor allows"]
    assert tenant_policy.published_version().number == 1


def test_the_editor_marks_each_widening_at_its_line(acme, alice, client_for, tenant_policy):
    services.floor_set(source=FLOOR, actor=None, note="tighten", accept_breaking=True)
    source = "commands:\n  - {id: make, bin: make}\nlimits: {memory_mb: 4096}\n"
    answer = client_for(alice).post("/t/acme/policies/default/check", {"source": source}).json()
    floor_marks = [(mark["line"], mark["severity"]) for mark in answer["marks"]
                   if mark["message"].startswith("platform floor: ")]
    assert floor_marks == [(3, "error"), (2, "error")]  # memory_mb, then rule `make`
    assert 'data-testid="policy-floor"' in answer["panel"] and "platform floor (v1)" in answer["panel"]


def test_floor_versions_are_kept_as_written(acme):
    version = services.floor_set(source=FLOOR, actor=None, note="first")
    from django.db import connection

    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:  # past the ORM
        cursor.execute("UPDATE policies_app_floorversion SET note = 'rewritten'")
    for change in (lambda: FloorVersion.objects.filter(pk=version.pk).update(note="rewritten"),
                   lambda: FloorVersion.objects.filter(pk=version.pk).delete(), version.delete):
        with pytest.raises((DatabaseError, PermissionError)), transaction.atomic():
            change()
    assert FloorVersion.objects.get().note == "first"
    if connection.vendor == "sqlite":  # REPLACE deletes the row it meets without the UPDATE trigger
        with connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE forged AS SELECT * FROM policies_app_floorversion")
            cursor.execute("UPDATE forged SET note = 'rewritten'")
        with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT OR REPLACE INTO policies_app_floorversion SELECT * FROM forged")
        assert FloorVersion.objects.get().note == "first"


def test_staff_set_the_floor_with_a_command_that_shows_what_it_would_break(acme, tenant_policy, tmp_path, capsys):
    path = tmp_path / "floor.yaml"
    path.write_text(FLOOR)
    with pytest.raises(CommandError) as check:
        call_command("platform_floor", "check", str(path))
    assert check.value.returncode == 1 and "acme/default v1 (published)" in capsys.readouterr().out
    with pytest.raises(CommandError, match="not set: 1 published version"):
        call_command("platform_floor", "set", str(path), "--note", "tighten")
    with pytest.raises(CommandError, match="say why the floor changes"):
        call_command("platform_floor", "set", str(path), "--accept-breaking")
    call_command("platform_floor", "set", str(path), "--note", "tighten", "--accept-breaking")
    assert "platform floor v1 is in force" in capsys.readouterr().out
    call_command("platform_floor", "show")
    assert "# platform floor v1" in capsys.readouterr().out
    path.write_text("limits: {cpus: 99}\n")
    with pytest.raises(CommandError, match="is not a valid policy document"):
        call_command("platform_floor", "check", str(path))
    with pytest.raises(CommandError, match="needs the floor's file"):
        call_command("platform_floor", "set")


def test_the_editor_shows_the_floor_beside_the_tenants_document(acme, alice, client_for, tenant_policy):
    assert 'data-tab="floor"' not in client_for(alice).get("/t/acme/policies/default/edit").content.decode()
    services.floor_set(source=FLOOR, actor=None, note="tighten", accept_breaking=True)
    page = client_for(alice).get("/t/acme/policies/default/edit").content.decode()
    assert "Platform floor v1" in page and 'data-testid="platform-floor"' in page
    assert "*.pythonhosted.org:443" in page.split('data-testid="platform-floor"')[1]
    assert 'data-testid="policy-floor"' in page  # the published v1 (curl) widens it: marked before any edit
