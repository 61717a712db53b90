"""The platform floor (docs/architecture.md, "Platform floor"): a deployment-wide policy document,
kept by the deployment's staff, that every tenant's policy may only narrow. A tenant's version
widens it when it asks for a higher limit, a program or an argument the floor's rules do not
allow, an egress entry the floor does not list, a looser mode or isolation, persistence the floor
does not keep, or an environment variable it does not pass.

Rules are compared as written, never by what their regular expressions might match: a tenant's
rule is within a floor rule for the same program when it keeps every `deny_args` pattern and the
`prepend_args` of the floor's rule, and allows no more (`allow_args` among the floor's, or
`exact_args` each fully matched by them, or the floor's own `exact_args`). A rule this cannot
prove narrower is refused, with the reason: never the other way round."""

import re
from dataclasses import dataclass

from policies_app import egress
from policies_app.document import CommandRule, PolicyDocument
from policies_app.models import FloorVersion, Policy, PolicyVersion

LIMITS = ("cpus", "memory_mb", "pids", "disk_mb", "command_timeout_s", "session_ttl_s", "output_tail_chars",
          "output_mb")


@dataclass(frozen=True)
class Widening:
    location: tuple  # where in the tenant's document (keys and list indexes), for its line
    message: str


def current() -> FloorVersion | None:
    return FloorVersion.objects.order_by("-number", "-id").first()  # (one number each: migration 0011)


def document_of(version: FloorVersion) -> PolicyDocument:
    return PolicyDocument.model_validate(version.document)


def check(document: PolicyDocument, floor: FloorVersion | None = None) -> list[Widening]:
    """How `document` widens the floor in force (or `floor`): nothing when there is none."""
    floor = floor or current()
    return widenings(document, document_of(floor)) if floor is not None else []


def widenings(document: PolicyDocument, floor: PolicyDocument) -> list[Widening]:
    found = []
    if floor.mode == "enforce" and document.mode != "enforce":
        found.append(Widening(("mode",), "mode audit lets what the rules deny run; the platform floor enforces"))
    if floor.runtime.isolation == "gvisor" and document.runtime.driver_for("") != "gvisor":
        found.append(Widening(("runtime",), "the platform floor runs every sandbox under gVisor: set "
                                            "runtime.isolation: gvisor"))
    if floor.filesystem.arg_paths == "workspace_only" and document.filesystem.arg_paths != "workspace_only":
        found.append(Widening(("filesystem", "arg_paths"), "the platform floor keeps path arguments inside the "
                                                           "workspace (arg_paths: workspace_only)"))
    for name in LIMITS:
        mine, most = getattr(document.limits, name), getattr(floor.limits, name)
        if mine > most:
            found.append(Widening(("limits", name), f"limits.{name} {mine:g} is above the platform floor's {most:g}"))
    for index, rule in enumerate(document.commands):
        if reason := _rule_beyond(rule, [f for f in floor.commands if f.bin == rule.bin]):
            found.append(Widening(("commands", index), f"rule `{rule.id}`: {reason}"))
    found += _network(document, floor)
    found += _persistence(document, floor)
    for index, name in enumerate(document.env.pass_):
        if name not in floor.env.pass_:
            found.append(Widening(("env", "pass", index), f"env.pass `{name}` is not one the platform floor passes"))
    for name in document.env.set:
        if name not in floor.env.set:
            found.append(Widening(("env", "set", name), f"env.set `{name}` is not one the platform floor sets"))
    return found


def _rule_beyond(rule: CommandRule, candidates: list[CommandRule]) -> str | None:
    """Why `rule` is not within any of the floor's rules for its program, or None."""
    if not candidates:
        return f"`{rule.bin}` is not a program the platform floor allows"
    reasons = [_beyond(rule, floor_rule) for floor_rule in candidates]
    if None in reasons:
        return None
    return reasons[0] if len(reasons) == 1 else "; or ".join(reasons)


