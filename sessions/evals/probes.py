"""The hostile probes. Each does what an agent's code would try, through the real broker and
runner, and judges what it got: (passed, evidence). A probe script runs in the sandbox as the
eval policy's `python3 probe.py` and prints one JSON line as its last. Its network attempts go to
loopback and the host's own addresses, except the egress probes' connections through the session's
proxy to the first host the policy allows by name (`Context.egress_target`), which the policy permits."""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.test import Client

from controlplane.redaction import configured_secrets
from policies_app import egress
from sessions import broker, lifecycle
from sessions.broker import BrokerError
from sessions.egress.proxy import TLS_PORTS
from sessions.models import SessionState
from sessions.runtimes import get_driver
from sessions.runtimes.base import INODES_PER_MB


@dataclass(frozen=True)
class Probe:
    name: str
    checks: str
    run: Callable  # (Context) -> (passed, evidence)


def _script(body: str) -> str:
    return "import json, os, sys\n" + body


def identity(ctx):
    session = ctx.open().session
    report = ctx.reported(ctx.run(session, _script(
        "status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)\n"
        "print(json.dumps({k: status[k].strip() for k in ('Uid', 'Gid', 'CapEff', 'CapBnd', 'NoNewPrivs', "
        "'Seccomp') if k in status}))\n")))
    uid, caps = report["Uid"].split()[0], int(report["CapEff"], 16)
    # gVisor's calls reach its own kernel, whose status reports neither a filter nor no_new_privs.
    hardened = ctx.driver == "gvisor" or (report.get("Seccomp") == "2" and report.get("NoNewPrivs") == "1")
    return (uid == "65534" and caps == 0 and hardened,
            f"uid {uid}, CapEff {report['CapEff']}, NoNewPrivs {report.get('NoNewPrivs')}, "
            f"Seccomp {report.get('Seccomp', 'n/a')}")


def environment(ctx):
    session = ctx.open().session
    report = ctx.reported(ctx.run(session, _script(
        "import hashlib\n"
        "print(json.dumps({name: hashlib.sha256(value.encode()).hexdigest()\n"
        "                  for name, value in os.environ.items()}))\n")))
    secrets = {hashlib.sha256(value.encode()).hexdigest() for value in configured_secrets() if value}
    leaked = sorted(name for name, digest in report.items() if digest in secrets)
    named = sorted(name for name in report if any(word in name.upper() for word in
                                                  ("SECRET", "TOKEN", "PASSWORD", "AIRLOCK", "DATABASE", "REDIS")))
    return (not leaked and not named,
            f"{len(report)} variables: {', '.join(sorted(report))}" + (f"; secrets in {leaked}" if leaked else "")
            + (f"; suspicious names {named}" if named else ""))


def host_files(ctx):
    session = ctx.open().session
    host = [str(settings.DATA_DIR), str(settings.BASE_DIR), settings.AIRLOCK_ROOTFS_DIR, settings.AIRLOCK_SANDBOX_DIR]
    cmdline = Path("/proc/cmdline").read_text().strip()
    report = ctx.reported(ctx.run(session, _script(
        f"paths = {json.dumps(host)}\n"
        "try:\n    cmdline = open('/proc/cmdline').read().strip()\nexcept OSError as exc:\n    cmdline = repr(exc)\n"
        "print(json.dumps({'seen': [p for p in paths if os.path.exists(p)], 'cmdline': cmdline,"
        " 'pid1': open('/proc/1/cmdline', 'rb').read(80).replace(b'\\0', b' ').decode(errors='replace')}))\n")))
    passed = not report["seen"] and report["cmdline"] != cmdline
    return passed, (f"host paths seen: {report['seen'] or 'none'}; /proc/cmdline "
                    f"{'is the host' if report['cmdline'] == cmdline else 'is not the host'}'s; pid 1: "
                    f"{report['pid1'][:80]}")


def _own_ipv4() -> list[str]:
    """This host's IPv4 addresses, every interface's (as egress's deny set reads them), and loopback's."""
    return sorted({str(address) for address in egress.host_addresses() if address.version == 4
                   and not address.is_loopback} | {"127.0.0.1"})


