"""Lint: rules that let an agent run arbitrary code. Warnings, shown in the editor; the
security admin decides. A rule is flagged when it allows an interpreter or wrapper without
argument rules that close its code-running flags.

The engine asks the same tables (`runs_any_code`, `inline_code_flag`, `closing_deny_args`)
before it words a hint, so a denial never suggests granting what lint would flag."""

import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

from policies_app import egress
from policies_app.document import CommandRule, PolicyDocument

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox", "ash", "csh", "tcsh", "mksh", "rbash", "yash", "pwsh"}
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

# Interpreters: the code an agent would give inline can be a workspace file instead.
INTERPRETERS = {"python", "python3", "node", "perl", "ruby", "php", "lua"}

# Where the code-running token is a subcommand, fixing the subcommand in prepend_args closes it.
SUBCOMMAND_BINS = {"npm"}


# A wrapper's own arguments before the program it runs: options that take a value, and how many
# positional arguments come first (timeout's duration, flock's lock file, chroot's new root).
# A wrapper not listed here is not parsed: its hint names no program.
WRAPPER_SYNTAX = {
    "env": (set(), 0), "nohup": (set(), 0), "setsid": (set(), 0), "time": (set(), 0),
    "nice": ({"-n", "--adjustment"}, 0), "ionice": ({"-c", "-n", "--class", "--classdata"}, 0),
    "stdbuf": ({"-i", "-o", "-e"}, 0), "timeout": ({"-s", "-k", "--signal", "--kill-after"}, 1),
    "flock": ({"-w", "-E", "--timeout", "--conflict-exit-code"}, 1), "chroot": ({"--userspec", "--groups"}, 1),
}


def program(bin_name: str) -> str:
    """The name lint knows a program by: `python3.11` is `python3`, `perl5.36` is `perl`."""
    if bin_name in SHELLS or bin_name in WRAPPERS or bin_name in INLINE_CODE:
        return bin_name
    base = re.sub(r"[0-9][0-9.]*$", "", bin_name)
    return base if base in INLINE_CODE or base in SHELLS else bin_name


def runs_any_code(bin_name: str) -> str | None:
    """Why a rule for this program, without argument rules, would run arbitrary code, or None."""
    named, bin_name = bin_name, program(bin_name)
    if bin_name in SHELLS:
        return f"`{bin_name}` is a shell"
    if bin_name in WRAPPERS:
        return f"`{bin_name}` runs any program named in its arguments"
    if bin_name in INLINE_CODE:
        return f"`{named}` runs code given through {', '.join(f'`{flag}`' for flag in INLINE_CODE[bin_name])}"
    return None


def closing_deny_args(bin_name: str) -> list[str] | None:
    """deny_args that close every spelling of the program's code-running flags, checked by this
    very lint; None where no deny pattern can (awk's `system`, npm's `exec`: allow_args can)."""
    flags = INLINE_CODE.get(program(bin_name), [])
    if not flags or not all(flag.startswith("-") for flag in flags):
        return None
    patterns = [f"^-[A-Za-z]*{flag[1]}" if re.fullmatch(r"-[A-Za-z]", flag) else f"^{flag}" for flag in flags]
    return patterns if _lint_rule(CommandRule(id="suggested", bin=bin_name, deny_args=patterns)) is None else None


def inline_code_flag(bin_name: str, args: list[str] | tuple[str, ...]) -> str | None:
    """The first argument that makes `bin_name` run code given inline (`-c`, `-cCODE`,
    `--eval=CODE`, npm's `exec`), or None."""
    for arg in args:
        for flag in INLINE_CODE.get(program(bin_name), ()):
            # A short flag counts combined after other letters (`-Ic`), as closing_deny_args denies it.
            if arg == flag or (flag.startswith("--") and arg.startswith(flag + "=")) or (
                    re.fullmatch(r"-[A-Za-z]", flag) and re.match(rf"-[A-Za-z]*{flag[1]}", arg)):
                return arg
    return None


def argv_instead(bin_name: str, args: list[str] | tuple[str, ...]) -> list[str] | None:
    """The program a shell's `-c` script or a wrapper would run, as argv, when that is plain:
    `bash -c "cat /etc/passwd"` → ["cat", "/etc/passwd"]. None when it is not (pipes,
    redirections, variables, several commands)."""
    bin_name = program(bin_name)
    if bin_name in SHELLS and len(args) == 2 and re.fullmatch(r"-[a-z]*c[a-z]*", args[0]):
        if re.search(r"[|&;<>()$`\\*?\[\]{}!#~\n]", args[1]):
            return None
        try:
            argv = shlex.split(args[1])
        except ValueError:
            return None
        return argv or None
    if bin_name not in WRAPPER_SYNTAX:
        return None
    valued, positional = WRAPPER_SYNTAX[bin_name]
    rest = list(args)
    while rest and (rest[0].startswith("-") or (bin_name == "env" and "=" in rest[0])):
        option = rest.pop(0)
        if option == "--":
            break
        if option in valued and rest:
            rest.pop(0)
    rest = rest[positional:]
    return rest or None


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
    if document.runtime.driver == "bubblewrap" and document.runtime.isolation == "gvisor":
        warnings.append(LintWarning("runtime", "runtime names the bubblewrap driver with isolation gvisor: sessions "
                                               "run under gVisor (the stronger isolation wins)"))
    warnings += unreachable_entries(document)
    for entry in document.network.allow if document.network.egress == "allowlist" else ():
        _wildcard, host, _port = egress.parsed_or_none(entry) or (False, "", 0)
        if any(host == code or host.endswith("." + code) or code.endswith("." + host) for code in egress.CODE_HOSTS):
            warnings.append(LintWarning("network", f"`{entry}` is a code host: allowing it to fetch also allows "
                                                   "pushing to it, so code or data can leave through it"))
        if shared := egress.shared_wildcard(entry):
            warnings.append(LintWarning("network", f"`{entry}` admits names anyone can create under {shared} "
                                                   "(buckets, functions, pages): data can leave through a stranger's "
                                                   "host; list the exact hosts instead"))
    if document.network.egress == "allowlist" and not document.network.allow:
        warnings.append(LintWarning("network", "egress is an allowlist with no entries: every connection is refused "
                                               "(each one a recorded denial)"))
    return warnings


def unreachable_entries(document: PolicyDocument) -> list[LintWarning]:
    """Allow entries naming an address in the deny set: flagged here, refused at publish."""
    return [LintWarning("network", reason + "; publishing refuses it") for entry in document.network.allow
            if (reason := egress.unreachable_entry(entry))]


def _lint_rule(rule: CommandRule) -> LintWarning | None:
    known = program(rule.bin)
    if known in SHELLS:
        return LintWarning(rule.id, f"rule `{rule.id}` allows the shell `{rule.bin}`: it can run arbitrary code")
    # Listed arguments (allow_args) or one exact argv (exact_args) bound what the rule can run.
    restricted = rule.allow_args is not None or rule.exact_args is not None
    if known in WRAPPERS and not restricted:
        return LintWarning(rule.id, f"rule `{rule.id}` allows `{rule.bin}`, which runs any program named in its "
                                f"arguments; add allow_args")
    flags = INLINE_CODE.get(known)
    if flags is None or restricted or (known in SUBCOMMAND_BINS and rule.prepend_args):
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
