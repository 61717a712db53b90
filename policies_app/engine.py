"""The policy engine: a pure function from a compiled version and a request to a Decision.

Default deny. Every decision names its reason_code (a closed set), the rule that decided, a
message, and a hint that says what would allow the request. A version is compiled once and
cached by its sha256; evaluation does no I/O."""

import difflib
import functools
import json
import posixpath
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from policies_app import egress, lint
from policies_app.document import CommandRule, EgressRequest, ExecRequest, PolicyDocument

WORKSPACE = "/workspace"
UNKNOWN_BINS_KEPT = 1024


@dataclass(frozen=True)
class VersionRef:
    policy: str
    number: int
    sha256: str

    def label(self) -> str:
        return f"policy `{self.policy}` v{self.number}"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    effect: str  # allow | deny | audit_deny (denied by the rules, allowed because mode is audit)
    reason_code: str | None
    rule_id: str | None
    message: str
    hint: str
    mode: str
    policy_version: VersionRef | None = None
    argv: tuple[str, ...] = field(default=())  # what runs when allowed: bin, prepend_args, args


@dataclass(frozen=True)
class CompiledRule:
    rule: CommandRule
    deny: tuple[re.Pattern, ...]
    allow: tuple[re.Pattern, ...] | None


@dataclass(frozen=True)
class CompiledPolicy:
    document: PolicyDocument
    ref: VersionRef
    rules_by_bin: dict[str, tuple[CompiledRule, ...]]
    expiring: frozenset[str] = frozenset()  # programs with a rule that has an `expires`
    egress_entries: tuple[tuple[bool, str, int] | None, ...] = ()  # network.allow, parsed (when an allowlist)
    # The refusal of a program no rule names depends only on the version and the name: kept.
    # For a program that runs code it depends on the arguments and cwd too (the hint judges what
    # it would run): kept by the whole request, as agents repeat theirs.
    unknown_bins: dict[str | tuple, "_Refusal"] = field(default_factory=dict, compare=False, repr=False)


def compile_policy(document: PolicyDocument, ref: VersionRef) -> CompiledPolicy:
    rules: dict[str, list[CompiledRule]] = {}
    for rule in document.commands:
        rules.setdefault(rule.bin, []).append(CompiledRule(
            rule=rule,
            deny=tuple(re.compile(pattern) for pattern in rule.deny_args),
            allow=tuple(re.compile(pattern) for pattern in rule.allow_args) if rule.allow_args is not None else None,
        ))
    network = document.network
    return CompiledPolicy(document=document, ref=ref, rules_by_bin={k: tuple(v) for k, v in rules.items()},
                          expiring=frozenset(rule.bin for rule in document.commands if rule.expires),
                          egress_entries=tuple(egress.parsed_or_none(item) for item in network.allow)
                          if network.egress == "allowlist" else ())


# -- evaluation ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Refusal:
    reason_code: str
    rule_id: str | None
    message: str
    hint: str
    hard: bool = False  # refused whatever the mode: nothing safe to run (audit mode does not waive it)


def evaluate(compiled: CompiledPolicy, request: dict | ExecRequest, at: datetime | None = None) -> Decision:
    """Decide one exec request: `{bin, args, cwd?, timeout_s?}`, at `at` (default now: it
    matters only to a rule with an `expires`)."""
    if not isinstance(request, ExecRequest):
        try:
            request = ExecRequest.model_validate(request)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
            return _decide(compiled, _Refusal("schema_invalid", None, f"the request is not valid ({problems})",
                                              "send {bin: <name>, args: [<string>, …], cwd?, timeout_s?}",
                                              hard=True))
    refusal, rule = _check_exec(compiled, request, at)
    return _decide(compiled, refusal, rule, request)


NEAR_CANDIDATES = 32  # allowlist entries a denial's "did you mean" compares with
HINT_ENTRIES = 10  # allowlist entries a denial's hint lists