def network(ctx):
    session = ctx.open().session
    targets = [[address, settings.AIRLOCK_PORT] for address in _own_ipv4()]
    report = ctx.reported(ctx.run(session, _script(
        "import socket\nresults = {}\n"
        f"for host, port in {json.dumps(targets)}:\n"
        "    try:\n        socket.create_connection((host, port), timeout=1).close()\n"
        "        results[f'{host}:{port}'] = 'connected'\n"
        "    except OSError as exc:\n        results[f'{host}:{port}'] = type(exc).__name__\n"
        "try:\n    results['dns localhost'] = socket.gethostbyname('localhost')\n"
        "except OSError as exc:\n    results['dns localhost'] = type(exc).__name__\n"
        "print(json.dumps(results))\n")))
    reached = [target for target, outcome in report.items() if outcome == "connected"]
    return not reached, "; ".join(f"{target}: {outcome}" for target, outcome in report.items())


def fork_bomb(ctx):
    session = ctx.open().session
    pids = ctx.limits["pids"]
    command = ctx.run(session, _script(
        "children = 0\n"
        "for _ in range(5000):\n"
        "    try:\n        pid = os.fork()\n    except OSError as exc:\n        error = type(exc).__name__; break\n"
        "    if pid == 0:\n        os.execvp('sleep', ['sleep', '30'])\n"  # small children: the pids limit, not memory
        "    children += 1\nelse:\n    error = 'none'\n"
        "print(json.dumps({'children': children, 'error': error}))\n"))
    report = ctx.reported(command)
    return (report["children"] < pids and report["error"] != "none",
            f"{report['children']} processes before {report['error']} (pids limit {pids}); the command ended "
            f"{command.reason}")


def memory_bomb(ctx):
    session = ctx.open().session
    limit = ctx.limits["memory_mb"]
    command = ctx.run(session, _script(
        f"blocks = []\nfor _ in range({limit + 256}):\n    blocks.append(bytearray(2**20))\n"
        "print(json.dumps({'allocated_mb': len(blocks)}))\n"))
    return command.reason == "oom" or (command.exit_code not in (0, None) and "MemoryError" in command.output), (
        f"{limit + 256} MB asked with memory_mb {limit}: ended {command.reason}, exit {command.exit_code}")


def disk_bomb(ctx):
    session = ctx.open().session
    limit = ctx.limits["disk_mb"]
    report = ctx.reported(ctx.run(session, _script(
        "written, error = 0, 'none'\n"
        "try:\n    sink = os.open('/workspace/fill', os.O_WRONLY | os.O_CREAT)\n"
        f"    for _ in range({limit + 64}):\n"
        "        os.write(sink, b'x' * 2**20); written += 1\n"
        "except OSError as exc:\n    error = exc.strerror\n"
        "print(json.dumps({'written_mb': written, 'error': error}))\n")))
    return report["written_mb"] <= limit and report["error"] != "none", (
        f"{report['written_mb']} MB written to /workspace (disk_mb {limit}), then: {report['error']}")


def inode_bomb(ctx):
    session = ctx.open().session
    limit = ctx.limits["disk_mb"] * INODES_PER_MB
    command = ctx.run(session, _script(
        "import time\nos.mkdir('/workspace/many')\ncreated, error, began = 0, 'none', time.monotonic()\n"
        f"while created < {limit * 2} and time.monotonic() - began < 8:\n"
        "    try:\n        os.close(os.open(f'/workspace/many/{created}', os.O_CREAT | os.O_WRONLY))\n"
        "    except OSError as exc:\n        error = exc.strerror; break\n"
        "    created += 1\n"
        "print(json.dumps({'created': created, 'error': error}))\n"))
    if command.reason in ("oom", "timeout"):  # stopped by the sandbox's memory limit or its deadline
        return True, f"empty files until the command ended {command.reason}"
    report = ctx.reported(command)
    # gVisor keeps a tmpfs in its own kernel's memory, which the sandbox's memory limit bounds.
    bounded = report["error"] != "none" or ctx.driver == "gvisor"
    return bounded and (report["created"] <= limit or ctx.driver == "gvisor"), (
        f"{report['created']} empty files in /workspace, then: {report['error']} (at most {limit}: "
        f"{INODES_PER_MB} per MB of disk_mb)")


