"""The policy document (docs/architecture.md, "Policy document"): its schema, YAML parsing with
errors at their line, and the canonical form whose SHA-256 identifies a version."""

import hashlib
import json
import re
from typing import Literal

import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from policies_app import egress

# The closed set of reason codes (docs/architecture.md, "API").
ReasonCode = Literal[
    "schema_invalid", "bin_not_allowed", "arg_denied", "path_outside_workspace", "egress_denied",
    "limit_exceeded", "session_not_active", "default_deny",
    # Egress guards that hold whatever the policy says (docs/architecture.md, "Egress").
    "egress_ip_literal", "egress_address_denied", "egress_fronting", "egress_not_tls", "egress_control_plane",
    # A resumed snapshot that fails a check (docs/architecture.md, "Persistence"): altered, forged or
    # expired; or valid, but not this tenant's, this conversation's, this policy's or this root filesystem's.
    "provenance_invalid", "provenance_mismatch",
]
BARE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
RULE_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Runtime(Strict):
    driver: Literal["bubblewrap", "docker", "gvisor"] | None = Field(
        None, description="unset: the deployment's default driver (AIRLOCK_RUNTIME)")
    isolation: Literal["standard", "gvisor"] = Field(
        "standard", description="gvisor: run under gVisor (Docker with runsc), whatever the driver says")
    image: str = "airlock/sandbox:bookworm"

    def driver_for(self, default: str) -> str:
        """The driver a session of this policy runs on, given the deployment's default. The
        stronger isolation wins a contradiction (`driver: bubblewrap` with `isolation: gvisor`)."""
        if self.isolation == "gvisor":
            return "gvisor"
        return self.driver or default


class Limits(Strict):
    cpus: StrictFloat = Field(1.0, ge=0.01, le=16, description="CPUs a session's sandbox may use (0.01-16)")
    memory_mb: StrictInt = Field(512, ge=32, le=65536, description="memory of a session's sandbox; past it, `oom`")
    pids: StrictInt = Field(128, ge=8, le=4096, description="processes and threads a sandbox may hold at once")
    disk_mb: StrictInt = Field(256, ge=1, le=65536, description="size of the session's /workspace")
    command_timeout_s: StrictInt = Field(15, ge=1, le=3600,
                                         description="seconds a command may run before it ends `timeout` (a "
                                                     "request may ask for less)")
    session_ttl_s: StrictInt = Field(1800, ge=60, le=7 * 86400,
                                     description="seconds a session lives before it `expired`")
    output_tail_chars: StrictInt = Field(8000, ge=100, le=1_000_000,
                                         description="the characters of a command's output that are stored (its last)")
    # A command that writes more (stdout and stderr together) is killed, ending `output_limit`.
    output_mb: StrictInt = Field(16, ge=1, le=1024, description="output a command may write (stdout and stderr "
                           "together) before it ends `output_limit`")


