"""`airlock`: Airlock from a shell. Configured by AIRLOCK_URL and AIRLOCK_API_KEY (or --url and
--api-key). Every command takes --json for output a program can read.

Exit codes: 0 success; 1 the policy's own tests fail (`policy test`, `policy publish`) or the
document differs (`policy diff`); 2 usage or configuration; 3 the server refused the request
(not found, invalid, conflict); 65 the policy document is not valid; 69 the server cannot be
reached or is unavailable; 126 denied by the policy (reason and hint on stderr). `exec` exits
with the command's own code, and above it, as `docker run` does, with 124 when the command timed
out, 125 when Airlock failed (refused, unreachable, the sandbox could not run it), 126 when the
policy denied it, 137 when it was killed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, TextIO

from airlock.client import Airlock
from airlock.errors import AirlockError, ConnectionFailed, Denied, PolicyInvalid, ServerError, Timeout, Unavailable
from airlock.models import CommandResult, Output

EXIT_TESTS_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INVALID_POLICY = 65
EXIT_UNAVAILABLE = 69
EXIT_TIMEOUT = 124
EXIT_AIRLOCK_FAILED = 125  # exec: Airlock's own failure, kept apart from the command's codes
EXIT_DENIED = 126
EXIT_KILLED = 137
EXIT_BROKEN_PIPE = 141


class Styles:
    """ANSI colours on a terminal, unless NO_COLOR is set; plain text elsewhere."""

    def __init__(self, stream: TextIO):
        self.on = stream.isatty() and not os.environ.get("NO_COLOR")

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on and text else text


def _print_json(value: Any) -> None:
    def plain(item: Any) -> Any:
        if is_dataclass(item) and not isinstance(item, type):
            data = asdict(item)
            data.pop("raw", None)
            return data
        raise TypeError(f"{type(item).__name__} is not JSON")

    print(json.dumps(value, default=plain, indent=2))


def _table(rows: list[Sequence[Any]], header: Sequence[str]) -> None:
    cells = [[str(cell) if cell is not None else "" for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


# -- commands ----------------------------------------------------------------------------------

def session_create(client: Airlock, args: argparse.Namespace) -> int:
    session = client.sessions.create(args.conversation, args.policy, repo=args.repo, persist=args.persist,
                                     resume=args.resume)
    if args.json:  # the token too: a program may hand it to the agent that drives the session
        _print_json({**session.info.raw, "token": session.token})
    else:
        print(session.id)
    return 0


def session_list(client: Airlock, args: argparse.Namespace) -> int:
    found = client.sessions.list(state=args.state, conversation_id=args.conversation or "")
    if args.json:
        _print_json([item.raw for item in found])
    else:
        _table([(s.id, s.state, s.conversation_id, f"{s.policy} v{s.policy_version}", s.driver, s.created_at)
                for s in found], ("SESSION", "STATE", "CONVERSATION", "POLICY", "DRIVER", "CREATED"))
    return 0


def session_stop(client: Airlock, args: argparse.Namespace) -> int:
    stop = client.sessions.kill if args.action == "kill" else client.sessions.end
    info = stop(args.session)
    if args.json:
        _print_json(info.raw)
    else:
        print(f"{info.id} {info.state}")
    return 0


def files_put(client: Airlock, args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.buffer.read() if args.local == "-" else Path(args.local).read_bytes()
    except OSError as exc:
        return _usage(f"cannot read {args.local}: {exc.strerror}")
    client.sessions.attach(args.session).files.write(args.remote, data)
    if args.json:
        _print_json({"path": args.remote, "bytes": len(data)})
    return 0


def files_get(client: Airlock, args: argparse.Namespace) -> int:
    data = client.sessions.attach(args.session).files.read(args.remote)
    local = args.local or "-"
    if local == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    target = Path(local)
    if target.is_dir():
        target = target / Path(args.remote).name
    try:
        target.write_bytes(data)
    except OSError as exc:
        return _usage(f"cannot write {target}: {exc.strerror}")
    if args.json:
        _print_json({"path": args.remote, "local": str(target), "bytes": len(data)})
    return 0


def files_list(client: Airlock, args: argparse.Namespace) -> int:
    entries = client.sessions.attach(args.session).files.list(args.path)
    if args.json:
        _print_json(entries)
    else:
        _table([(e.type, e.size if e.size is not None else "-", e.path) for e in entries], ("TYPE", "SIZE", "PATH"))
    return 0


def execute(client: Airlock, args: argparse.Namespace) -> int:
    if not args.argv:
        return _usage("give the command after --, e.g. airlock exec SESSION -- pytest -q")
    session = client.sessions.attach(args.session)
    bin_name, *rest = args.argv
    if args.json:
        result = session.run(bin_name, rest, cwd=args.cwd, timeout_s=args.timeout)
        _print_json({**result.raw, "decision": asdict(result.decision)})
        return _exit_code(result)
    red = Styles(sys.stderr)

    def show(piece: Output) -> None:
        if piece.stream == "stderr":
            sys.stderr.write(red(piece.data, "31"))
            sys.stderr.flush()
        else:
            sys.stdout.write(piece.data)
            sys.stdout.flush()

    result = session.run(bin_name, rest, cwd=args.cwd, timeout_s=args.timeout, on_output=show)
    if result.reason not in {"exited", ""} or result.truncated:
        note = f"airlock: {result.reason}" + (" (output truncated)" if result.truncated else "")
        print(red(note, "33"), file=sys.stderr)
    return _exit_code(result)


def _exit_code(result: CommandResult) -> int:
    if result.exit_code is not None and result.reason == "exited":
        return result.exit_code
    return {"timeout": EXIT_TIMEOUT, "killed": EXIT_KILLED}.get(result.reason, EXIT_AIRLOCK_FAILED)


def denials(client: Airlock, args: argparse.Namespace) -> int:
    summary = client.denials(args.period)
    if args.json:
        _print_json(summary)
        return 0
    print(f"{summary['total']} denials ({summary['mode']}) in the last {args.period}")
    by = summary["by"]
    rows = [(dimension, item["value"] or "-", item["count"]) for dimension in ("reason", "rule", "subject")
            for item in by.get(dimension, [])]
    if rows:
        _table(rows, ("BY", "VALUE", "COUNT"))
    return 0


def policy(client: Airlock, args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return _usage(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}")
    name = args.policy or path.stem
    if args.action == "publish":
        if not args.note:
            return _usage("say why you publish: --note 'what changes and why'")
        try:
            version = client.policies.publish(name, source, note=args.note)
        except PolicyInvalid as exc:
            return _invalid(args, exc)
        except AirlockError as exc:
            if "tests" not in exc.fields:
                raise
            if args.json:
                _print_json({"error": exc.code, "fields": exc.fields})
            for failure in exc.fields["tests"]:
                print(f"FAIL  {failure}", file=sys.stderr)
            return EXIT_TESTS_FAILED
        if args.json:
            _print_json(version)
        else:
            print(f"published {name} v{version['number']} ({version['sha256'][:12]})")
        return 0
    try:
        review = client.policies.review(name, source)
    except PolicyInvalid as exc:
        return _invalid(args, exc)
    if args.json:
        _print_json(review)
    elif args.action == "lint":
        for warning in review["lint"]:
            print(f"{args.file}: warning: {warning['message']}")
        print(f"{args.file}: valid, {len(review['lint'])} warning(s)")
    elif args.action == "test":
        for outcome in review["tests"]:
            request = outcome["request"]
            label = f"test {outcome['index']} {request.get('bin', '')} {' '.join(request.get('args', []))}".rstrip()
            print(f"PASS  {label}" if outcome["passed"]
                  else f"FAIL  {label}: expected {outcome['expected']}, got {outcome['got']}")
        failed = review["tests_failed"]
        print(f"{len(review['tests']) - failed} passed, {failed} failed")
    else:
        colour = Styles(sys.stdout)
        published = review["published"]
        print(f"--- {name} v{published}" if published else f"--- {name} (nothing published)")
        print(f"+++ {args.file}")
        for line in review["diff"]:
            print(colour(line["text"], {"add": "32", "del": "31", "hunk": "36"}.get(line["kind"], "0")))
    if args.action == "test" and review["tests_failed"]:
        return EXIT_TESTS_FAILED
    if args.action == "diff" and review["diff"]:
        return 1  # as diff(1): the document differs from what is published
    return 0


def _invalid(args: argparse.Namespace, exc: PolicyInvalid) -> int:
    if args.json:
        _print_json({"error": exc.code, "detail": exc.detail, "errors": exc.errors})
    for error in exc.errors:
        where = f"{args.file}:{error['line']}" if error.get("line") else args.file
        print(f"{where}: {error.get('path') or 'document'}: {error.get('message')}", file=sys.stderr)
    print(f"{args.file} is not a valid policy", file=sys.stderr)
    return EXIT_INVALID_POLICY


def mcp(client: Airlock, args: argparse.Namespace) -> int:
    try:
        from airlock import mcp_server
    except ImportError as exc:  # the `mcp` extra is not installed
        return _usage(f"`airlock mcp` needs the MCP SDK: pip install 'airlock-sdk[mcp]' ({exc})")
    client.close()
    return mcp_server.serve(url=args.url, api_key=args.api_key, transport=args.transport, host=args.host,
                            port=args.port, policy=args.policy, conversation_id=args.conversation,
                            idle_timeout_s=args.idle_timeout, token=args.token)


# -- the parser ----------------------------------------------------------------------------------

def _usage(message: str) -> int:
    print(f"airlock: {message}", file=sys.stderr)
    return EXIT_USAGE


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    top = argparse.ArgumentParser(prog="airlock", description=__doc__.split("\n\n")[0], parents=[common],
                                  epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    top.add_argument("--url", default=os.environ.get("AIRLOCK_URL"), help="the server (AIRLOCK_URL)")
    top.add_argument("--api-key", default=os.environ.get("AIRLOCK_API_KEY"), help="an API key (AIRLOCK_API_KEY)")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    session = verbs.add_parser("session", help="create, list, end or kill sessions").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = session.add_parser("create", parents=[common], help="open a session; prints its id")
    create.add_argument("--conversation", required=True, help="the agent's conversation id")
    create.add_argument("--policy", help="the policy's name (default: default)")
    create.add_argument("--repo", help="an allowlisted repository to check out into the workspace")
    create.add_argument("--persist", action="store_true", help="keep a snapshot of the workspace when it ends")
    create.add_argument("--resume", help="a snapshot id, or `latest` for the conversation's last")
    create.set_defaults(run=session_create)
    listing = session.add_parser("list", parents=[common], help="the tenant's sessions, newest first")
    listing.add_argument("--state", default="", help="active, or one state (ready, ended, killed, …)")
    listing.add_argument("--conversation", help="only this conversation's")
    listing.set_defaults(run=session_list)
    for action, text in (("end", "end a session"), ("kill", "kill a session and its running command")):
        stop = session.add_parser(action, parents=[common], help=text)
        stop.add_argument("session")
        stop.set_defaults(run=session_stop)

    files = verbs.add_parser("files", help="put, get or list workspace files").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    put = files.add_parser("put", parents=[common], help="upload LOCAL (- for stdin) to REMOTE in the workspace")
    put.add_argument("session")
    put.add_argument("local")
    put.add_argument("remote")
    put.set_defaults(run=files_put)
    get = files.add_parser("get", parents=[common], help="download REMOTE to LOCAL (default: stdout)")
    get.add_argument("session")
    get.add_argument("remote")
    get.add_argument("local", nargs="?")
    get.set_defaults(run=files_get)
    ls = files.add_parser("list", parents=[common], help="the files under PATH (default: the whole workspace)")
    ls.add_argument("session")
    ls.add_argument("path", nargs="?", default=".")
    ls.set_defaults(run=files_list)

    run = verbs.add_parser("exec", parents=[common], help="run a command in a session: exec SESSION -- BIN ARGS…")
    run.add_argument("session")
    run.add_argument("--cwd", help="inside /workspace (default: /workspace)")
    run.add_argument("--timeout", type=int, help="seconds, at most the policy's limits.command_timeout_s")
    run.add_argument("argv", nargs="*", help="the command and its arguments, after --")
    run.set_defaults(run=execute)

    denied = verbs.add_parser("denials", parents=[common], help="what the policy denied, by reason, rule, program")
    denied.add_argument("--period", default="24h", choices=["1h", "24h", "7d", "30d"])
    denied.set_defaults(run=denials)

    policies = verbs.add_parser("policy", help="lint, test, diff or publish a policy document").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    for action, text in (("lint", "check the document: errors at their lines, warnings"),
                         ("test", "run the document's own tests"),
                         ("diff", "what changes against the published version"),
                         ("publish", "save the document as a new version and publish it")):
        command = policies.add_parser(action, parents=[common], help=text)
        command.add_argument("file")
        command.add_argument("--policy", help="the policy's name (default: the file's name without .yaml)")
        if action == "publish":
            command.add_argument("--note", help="why, for the audit log (required)")
        command.set_defaults(run=policy)

    serve = verbs.add_parser("mcp", help="serve Airlock's tools to an MCP client (stdio or streamable HTTP)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="for http")
    serve.add_argument("--port", type=int, default=8765, help="for http")
    serve.add_argument("--policy", help="the policy of the sessions it opens (default: default)")
    serve.add_argument("--conversation", help="the conversation id of its sessions (default: one per MCP session)")
    serve.add_argument("--token", default=os.environ.get("AIRLOCK_MCP_TOKEN"),
                       help="http: the bearer token clients must send (AIRLOCK_MCP_TOKEN; default: a new one, printed)")
    serve.add_argument("--idle-timeout", type=float, default=1800.0, metavar="SECONDS",
                       help="end an Airlock session unused this long (default: 1800)")
    serve.set_defaults(run=mcp)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[words.index("--") + 1:] if "--" in words else None  # exec's: never parsed as options
    args = parser().parse_args(words[:words.index("--")] if command is not None else words)
    args.json = getattr(args, "json", False)
    if command is not None:
        if args.verb != "exec":
            return _usage("`--` is for exec: airlock exec SESSION -- BIN ARGS…")
        args.argv = [*args.argv, *command]
    try:
        client = Airlock(args.url, args.api_key)
    except AirlockError as exc:
        return _usage(exc.detail)
    try:
        with client:
            return args.run(client, args)
    except Denied as exc:
        if args.json:
            _print_json({"error": exc.code, "decision": asdict(exc.decision)})
        by = f"rule `{exc.rule}`" if exc.rule else "default deny (no rule allows it)"
        print(f"airlock: denied ({exc.reason_code}) by {by}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"airlock: hint: {exc.hint}", file=sys.stderr)
        return EXIT_DENIED
    except AirlockError as exc:
        if args.json:
            _print_json({"error": exc.code, "detail": exc.detail, "fields": exc.fields})
        fields = "".join(f"\n  {name}: {problem}" for name, problem in exc.fields.items())
        print(f"airlock: {exc.code}: {exc.detail}{fields}", file=sys.stderr)
        if args.verb == "exec":
            return EXIT_AIRLOCK_FAILED
        unavailable = isinstance(exc, ConnectionFailed | Timeout | Unavailable | ServerError)
        return EXIT_UNAVAILABLE if unavailable else EXIT_REFUSED
    except BrokenPipeError:  # `airlock … | head`: the reader left
        sys.stderr.close()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        if args.verb == "exec":
            print(f"\nairlock: interrupted; the command goes on in session {args.session} "
                  f"(stop it: airlock session kill {args.session})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