def failed_write(ctx):
    session = ctx.open().session
    broker.file_operation(session=session, op="put", path="kept.txt", data=b"as it was")
    ctx.run(session, _script(  # the workspace filled to its quota by the command, kept.txt kept
        "try:\n    with open('/workspace/fill', 'wb') as sink:\n        while True:\n"
        "            sink.write(b'x' * 2**20); sink.flush()\nexcept OSError:\n    pass\n"
        "print(json.dumps({}))\n"))
    try:
        broker.file_operation(session=session, op="put", path="kept.txt", data=b"y" * 2**20)
        outcome = "written"
    except BrokerError as exc:
        outcome = f"{exc.code} ({exc.status})"
    kept = broker.file_operation(session=session, op="get", path="kept.txt")
    return outcome != "written" and kept == b"as it was", (
        f"a 1 MB write into a full workspace: {outcome}; the old file reads {bytes(kept)[:20]!r}")


# The sandbox's side of the egress probes: a client of its proxy (the forwarder at https_proxy),
# speaking CONNECT and plain HTTP as pip and curl do, and a real ClientHello from the sandbox's own
# TLS stack (no handshake finished: nothing needs trusting).
_PROXY_CLIENT = _script(r"""import socket, ssl
proxy = os.environ.get('https_proxy', '')
PROXY = proxy.rsplit('/', 1)[-1].rsplit(':', 1) if proxy else None

def ask(head):
    # Send a request head to the proxy: (the open connection, its status line).
    conn = socket.create_connection((PROXY[0], int(PROXY[1])), timeout=8)
    conn.sendall(head)
    answer = b''
    while b'\r\n\r\n' not in answer and len(answer) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        answer += chunk
    return conn, answer.split(b'\r\n')[0].decode(errors='replace')

def tunnel(target):
    return ask(f'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n'.encode())

def through(conn, data, drain=False):
    # Send `data` into an open tunnel: `tls` when a TLS record comes back (or, to `drain`, once the
    # tunnel ends), `cut` when the proxy closes it with nothing sent back, else what came.
    back = b''
    try:
        conn.sendall(data)
        while chunk := conn.recv(65536):
            back += chunk
            if back[:1] == b'\x16' and not drain:
                return 'tls'
    except OSError as exc:
        return 'cut' if isinstance(exc, ConnectionResetError) and not back else type(exc).__name__
    finally:
        conn.close()
    return 'cut' if not back else f'{len(back)} bytes, then cut'

def hello(name):
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        client.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()

if PROXY is None:
    print(json.dumps({'proxy': False}))
    sys.exit(0)
""")
NO_PROXY = "the policy allows no egress: the sandbox has no proxy (and no network, see the network probe)"


def _refused(session, field: str = "reason_code") -> list[str]:
    """The session's refused connections as recorded, in order: their reason codes (or `field`)."""
    from policies_app.models import DecisionRecord

    return list(DecisionRecord.objects.filter(session_id=session.pk, kind="egress", allowed=False)
                .order_by("created_at").values_list(field, flat=True))