def _check_patterns(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return patterns


class CommandRule(Strict):
    id: str = Field(pattern=RULE_ID)
    bin: str = Field(description="a bare program name found on the sandbox's PATH, never a path")
    prepend_args: list[str] = Field(default_factory=list, description="put before the agent's arguments")
    deny_args: list[str] = Field(default_factory=list, description="regexes; an argument matching any is denied")
    allow_args: list[str] | None = Field(
        None, description="regexes; when set, every argument must fully match one of them"
    )
    max_args: StrictInt | None = Field(None, ge=0, le=1000)
    exact_args: list[str] | None = Field(
        None, max_length=1000, description="when set, the arguments must be exactly these, in this order")
    expires: AwareDatetime | None = Field(
        None, description="when set, the rule allows nothing from this instant on (ISO 8601 with a time zone)")

    @field_validator("bin")
    @classmethod
    def _bare_name(cls, value: str) -> str:
        if not re.fullmatch(BARE_NAME, value):
            raise ValueError(f"{value!r} must be a bare program name such as 'pytest', never a path")
        return value

    @field_validator("deny_args", "allow_args")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        return _check_patterns(value) if value else value


class Filesystem(Strict):
    workspace: Literal["/workspace"] = "/workspace"
    arg_paths: Literal["workspace_only", "any"] = "workspace_only"


class Network(Strict):
    egress: Literal["none", "allowlist"] = "none"
    allow: list[str] = Field(default_factory=list, max_length=256,
                             description="host:port or *.suffix:port entries reachable through the proxy")
    max_bytes: StrictInt | None = Field(None, ge=1, description="bytes a session may move through its proxy, both ways")
    max_connections: StrictInt | None = Field(None, ge=1, le=256,
                                        description="connections a session may hold open through its proxy at once")

    @field_validator("allow")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                egress.parse_entry(item)
            except egress.InvalidEntry as exc:
                raise ValueError(str(exc)) from None
        return value


class Persistence(Strict):
    """Checkpoints of a session's workspace and artifacts it packs (off unless enabled)."""

    enabled: StrictBool = False
    retention_days: StrictInt = Field(7, ge=1, le=3650, description="snapshots and artifacts are deleted after this")
    max_mb: StrictInt = Field(256, ge=1, le=4096, description="the most a snapshot or artifact may hold, unpacked")
    resume_same_policy: StrictBool = Field(False, description="resume only snapshots made under this policy's name")
    resume_same_rootfs: StrictBool = Field(False, description="resume only snapshots made on the root filesystem the "
                                     "new session runs")


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Variables that change how programs load code; a policy may not set or pass them.
LOADER_VARIABLES = re.compile(r"LD_.*|GCONV_PATH|PYTHONSTARTUP|PYTHONPATH|PERL5OPT|NODE_OPTIONS|BASH_ENV|ENV")


def _check_env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if LOADER_VARIABLES.fullmatch(name):
        raise ValueError(f"{name!r} changes how programs load code and may not be set")
    return name


class Env(Strict):
    pass_: list[str] = Field(default_factory=list, alias="pass", description="names passed from the session")
    set: dict[str, str] = Field(default_factory=dict)

    @field_validator("pass_")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        return [_check_env_name(name) for name in value]

    @field_validator("set")
    @classmethod
    def _values(cls, value: dict[str, str]) -> dict[str, str]:
        for name, item in value.items():
            _check_env_name(name)
            if "\0" in item:
                raise ValueError(f"the value of {name} holds a NUL byte")
        return value


class ExecRequest(Strict):
    bin: str = Field(max_length=255)
    args: list[str] = Field(default_factory=list, max_length=1000)
    cwd: str = Field("/workspace", max_length=4096)
    timeout_s: StrictInt | None = Field(None, ge=1)

    @field_validator("bin", "cwd", "args")
    @classmethod
    def _no_nul(cls, value):
        for item in value if isinstance(value, list) else [value]:
            if "\0" in item:
                raise ValueError("NUL bytes are not allowed")
        return value


class EgressRequest(Strict):
    """An outbound connection a sandboxed command asks the egress proxy for."""

    host: str = Field(min_length=1, max_length=253, pattern=r"^([A-Za-z0-9.-]+|[0-9A-Fa-f:.]+)$")  # a name, or IPv6
    port: StrictInt = Field(ge=1, le=65535)


class Expectation(Strict):
    allowed: StrictBool
    reason_code: ReasonCode | None = None
    rule_id: str | None = None


class PolicyTest(Strict):
    request: ExecRequest
    expect: Expectation


class PolicyDocument(Strict):
    mode: Literal["enforce", "audit"] = Field(
        "enforce", description="audit: what the rules deny runs anyway and is recorded as `audit_deny`")
    runtime: Runtime = Field(default_factory=Runtime, description="which sandbox driver runs the sessions")
    limits: Limits = Field(default_factory=Limits, description="what each session may use")
    commands: list[CommandRule] = Field(default_factory=list,
                                        description="the programs that may run (default deny), one rule each")
    filesystem: Filesystem = Field(default_factory=Filesystem)
    network: Network = Field(default_factory=Network, description="egress through the session's proxy")
    env: Env = Field(default_factory=Env, description="the commands' environment: names passed and values set")
    persistence: Persistence = Field(default_factory=Persistence, description="snapshots and artifacts")
    tests: list[PolicyTest] = Field(default_factory=list,
                                    description="requests and the verdict each must get; publishing runs them")

    @model_validator(mode="after")
    def _unique_rule_ids(self) -> "PolicyDocument":
        seen = set()
        for rule in self.commands:
            if rule.id in seen:
                raise ValueError(f"command rule id {rule.id!r} is used twice")
            seen.add(rule.id)
        return self

    def canonical(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


class DocumentError(Exception):
    """The document is not valid: `errors` lists {path, message, line} with the field path
    (`commands.0.deny_args.1`) and, for YAML, the 1-based line it points at."""

    def __init__(self, errors: list[dict]):
        super().__init__("; ".join(f"{e['path'] or '(document)'}: {e['message']}" for e in errors))
        self.errors = errors


def parse_yaml(source: str) -> PolicyDocument:
    try:
        node = yaml.compose(source, Loader=yaml.SafeLoader)
        data = yaml.safe_load(source)
    except RecursionError:
        raise DocumentError([{"path": "", "message": "the document is nested too deeply", "line": None}]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise DocumentError([{"path": "", "message": f"not valid YAML: {getattr(exc, 'problem', exc)}",
                              "line": line}]) from None
    return _validate(data if data is not None else {}, node)


def parse_data(data) -> PolicyDocument:
    return _validate(data, None)


def _validate(data, node) -> PolicyDocument:
    if not isinstance(data, dict):
        raise DocumentError([{"path": "", "message": "a policy is a mapping (mode, limits, commands, …)",
                              "line": 1 if node is not None else None}])
    try:
        return PolicyDocument.model_validate(data)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            location = [part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
            errors.append({
                "path": ".".join(str(part) for part in location),
                "message": error["msg"].removeprefix("Value error, "),
                "line": _line_of(node, location),
            })
        raise DocumentError(errors) from None


def lines_of(source: str):
    """A function from a location (keys and list indexes) to its line in `source`, as errors name
    it; the source is parsed once, however many locations are asked for."""
    try:
        node = yaml.compose(source, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        node = None
    return lambda location: _line_of(node, location)


def _line_of(node, location: list) -> int | None:
    """The line of the deepest YAML node on the path that exists (a missing key: its parent)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in location:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == part:
                    child, line = value, key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def json_schema() -> dict:
    return PolicyDocument.model_json_schema(by_alias=True)