def evaluate_egress(compiled: CompiledPolicy, request: dict | EgressRequest, at: datetime | None = None) -> Decision:
    """Decide one outbound connection `{host, port}`: allowed only when the policy's network
    section is an allowlist that names exactly this host and port."""
    ref, network = compiled.ref, compiled.document.network
    try:
        request = request if isinstance(request, EgressRequest) else EgressRequest.model_validate(request)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
        return _decide(compiled, _Refusal("schema_invalid", None, f"the request is not valid ({problems})",
                                          "send {host: <name>, port: <number>}", hard=True))
    target = f"{request.host.lower()}:{request.port}"
    allowed = [item.lower() for item in network.allow] if network.egress == "allowlist" else []
    literal = egress.ip_literal(request.host)
    if literal is not None and (why := egress.denied_address(literal, this_host=False)):  # listed or not
        return _decide(compiled, _Refusal(
            "egress_address_denied", None, f"{target}: {literal} is {why}, which egress never reaches",
            "no policy can allow it; reach the service by a public name the policy allows", hard=True))
    for entry, parsed in zip(allowed, compiled.egress_entries, strict=True):
        if egress.admits(parsed, request.host, request.port):
            shown = target if entry == target else f"{target} (by {entry})"
            return Decision(True, "allow", None, "network.allow", f"allowed: {shown} is on the egress allowlist of "
                            f"{ref.label()}", "", compiled.document.mode, ref)
    # Egress is enforced in audit mode too: observing would-be denials of connections would mean
    # letting every one out (audit mode observes commands only).
    if not allowed:
        refusal = _Refusal("egress_denied", None, f"{ref.label()} allows no network egress ({target})",
                           f"a security admin can set network.egress: allowlist with allow: [\"{target}\"]", hard=True)
    elif literal is not None:
        refusal = _Refusal("egress_ip_literal", None, f"{target} is an IP address the egress allowlist does not name",
                           "reach the service by a name on the allowlist; a security admin can name this address "
                           f"itself ({target}) if it has no name", hard=True)
    else:
        # Bounded work, whatever the allowlist's size: a denial can be asked for thousands of times
        # a second. The likely slips: the same host on another port, another host on this port.
        host = request.host.lower()
        candidates = [entry for entry in allowed
                      if entry.rsplit(":", 1)[0] == host or entry.endswith(f":{request.port}")][:NEAR_CANDIDATES]
        near = difflib.get_close_matches(target, candidates, n=1, cutoff=0.6)
        listed = ", ".join(allowed[:HINT_ENTRIES]) + (f" and {len(allowed) - HINT_ENTRIES} more"
                                                       if len(allowed) > HINT_ENTRIES else "")
        refusal = _Refusal("egress_denied", None, f"{target} is not on the egress allowlist",
                           f"{ref.label()} allows only {listed}; "
                           + (f"did you mean {near[0]}? " if near else "") + f"a security admin can add {target}",
                           hard=True)
    return _decide(compiled, refusal)


def _decide(compiled: CompiledPolicy, refusal: _Refusal | None, rule: CommandRule | None = None,
            request: ExecRequest | None = None) -> Decision:
    mode, ref = compiled.document.mode, compiled.ref
    if refusal is None:
        return Decision(True, "allow", None, rule.id, f"allowed by rule `{rule.id}` of {ref.label()}", "", mode,
                        ref, _argv(rule, request))
    # Audit mode records the would-be denial and lets the command run; what no policy may waive
    # (a malformed request, a bin given as a path, a cwd outside the workspace, a limit) is
    # denied in either mode.
    if mode == "audit" and not refusal.hard:
        rule = next((r.rule for rules in compiled.rules_by_bin.values() for r in rules if r.rule.id == refusal.rule_id),
                    None)
        return Decision(True, "audit_deny", refusal.reason_code, refusal.rule_id,
                        f"would be denied: {refusal.message}", refusal.hint, mode, ref, _argv(rule, request))
    return Decision(False, "deny", refusal.reason_code, refusal.rule_id, f"denied: {refusal.message}",
                    refusal.hint, mode, ref)


def _argv(rule: CommandRule | None, request: ExecRequest | None) -> tuple[str, ...]:
    if request is None:  # not a command (an egress request): nothing to run
        return ()
    prepend = tuple(rule.prepend_args) if rule is not None else ()
    return (request.bin, *prepend, *request.args)


def _check_exec(compiled: CompiledPolicy, request: ExecRequest,
                at: datetime | None) -> tuple[_Refusal | None, CommandRule | None]:
    ref, limits = compiled.ref, compiled.document.limits
    if "/" in request.bin or not request.bin:
        return _Refusal("bin_not_allowed", None, f"`{request.bin}` is a path; commands are named, not located",
                        f"send the bare program name, e.g. `{posixpath.basename(request.bin) or 'pytest'}`",
                        hard=True), None
    if request.timeout_s is not None and request.timeout_s > limits.command_timeout_s:
        return _Refusal("limit_exceeded", None,
                        f"timeout_s {request.timeout_s} is above the limit of {limits.command_timeout_s} s",
                        f"ask for at most {limits.command_timeout_s} s, or a security admin can raise "
                        f"limits.command_timeout_s in {ref.label()}", hard=True), None
    if path_escape(request.cwd, WORKSPACE) is not None:
        return _Refusal("path_outside_workspace", None, f"cwd `{request.cwd}` is outside {WORKSPACE}",
                        f"use a cwd inside {WORKSPACE}", hard=True), None
    rules = compiled.rules_by_bin.get(request.bin)
    if not rules:
        runs_code = lint.runs_any_code(request.bin) is not None
        key = (request.bin, tuple(request.args), request.cwd) if runs_code else request.bin
        refusal = compiled.unknown_bins.get(key)
        if refusal is None:
            refusal = _bin_not_allowed(compiled, request, at)
            cacheable = isinstance(key, str) or (not compiled.expiring and sum(map(len, request.args)) <= 1024)
            if len(compiled.unknown_bins) < UNKNOWN_BINS_KEPT and cacheable:
                compiled.unknown_bins[key] = refusal
        return refusal, None
    if request.bin in compiled.expiring:
        now = at or datetime.now(UTC)
        live = tuple(r for r in rules if r.rule.expires is None or r.rule.expires > now)
        if not live:
            last = max(rules, key=lambda r: r.rule.expires).rule
            return _Refusal("bin_not_allowed", last.id, f"rule `{last.id}` for `{request.bin}` expired at "
                            f"{last.expires.astimezone(UTC):%Y-%m-%d %H:%M} UTC",
                            f"a security admin can renew rule `{last.id}` (a later `expires`) in {ref.label()}"), None
        rules = live
    first_refusal = None
    for compiled_rule in rules:
        refusal = _check_args(compiled, compiled_rule, request)
        if refusal is None:
            return None, compiled_rule.rule
        first_refusal = first_refusal or refusal
    return first_refusal, None