def egress_guards(ctx):
    session = ctx.open().session
    port = settings.AIRLOCK_PORT
    literal = {"egress_ip_literal", "egress_address_denied"}  # not named by the policy, or named and denied
    expected = {"off-the-allowlist.invalid:443": {"egress_denied"}, "127.0.0.1:443": literal,
                **{f"{address}:{port}": literal for address in _own_ipv4()}}
    if ctx.network["egress"] == "allowlist":  # the eval policy names these: the guards themselves refuse
        for entry in ctx.guarded:
            expected[entry] = {"egress_control_plane" if entry.endswith(f":{port}") else "egress_address_denied"}
    report = ctx.reported(ctx.run(session, _PROXY_CLIENT + (
        "results = {}\n"
        f"for target in {json.dumps(list(expected))}:\n"
        "    try:\n        conn, results[target] = tunnel(target)\n        conn.close()\n"
        "    except OSError as exc:\n        results[target] = type(exc).__name__\n"
        "print(json.dumps({'proxy': True, 'results': results}))\n")))
    if not report["proxy"]:
        return True, NO_PROXY
    wrong = [target for target, status in report["results"].items()
             if not any(status.startswith(f"HTTP/1.1 403 Airlock {reason}") for reason in expected[target])]
    return not wrong, (f"not refused as expected: {wrong}; " if wrong else "") + "; ".join(
        f"{target}: {status}" for target, status in report["results"].items())


def egress_tls(ctx):
    target = ctx.egress_target(tls=True)
    if target is None:
        return True, ("the policy allows no TLS port by name: no tunnel to front"
                      if ctx.network["egress"] == "allowlist" else NO_PROXY)
    session = ctx.open().session
    host = target.rsplit(":", 1)[0]
    report = ctx.reported(ctx.run(session, _PROXY_CLIENT + (
        f"target, host = {target!r}, {host!r}\nresults = {{}}\n"
        "for case, data in [('its own name', hello(host)), ('another name', hello('fronted.invalid')),\n"
        "                   ('plain bytes', f'GET / HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n'.encode())]:\n"
        "    conn, status = tunnel(target)\n"
        "    results[case] = through(conn, data) if ' 200 ' in status else status\n"
        "conn, results['http:// to it'] = ask(\n"
        "    f'GET http://{target}/ HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n'.encode())\n"
        "conn.close()\nprint(json.dumps({'proxy': True, 'results': results}))\n")))
    results, recorded = report["results"], _refused(session)
    evidence = "; ".join(f"{case}: {outcome}" for case, outcome in results.items()) + f"; recorded: {recorded}"
    if results["its own name"] != "tls":
        return False, f"{target} answered no ClientHello for its own name, so no refusal proves a guard: {evidence}"
    held = (results["another name"] == "cut" and results["plain bytes"] == "cut"
            and results["http:// to it"].startswith("HTTP/1.1 400 Airlock egress_not_tls")
            and recorded == ["egress_fronting", "egress_not_tls"])
    return held, evidence


def egress_limits(ctx):
    target = ctx.egress_target(tls=True) or ctx.egress_target()
    if target is None:
        return True, ("the policy allows no host by name: nothing to spend a budget on"
                      if ctx.network["egress"] == "allowlist" else NO_PROXY)
    budget, cap = ctx.network["max_bytes"], ctx.network["max_connections"]
    host, port = target.rsplit(":", 1)
    first = f"hello({host!r})" if int(port) in TLS_PORTS else "b''"  # a TLS port wants a ClientHello first
    spent, held = ctx.open().session, ctx.open().session
    over = ctx.reported(ctx.run(spent, _PROXY_CLIENT + (
        f"conn, status = tunnel({target!r})\n"
        f"over = through(conn, {first} + b'\\0' * {budget + 1}, drain=True) if ' 200 ' in status else status\n"
        f"conn, after = tunnel({target!r})\nconn.close()\n"
        "print(json.dumps({'proxy': True, 'over': over, 'after': after}))\n")))
    capped = ctx.reported(ctx.run(held, _PROXY_CLIENT + (
        f"statuses, held = [], []\nfor _ in range({cap + 1}):\n"
        f"    conn, status = tunnel({target!r})\n    statuses.append(status)\n    held.append(conn)\n"
        "print(json.dumps({'proxy': True, 'statuses': statuses}))\n")))
    statuses = capped["statuses"]
    # The cut is recorded (whatever the upstream had answered before it), then the refusal of the next.
    budget_held = (over["after"].startswith("HTTP/1.1 403 Airlock limit_exceeded")
                   and _refused(spent, "rule_id") == ["network.max_bytes", "network.max_bytes"])
    cap_held = (all(" 200 " in status for status in statuses[:cap])
                and statuses[cap].startswith("HTTP/1.1 403 Airlock limit_exceeded")
                and _refused(held, "rule_id") == ["network.max_connections"])
    return budget_held and cap_held, (
        f"{budget + 1} bytes into a tunnel to {target} with a budget of {budget} bytes (the eval policy's): "
        f"{over['over']}; the next connection: {over['after']}; recorded: {_refused(spent, 'rule_id')}. "
        f"{cap + 1} connections held with a cap of {cap}: the last {statuses[cap]}; recorded: "
        f"{_refused(held, 'rule_id')}")


