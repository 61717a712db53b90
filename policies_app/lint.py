"""Lint: rules that let an agent run arbitrary code. Warnings, shown in the editor; the
security admin decides. A rule is flagged when it allows an interpreter or wrapper without
argument rules that close its code-running flags."""

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from policies_app.document import CommandRule, PolicyDocument

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox"}
# Programs that run another program named in their arguments.
WRAPPERS = {"env", "xargs", "nohup", "timeout", "nice", "ionice", "setsid", "stdbuf", "time", "sudo", "su", "doas",
            "strace", "chroot", "flock", "watch", "parallel", "npx"}
# Interpreters and tools whose flags run code given inline: bin -> the flags that do it.
INLINE_CODE = {
    "python": ["-c"], "python3": ["-c"], "node": ["-e", "--eval", "-p", "--print"], "perl": ["-e", "-E"],
    "ruby": ["-e"], "php": ["-r"], "lua": ["-e"], "awk": ["system"], "gawk": ["system"],
    "find": ["-exec", "-execdir", "-ok", "-okdir"], "git": ["-c", "--exec-path", "--upload-pack"],
    "npm": ["exec", "x"], "make": ["--eval", "-f", "SHELL="], "tar": ["--to-command", "--checkpoint-action"],
    "ssh": ["-o"], "rsync": ["-e", "--rsh"], "vim": ["-c"], "sed": ["e"],
}

# Where the code-running token is a subcommand, fixing the subcommand in prepend_args closes it.
SUBCOMMAND_BINS = {"npm"}


@dataclass(frozen=True)
class LintWarning:
    rule_id: str
    message: str


def lint(document: PolicyDocument) -> list[LintWarning]:
    warnings = []
    now = datetime.now(UTC)
    for rule in document.commands:
        if (warning := _lint_rule(rule)) is not None:
            warnings.append(warning)
        if rule.expires is not None and rule.expires <= now:
            expired = f"{rule.expires.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
            warnings.append(LintWarning(rule.id, f"rule `{rule.id}` expired at {expired}: it allows nothing"))
    if document.network.egress == "allowlist":
        warnings.append(LintWarning("network", "egress `allowlist` is not enforced yet: sandboxes have no network "
                                               "at all until the egress proxy ships"))
    return warnings


def _lint_rule(rule: CommandRule) -> LintWarning | None:
    if rule.bin in SHELLS:
        return LintWarning(rule.id, f"rule `{rule.id}` allows the shell `{rule.bin}`: it can run arbitrary code")
    # Listed arguments (allow_args) or one exact argv (exact_args) bound what the rule can run.
    restricted = rule.allow_args is not None or rule.exact_args is not None
    if rule.bin in WRAPPERS and not restricted:
        return LintWarning(rule.id, f"rule `{rule.id}` allows `{rule.bin}`, which runs any program named in its "
                                f"arguments; add allow_args")
    flags = INLINE_CODE.get(rule.bin)
    if flags is None or restricted or (rule.bin in SUBCOMMAND_BINS and rule.prepend_args):
        return None
    open_flags = [flag for flag in flags if not _denied(rule, flag)]
    if open_flags:
        shown = ", ".join(f"`{flag}`" for flag in open_flags)
        return LintWarning(rule.id, f"rule `{rule.id}` allows `{rule.bin}` with {shown} open: it can run arbitrary "
                                f"code; deny them with deny_args or list allow_args")
    return None


def _denied(rule: CommandRule, flag: str) -> bool:
    """Closed only when every spelling of the flag is denied: `-c`, `-cCODE`, `-Ic` (combined
    short flags), `--eval=CODE`."""
    spellings = [flag]
    if re.fullmatch(r"-[A-Za-z]", flag):
        spellings += [flag + "x", "-I" + flag[1:]]
    elif flag.startswith("--"):
        spellings.append(flag + "=x")
    return all(any(re.search(pattern, spelling) for pattern in rule.deny_args) for spelling in spellings)