def _bin_not_allowed(compiled: CompiledPolicy, request: ExecRequest, at: datetime | None) -> _Refusal:
    allowed, ref, bin_name = sorted(compiled.rules_by_bin), compiled.ref, request.bin
    grant = _grant_hint(compiled, request, at)
    if not allowed:
        return _Refusal("default_deny", None, f"{ref.label()} allows no command (default deny)",
                        grant or f"a security admin can add a rule for `{bin_name}` to {ref.label()}")
    names = ", ".join(f"`{name}`" for name in allowed)
    near = difflib.get_close_matches(bin_name, allowed, n=1, cutoff=0.6)
    hint = f"{ref.label()} allows only {names}; "
    hint += f"did you mean `{near[0]}`? " if near else ""
    hint += grant or f"a security admin can add `{bin_name}`"
    return _Refusal("bin_not_allowed", None, f"`{bin_name}` is not an allowed command", hint)


def _deny_hint(rule: CommandRule, arg: str, pattern: str, ref: VersionRef) -> str:
    if lint.inline_code_flag(rule.bin, [arg]) is not None:  # dropping it would not make the rest mean the same
        return (f"`{arg}` makes `{rule.bin}` run code it is given, which rule `{rule.id}` of {ref.label()} denies"
                + ("; write the code to a workspace file and run that file"
                   if lint.program(rule.bin) in lint.INTERPRETERS else ""))
    return f"drop `{arg}`; rule `{rule.id}` of {ref.label()} denies arguments matching `{pattern}`"


def _widen_hint(rule: CommandRule, args: tuple[str, ...] | list[str], ref: VersionRef) -> str:
    """Whether widening `rule` for these arguments would help, or run arbitrary code (lint's view)."""
    flag = lint.inline_code_flag(rule.bin, args)
    if flag is not None:
        return (f"`{flag}` makes `{rule.bin}` run code it is given, so widening rule `{rule.id}` for it is arbitrary "
                "code execution (lint flags it)"
                + ("; write the code to a workspace file and run that"
                   if lint.program(rule.bin) in lint.INTERPRETERS else ""))
    if lint.program(rule.bin) in lint.SHELLS or rule.bin in lint.WRAPPERS:
        return (f"{lint.runs_any_code(rule.bin)}, so widening rule `{rule.id}` lets an agent run anything (lint flags "
                "it); send the program it would run as argv instead")
    return f"a security admin can widen rule `{rule.id}` of {ref.label()}"


def _grant_hint(compiled: CompiledPolicy, request: ExecRequest, at: datetime | None) -> str | None:
    """For a program that runs arbitrary code, what narrower thing would help instead of a rule
    for it (which lint flags); None for any other program."""
    bin_name = request.bin
    why = lint.runs_any_code(bin_name)
    if why is None:
        return None
    if lint.program(bin_name) in lint.INLINE_CODE:
        closing = lint.closing_deny_args(bin_name)
        narrower = (f"deny_args [{', '.join(f'`{pattern}`' for pattern in closing)}] (or allow_args)" if closing
                    else "allow_args that list the arguments it may take")
        hint = (f"{why}, so a rule that leaves them open is arbitrary code execution (lint flags it); a security "
                f"admin can add `{bin_name}` with {narrower}")
        return hint + ("; the agent can write the code to a workspace file and run that"
                       if lint.program(bin_name) in lint.INTERPRETERS else "")
    instead = lint.argv_instead(bin_name, request.args)
    head = f"{why}: a rule for it lets an agent run anything (lint flags it as arbitrary code execution); "
    if not instead:
        return head + "send the program it would run, with its arguments, as argv instead"
    shown = json.dumps({"bin": instead[0], "args": instead[1:]})
    if lint.program(instead[0]) in lint.SHELLS or instead[0] in lint.WRAPPERS:
        return head + f"what it runs, {shown}, runs other programs too: send the innermost command as argv"
    # Judged here, so the hint never sends the agent to a command that is refused as well.
    verdict = evaluate(compiled, {"bin": instead[0], "args": instead[1:], "cwd": request.cwd}, at)
    if verdict.effect == "allow":  # not an audit-mode would-be denial
        return head + f"send the command itself as argv instead, {shown}: rule `{verdict.rule_id}` allows it"
    return head + f"the command it runs, {shown}, is refused too ({verdict.message.removeprefix('denied: ')})"