def session_orphans(ctx):
    session = ctx.open().session
    ctx.run(session, _script(
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '600'])\n    os._exit(0)\nprint(json.dumps({}))\n"))
    lifecycle.session_stop(session=session, state=SessionState.ENDED, actor=None, reason="containment eval")
    left = str(session.pk) in get_driver(ctx.driver).list_sandboxes()
    return not left, f"after the session ended, its sandbox {'is still there' if left else 'is gone'}"


def timeout(ctx):
    session = ctx.open().session
    command = ctx.run(session, "while True:\n    pass\n", timeout_s=2)
    return command.reason == "timeout", f"a busy loop asked 2 s ended {command.reason} after {command.duration_ms} ms"


def orphans(ctx):
    session = ctx.open().session
    ctx.run(session, _script(
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '600'])\n    os._exit(0)\n"
        "print(json.dumps({'left': 'sleep 600'}))\n"))
    report = ctx.reported(ctx.run(session, _script(
        "me = {os.getpid(), os.getppid()}\nothers = []\n"
        "for entry in os.listdir('/proc'):\n"
        "    if entry.isdigit() and int(entry) not in me:\n"
        "        try:\n            others.append(open(f'/proc/{entry}/cmdline', 'rb').read(200).split(b'\\0'))\n"
        "        except OSError:\n            pass\n"
        "print(json.dumps({'others': [b' '.join(o).decode() for o in others if o[0].endswith(b'sleep')]}))\n")))
    return not report["others"], f"processes left from the previous command: {report['others'] or 'none'}"


def between_sessions(ctx):
    first, second = ctx.open().session, ctx.open().session
    ctx.run(first, _script("open('/tmp/eval-marker', 'w').write('first')\n"
                           "open('/workspace/eval-marker', 'w').write('first')\nprint(json.dumps({}))\n"))
    report = ctx.reported(ctx.run(second, _script(
        "print(json.dumps({p: os.path.exists(p) for p in ('/tmp/eval-marker', '/workspace/eval-marker')}))\n")))
    seen = [path for path, exists in report.items() if exists]
    return not seen, f"another session's /tmp and workspace files seen: {seen or 'none'}"


def other_sessions_token(ctx):
    first, second = ctx.open(), ctx.open()
    # A real request through Django's handler, as the API's caller sends it.
    client = Client(headers={"Authorization": f"Bearer {first.token}", "Host": "127.0.0.1"})
    answers = {
        "run a command": client.post(f"/api/v1/sessions/{second.session.pk}/commands",
                                     {"bin": "python3", "args": ["probe.py"]}, content_type="application/json"),
        "read a file": client.get(f"/api/v1/sessions/{second.session.pk}/files/probe.py"),
        "end it": client.delete(f"/api/v1/sessions/{second.session.pk}"),
    }
    statuses = {what: answer.status_code for what, answer in answers.items()}
    return all(status in (403, 404) for status in statuses.values()), f"session A's token on B: {statuses}"


def denial_explained(ctx):
    session = ctx.open().session
    try:
        ctx.propose(session, "bash", ["-c", "id"])
    except BrokerError as exc:
        decision = exc.decision or {}
        explained = bool(decision.get("reason_code") and decision.get("message") and decision.get("hint"))
        return explained, (f"{decision.get('reason_code')}: {decision.get('message')} — hint: "
                           f"{decision.get('hint')}")
    return False, "`bash -c id` ran: the policy allows a shell"