def _beyond(rule: CommandRule, floor: CommandRule) -> str | None:
    label = f"the platform floor's rule `{floor.id}`"
    if rule.prepend_args[: len(floor.prepend_args)] != floor.prepend_args:
        return f"it drops prepend_args {floor.prepend_args} of {label}"
    if missing := [pattern for pattern in floor.deny_args if pattern not in rule.deny_args]:
        return f"it does not keep deny_args {missing} of {label}"
    if floor.expires is not None and (rule.expires is None or rule.expires > floor.expires):
        return f"it outlives {label}, which expires at {floor.expires.isoformat()}"
    if floor.max_args is not None:
        count = len(rule.exact_args) if rule.exact_args is not None else rule.max_args
        if count is None or count > floor.max_args:
            return f"it allows more than max_args {floor.max_args} of {label}"
    if floor.exact_args is not None:
        return None if rule.exact_args == floor.exact_args else f"{label} allows exactly {floor.exact_args}"
    if floor.allow_args is None:
        return None
    if rule.exact_args is not None:
        loose = [arg for arg in rule.exact_args if not any(re.fullmatch(p, arg) for p in floor.allow_args)]
        return f"exact_args {loose} are not allowed by {label}" if loose else None
    if rule.allow_args is None:
        return f"it allows any arguments, and {label} only allow_args {floor.allow_args}"
    extra = [pattern for pattern in rule.allow_args if pattern not in floor.allow_args]
    return f"allow_args {extra} are not among those of {label}" if extra else None


def _network(document: PolicyDocument, floor: PolicyDocument) -> list[Widening]:
    mine, most = document.network, floor.network
    if mine.egress != "allowlist" or not mine.allow:  # an empty allowlist reaches nothing
        return []
    if most.egress != "allowlist":
        return [Widening(("network", "egress"), "the platform floor allows no egress")]
    found = []
    floor_entries = [egress.parsed_or_none(entry) for entry in most.allow]
    for index, entry in enumerate(mine.allow):
        if not _covered(egress.parsed_or_none(entry), floor_entries):
            found.append(Widening(("network", "allow", index), f"`{entry}` is not on the platform floor's allowlist"))
    for name in ("max_bytes", "max_connections"):
        limit, own = getattr(most, name), getattr(mine, name)
        if limit is not None and (own is None or own > limit):
            found.append(Widening(("network", name), f"network.{name} must be at most the platform floor's {limit}"))
    return found


def _covered(entry, floor_entries) -> bool:
    if entry is None:
        return True  # admits nothing (an entry this schema no longer accepts)
    wildcard, host, port = entry
    for floor_entry in floor_entries:
        if floor_entry is None:
            continue
        if not wildcard and egress.admits(floor_entry, host, port):
            return True
        floor_wildcard, floor_host, floor_port = floor_entry
        if wildcard and floor_wildcard and port == floor_port and (host == floor_host
                                                                    or host.endswith("." + floor_host)):
            return True
    return False


def _persistence(document: PolicyDocument, floor: PolicyDocument) -> list[Widening]:
    mine, most = document.persistence, floor.persistence
    if not mine.enabled:
        return []
    if not most.enabled:
        return [Widening(("persistence", "enabled"), "the platform floor keeps nothing between sessions")]
    found = [Widening(("persistence", name), f"persistence.{name} {getattr(mine, name)} is above the platform "
                                             f"floor's {getattr(most, name)}")
             for name in ("retention_days", "max_mb") if getattr(mine, name) > getattr(most, name)]
    return found + [Widening(("persistence", name), f"the platform floor sets persistence.{name}: true")
                    for name in ("resume_same_policy", "resume_same_rootfs")
                    if getattr(most, name) and not getattr(mine, name)]


@dataclass(frozen=True)
class Broken:
    policy: Policy
    version: PolicyVersion
    widenings: list[Widening]


def preview(floor: PolicyDocument) -> list[Broken]:
    """The published tenant versions that `floor`, were it in force, would refuse: what saving it
    breaks (their sessions could not start until a narrower version is published)."""
    broken = []
    for policy in Policy.objects.select_related("tenant").order_by("tenant__slug", "name"):
        published = policy.published_version()
        if published is not None and (found := widenings(PolicyDocument.model_validate(published.document), floor)):
            broken.append(Broken(policy, published, found))
    return broken