def _check_args(compiled: CompiledPolicy, compiled_rule: CompiledRule, request: ExecRequest) -> _Refusal | None:
    rule, ref = compiled_rule.rule, compiled.ref
    if rule.exact_args is not None and list(request.args) != rule.exact_args:
        allowed = " ".join(rule.exact_args) or "no arguments"
        return _Refusal("arg_denied", rule.id, f"rule `{rule.id}` allows exactly `{allowed}`",
                        f"send exactly `{allowed}`; {_widen_hint(rule, request.args, ref)}")
    if rule.max_args is not None and len(request.args) > rule.max_args:
        return _Refusal("arg_denied", rule.id, f"{len(request.args)} arguments; rule `{rule.id}` allows at most "
                        f"{rule.max_args}", f"send at most {rule.max_args} arguments")
    for position, arg in enumerate(request.args):
        for pattern in compiled_rule.deny:
            if pattern.search(arg):
                return _Refusal("arg_denied", rule.id,
                                f"argument {position} `{arg}` matches `{pattern.pattern}`, denied by rule `{rule.id}`",
                                _deny_hint(rule, arg, pattern.pattern, ref))
        if compiled_rule.allow is not None and not any(p.fullmatch(arg) for p in compiled_rule.allow):
            allowed = ", ".join(f"`{p.pattern}`" for p in compiled_rule.allow) or "none"
            return _Refusal("arg_denied", rule.id, f"argument {position} `{arg}` matches no allowed pattern of rule "
                            f"`{rule.id}`", f"rule `{rule.id}` allows only arguments matching {allowed}; "
                            f"{_widen_hint(rule, [arg], ref)}")
        if compiled.document.filesystem.arg_paths == "workspace_only":
            for value in path_candidates(arg):
                if path_escape(value, request.cwd) is not None:
                    return _Refusal("path_outside_workspace", rule.id,
                                    f"argument {position} `{arg}` points outside {WORKSPACE}",
                                    f"use paths inside {WORKSPACE} (relative paths resolve from the cwd)")
    return None


# A scheme of at most 32 characters that starts where a scheme can: linear in the argument's
# length (an unbounded scheme made a long argument cost the square of its length).
URL = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s,]*")


def path_candidates(arg: str) -> tuple[str, ...]:
    """Every part of an argument that may name a path: the argument, an attached short-option
    value (`-o/etc/x`), the pieces around `=`, `:`, `,` and `@` (`--out=../x`, `x:/etc`,
    `@/etc/x`), a `file://` URL's path. Other URLs are not paths. A relative piece without a `..`
    segment cannot leave the cwd, so it is not a candidate."""
    return _path_candidates(arg) if len(arg) <= 256 else _path_candidates.__wrapped__(arg)


@functools.lru_cache(maxsize=8192)  # a pure function of one short string: agents repeat their arguments
def _path_candidates(arg: str) -> tuple[str, ...]:
    text = URL.sub(_url_path_or_nothing, arg) if "://" in arg else arg
    pieces = re.split(r"[=:,@\s]", text)
    if re.match(r"-[A-Za-z0-9]", arg) and len(arg) > 2:
        pieces.append(text[2:])
    return tuple(piece for piece in pieces if piece.startswith(("/", "~")) or ".." in piece.split("/"))


def _url_path_or_nothing(match: re.Match) -> str:
    """A `file://` URL's path; any other URL is not a path, unless it climbs (`a://../../x` is a
    relative path to a directory named `a:` as much as a URL): then it stays to be checked."""
    url = match.group(0)
    if url.lower().startswith("file://"):
        return url[7:]
    return url if ".." in url.split("/") else " "


def path_escape(path: str, cwd: str) -> str | None:
    """The normalised path when it leaves the workspace, else None."""
    if path.startswith("~"):
        return path
    normal = posixpath.normpath(posixpath.join(cwd, path))
    if normal == WORKSPACE or normal.startswith(WORKSPACE + "/"):
        return None
    return normal