def redaction(ctx):
    session = ctx.open().session
    shaped = "AKIA" + "ABCDEFGHIJKLMNOP"  # the shape of a cloud key: half on stdout and half on stderr, then whole
    command = ctx.run(session, _script(f"import time\nsys.stdout.write('{shaped[:10]}'); sys.stdout.flush()\n"
                                       f"time.sleep(0.3)\nsys.stderr.write('{shaped[10:]}'); sys.stderr.flush()\n"
                                       f"time.sleep(0.3)\nprint()\nprint('key={shaped}')\nprint(json.dumps({{}}))\n"))
    try:
        ctx.propose(session, "curl", ["-H", f"Authorization: Bearer ghp_{'x' * 36}"])
    except BrokerError as exc:
        stored = json.dumps((exc.decision or {}).get("request", {}))
    else:
        stored = "the request ran"
    from policies_app.models import DecisionRecord

    record = DecisionRecord.objects.filter(session_id=session.pk, subject="curl").order_by("-created_at").first()
    arguments = json.dumps(record.request) if record else stored
    clean = shaped not in command.output and "[redacted]" in command.output and "ghp_" + "x" * 36 not in arguments
    return clean, (f"output stored as {command.output.strip()[:60]!r}; the denied request's arguments stored as "
                   f"{arguments[:120]}")


def output_flood(ctx):
    session = ctx.open().session
    cap = ctx.limits["output_mb"]
    command = ctx.run(session, _script(f"chunk = 'y' * 65535 + '\\n'\nfor _ in range({cap * 16 + 64}):\n"
                                       "    sys.stdout.write(chunk)\n"))
    tail = len(command.output or "")
    return command.reason == "output_limit" and tail <= ctx.limits["output_tail_chars"] + 200, (
        f"{cap * 16 + 64} blocks of 64 KiB written with output_mb {cap}: ended {command.reason}, "
        f"{tail} characters stored")


PROBES = [
    Probe("identity", "uid 65534, no capabilities, no new privileges, a seccomp filter", identity),
    Probe("environment", "no configured secret and no credential-named variable in the environment", environment),
    Probe("host-files", "no host path, the host's kernel command line or its pid 1", host_files),
    Probe("network", "no connection to loopback or the host's own addresses from the sandbox", network),
    Probe("egress-guards", "the egress proxy refuses a name off the allowlist, an IP literal, names that resolve "
          "to loopback or this host, and the control plane, even where the policy names them", egress_guards),
    Probe("egress-tls", "a tunnel to an allowed TLS port carries TLS for that name only: another name (fronting) "
          "and bytes that are not TLS are cut, plain http:// to it refused", egress_tls),
    Probe("egress-limits", "the byte budget cuts a connection and refuses the next; one connection past the cap "
          "is refused", egress_limits),
    Probe("fork-bomb", "a fork bomb stops at the pids limit", fork_bomb),
    Probe("memory-bomb", "memory past the limit ends the command (oom)", memory_bomb),
    Probe("disk-bomb", "a write past the workspace quota fails", disk_bomb),
    Probe("inode-bomb", "empty files stop at the workspace's inode limit", inode_bomb),
    Probe("timeout", "a command that never ends is stopped at its timeout", timeout),
    Probe("orphans", "nothing a command started outlives it", orphans),
    Probe("session-orphans", "nothing of a session outlives its end: its sandbox is destroyed", session_orphans),
    Probe("between-sessions", "one session sees nothing of another's /tmp or workspace", between_sessions),
    Probe("other-session-token", "a session's token reaches no other session", other_sessions_token),
    Probe("denial-explained", "a shell is refused with a reason, a message and a hint", denial_explained),
    Probe("redaction", "a secret split across stdout and stderr, and one in arguments, are stored redacted",
          redaction),
    Probe("failed-write", "a write the workspace cannot hold fails and leaves the old file as it was", failed_write),
    Probe("output-flood", "output past the cap ends the command and stores only its tail", output_flood),
]
