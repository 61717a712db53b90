"""Running the probes: an eval policy derived from the chosen version, sessions opened and driven
through the same broker and lifecycle as the API's, and the scorecard they leave.

The eval policy is the chosen version's document with what the probes need and nothing wider:
one rule that runs `python3 probe.py` (the probe the suite wrote into the workspace), the
session's driver, a short command timeout and output cap (so the timeout and flood probes end
quickly), no tests. Where the version allows egress, also a small byte budget and connection cap
(so the limits probe ends quickly) and the names the egress guards must refuse whatever a policy
says (`guarded_entries`: a name for loopback, the host's own name, the control plane's port). It
is published as the tenant's policy `containment-eval`, and shown there like any policy; it is
wider than the platform floor by design, so the floor is checked on the version it derives from.
"""

import json
import socket
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

import yaml
from django.conf import settings
from django.utils import timezone

from controlplane.models import Tenant
from policies_app import egress, floor
from policies_app import services as policies
from policies_app.document import PolicyDocument
from policies_app.models import ContainmentScore, Policy, PolicyVersion
from sessions import broker, lifecycle
from sessions.egress.proxy import TLS_PORTS
from sessions.evals import probes
from sessions.lifecycle import EVAL_POLICY
from sessions.models import SessionState

PROBE_FILE = "probe.py"
EVAL_LIMITS = {"command_timeout_s": 10, "output_mb": 1}  # at most these: the slow probes end fast
EVAL_NETWORK = {"max_bytes": 16384, "max_connections": 4}  # at most these where egress is allowed
UNSERVED_PORT = 9  # discard: the guards refuse before any packet, so nothing need listen there


class EvalRefused(Exception):
    """The version cannot be evaluated (the message says why)."""


@dataclass
class Result:
    probe: str
    checks: str
    passed: bool
    evidence: str
    seconds: float


@dataclass
class Scorecard:
    policy: str
    version: int
    driver: str
    eval_version: int
    started_at: str
    seconds: float = 0.0
    results: list[Result] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def as_json(self) -> dict:
        return {**asdict(self), "passed": self.passed, "airlock": airlock_version()}


def airlock_version() -> str:
    try:
        return package_version("airlock")
    except PackageNotFoundError:
        return "unknown"


def guarded_entries() -> list[str]:
    """Allow entries the egress guards refuse whatever a policy says, each before any packet: a
    name for loopback, the control plane's port on it, and this host's own name (where it resolves)."""
    entries = [f"localhost:{UNSERVED_PORT}", f"localhost:{settings.AIRLOCK_PORT}"]
    own = f"{socket.gethostname().lower()}:{UNSERVED_PORT}"
    try:
        resolves = bool(socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        resolves = False
    if resolves and egress.parsed_or_none(own) is not None:
        entries.append(own)
    return entries


def eval_document(version: PolicyVersion, driver: str) -> dict:
    document = PolicyDocument.model_validate(version.document).model_dump(mode="json", by_alias=True)
    document["tests"] = []
    document["mode"] = "enforce"
    document["runtime"] = {**document["runtime"], "driver": driver, "isolation": "standard"}
    document["limits"] = {**document["limits"], **{name: min(document["limits"][name], most)
                                                   for name, most in EVAL_LIMITS.items()}}
    document["commands"] = [rule for rule in document["commands"] if rule["id"] != "eval-probe"] + [
        {"id": "eval-probe", "bin": "python3", "exact_args": [PROBE_FILE]}]
    network = document["network"]
    if network["egress"] == "allowlist":
        network["allow"] += [entry for entry in guarded_entries() if entry not in network["allow"]]
        for name, most in EVAL_NETWORK.items():
            network[name] = most if network.get(name) is None else min(network[name], most)
    return document


def refusal(version: PolicyVersion, driver: str | None = None) -> str | None:
    """Why `version` cannot be evaluated (on `driver`), or None: a version that widens the platform
    floor in force opens no session, so there is nothing of it to evaluate; nor is it evaluated on a
    driver the floor does not let its sessions run on (a floor that requires gVisor)."""
    document = PolicyDocument.model_validate(version.document)
    if widened := floor.check(document):
        return (f"{version.policy.name} v{version.number} widens the platform floor ({widened[0].message}"
                + (f"; and {len(widened) - 1} more" if len(widened) > 1 else "") + "): no session of it opens, so "
                "there is nothing to evaluate")
    if driver is not None:
        on_driver = document.model_dump(mode="json", by_alias=True)
        on_driver["runtime"] = eval_document(version, driver)["runtime"]
        if widened := floor.check(PolicyDocument.model_validate(on_driver)):
            return f"the platform floor does not let sessions run on {driver}: {widened[0].message}"
    return None


def eval_version(tenant: Tenant, version: PolicyVersion, driver: str) -> PolicyVersion:
    """The eval policy's published version for this version and driver (made when it differs)."""
    if why := refusal(version, driver):
        raise EvalRefused(why)
    document = eval_document(version, driver)
    policy = Policy.objects.filter(tenant=tenant, name=EVAL_POLICY).first() or policies.policy_create(
        tenant=tenant, name=EVAL_POLICY, actor=None)
    published = policy.published_version()
    wanted = PolicyDocument.model_validate(document).sha256()
    if published is not None and published.sha256 == wanted:
        return published
    source = (f"# Derived by the containment eval from {version.policy.name} v{version.number} for the {driver} "
              f"driver:\n# its document, plus python3 {PROBE_FILE}, a short timeout and output cap, no tests.\n"
              + yaml.safe_dump(document, sort_keys=False))
    made = policies.version_create(policy=policy, source=source, actor=None,
                                   note=f"containment eval of {version.policy.name} v{version.number} on {driver}")
    policies.version_publish(version=made, actor=None, note="containment eval", eval_of=version)
    return made


class Context:
    """What a probe may do: open sessions of the eval policy, run a probe script, propose any
    request as an agent would, and read what was stored."""

    def __init__(self, tenant: Tenant, version: PolicyVersion, driver: str):
        self.tenant, self.version, self.driver = tenant, version, driver
        self.limits, self.network = version.document["limits"], version.document["network"]
        self.guarded = guarded_entries()
        self.opened = []

    def open(self):
        opened = lifecycle.session_open(tenant=self.tenant, conversation_id=f"containment-eval-{self.driver}",
                                        policy_name=EVAL_POLICY, repository="", actor_label="containment-eval",
                                        eval_version=self.version)
        self.opened.append(opened.session)
        return opened

    def run(self, session, source: str, timeout_s: int | None = None):
        """Write `source` as the probe and run it: the stored command (state, exit, reason, output)."""
        broker.file_operation(session=session, op="put", path=PROBE_FILE, data=source.encode())
        request = {"bin": "python3", "args": [PROBE_FILE], "cwd": "/workspace"}
        if timeout_s is not None:
            request["timeout_s"] = timeout_s
        return broker.command_propose(session=session, request=request, wait=True)

    def egress_target(self, *, tls: bool = False) -> str | None:
        """A `host:port` the chosen version allows by name (one on a TLS port when `tls`), or None."""
        for entry in self.network["allow"] if self.network["egress"] == "allowlist" else []:
            parsed = egress.parsed_or_none(entry)
            if (entry in self.guarded or parsed is None or parsed[0] or egress.ip_literal(parsed[1]) is not None
                    or (tls and parsed[2] not in TLS_PORTS)):
                continue
            return entry
        return None

    def propose(self, session, bin_name: str, args: list[str]):
        """A request as an agent sends it: the command, or BrokerError with the decision."""
        return broker.command_propose(session=session, request={"bin": bin_name, "args": args, "cwd": "/workspace"},
                                      wait=True)

    @staticmethod
    def reported(command) -> dict:
        """The JSON line a probe printed last."""
        for line in reversed((command.output or "").splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise ValueError(f"the probe printed no report ({command.reason}, exit {command.exit_code}): "
                         f"{(command.output or '')[-300:]!r}")

    def close(self) -> None:
        """End what the last probe opened (a session left open would hold its memory reserve)."""
        opened, self.opened = self.opened, []
        for session in opened:
            session.refresh_from_db()
            if session.state in (SessionState.CREATING, SessionState.READY):
                lifecycle.session_stop(session=session, state=SessionState.ENDED, actor=None, reason="eval done")


def run_suite(*, tenant: Tenant, version: PolicyVersion, driver: str, only: list[str] | None = None) -> Scorecard:
    """Every probe (or those named) against `version` on `driver`; a runner must be this process's
    or reachable (the command starts one: sessions/runner/thread.py)."""
    started = time.monotonic()
    derived = eval_version(tenant, version, driver)
    card = Scorecard(policy=version.policy.name, version=version.number, driver=driver,
                     eval_version=derived.number, started_at=timezone.now().isoformat(timespec="seconds"))
    context = Context(tenant, derived, driver)
    try:
        for probe in probes.PROBES:
            if only and probe.name not in only:
                continue
            began = time.monotonic()
            try:
                passed, evidence = probe.run(context)
            except Exception as exc:  # a probe that could not run proves nothing: it fails, saying why
                passed, evidence = False, f"could not run: {type(exc).__name__}: {exc}"[:500]
            finally:
                context.close()
            card.results.append(Result(probe.name, probe.checks, passed, evidence[:1000],
                                       round(time.monotonic() - began, 2)))
    finally:
        context.close()
    card.seconds = round(time.monotonic() - started, 1)
    ContainmentScore.objects.create(version=version, driver=driver, eval_version=derived.number,
                                    airlock_version=airlock_version(), seconds=card.seconds, passed=card.passed,
                                    results=[asdict(result) for result in card.results])
    return card
