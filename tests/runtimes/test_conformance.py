"""What every sandbox driver guarantees, checked on real sandboxes (no mocks)."""

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from sessions.output import CommandOutput
from sessions.runtimes import rootfs
from sessions.runtimes.base import Chunk, OutputTail, RuntimeUnavailable, SandboxError
from tests.runtimes.conftest import unavailable
from tests.runtimes.helpers import py, run

LIST_PROCS = """
import os, sys
token = sys.argv[1][::-1]
for pid in os.listdir('/proc'):
    try:
        if pid.isdigit() and token.encode() in open(f'/proc/{pid}/cmdline', 'rb').read():
            print(pid)
    except OSError:
        pass
"""


def leftover_processes(driver, sandbox, token: str) -> list[str]:
    """Processes whose argv holds `token`: seen from the host, or from inside under gVisor
    (its processes live in the sandbox kernel, invisible to the host)."""
    if driver.name == "gvisor":
        container = driver.client.containers.get(sandbox.handle["container"])
        result = container.exec_run(["python3", "-I", "-c", LIST_PROCS, token[::-1]], user="65534:65534", workdir="/")
        return result.output.decode().split()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_exit_codes_come_through(driver, sandbox):
    assert run(driver, sandbox, ["true"]).status.exit_code == 0
    assert run(driver, sandbox, ["false"]).status.exit_code == 1
    result = py(driver, sandbox, "import sys; sys.exit(42)")
    assert (result.status.exit_code, result.status.reason) == (42, "exited")
    assert result.status.duration_ms >= 0


def test_stdout_and_stderr_are_kept_apart_and_in_order(driver, sandbox):
    code = (
        "import sys\n"
        "for i in range(50):\n"
        "    print(f'out{i}', flush=True)\n"
        "    print(f'err{i}', file=sys.stderr, flush=True)\n"
    )
    result = py(driver, sandbox, code)
    assert result.stdout == "".join(f"out{i}\n" for i in range(50))
    assert result.stderr == "".join(f"err{i}\n" for i in range(50))


def test_the_first_chunk_arrives_before_a_long_command_ends(driver, sandbox):
    started = time.monotonic()
    events = driver.exec(sandbox, ["python3", "-c", "import time; print('ready', flush=True); time.sleep(3)"])
    first = next(events)
    first_at = time.monotonic() - started
    rest = list(events)
    assert first.data == b"ready\n"
    assert first_at < 2.5
    assert rest[-1].duration_ms >= 3000


def test_a_timeout_ends_the_command_and_everything_it_started(driver, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen(['sleep', '300', sys.argv[1]], start_new_session=True)\n"
        "print('started', flush=True)\n"
        "time.sleep(300)\n"
    )
    result = py(driver, sandbox, code, token, timeout_s=2)
    assert result.status.reason == "timeout"
    assert result.status.exit_code is None
    assert 2000 <= result.status.duration_ms < 8000
    assert leftover_processes(driver, sandbox, token) == []


def test_the_deadline_holds_when_nobody_reads_the_output(driver, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    events = driver.exec(sandbox, ["python3", "-c", "import time; print('up', flush=True); time.sleep(300)", token],
                         timeout_s=2)
    assert next(events).data == b"up\n"
    time.sleep(4)  # the consumer looks away past the deadline
    assert leftover_processes(driver, sandbox, token) == []
    assert list(events)[-1].reason == "timeout"


def test_a_command_that_signals_everything_it_sees_leaves_the_sandbox_working(driver, sandbox):
    code = (
        "import os, signal\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit() and int(pid) != os.getpid():\n"
        "        try:\n"
        "            os.kill(int(pid), signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    py(driver, sandbox, code)
    assert run(driver, sandbox, ["true"]).status.exit_code == 0


def test_a_directory_locked_by_a_command_does_not_stop_destroy(driver, make_sandbox):
    sandbox = make_sandbox()
    py(driver, sandbox, "import os; os.makedirs('locked/inner'); open('locked/inner/f', 'w'); os.chmod('locked', 0)")
    driver.destroy(sandbox)
    assert sandbox.id not in driver.list_sandboxes()
    assert run(driver, make_sandbox(), ["true"]).status.exit_code == 0


def test_processes_left_behind_by_a_finished_command_are_killed(driver, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    code = "import subprocess, sys; subprocess.Popen(['sleep', '300', sys.argv[1]], start_new_session=True)"
    result = py(driver, sandbox, code, token)
    assert result.status.exit_code == 0
    assert leftover_processes(driver, sandbox, token) == []


def test_kill_stops_a_running_command(driver, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    events = driver.exec(sandbox, ["python3", "-c", "import time; print('up', flush=True); time.sleep(300)", token])
    assert next(events).data == b"up\n"
    killed_at = time.monotonic()
    threading.Thread(target=driver.kill, args=(sandbox,)).start()
    status = list(events)[-1]
    assert status.reason == "killed"
    assert time.monotonic() - killed_at < 3
    assert leftover_processes(driver, sandbox, token) == []
    assert run(driver, sandbox, ["true"]).status.exit_code == 0  # the sandbox still works


def _zombie_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, parent = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state == b"Z" and int(parent) == os.getpid():
            found.append(int(entry.name))
    return found


def test_a_kill_while_a_command_starts_ends_it_and_leaves_nothing(driver, sandbox):
    # Killed before bwrap had reported its namespace init, the init kept waiting outside the
    # sandbox's cgroups holding the command's pipes: exec() hung reading them (1 run in ~60).
    before = set(_zombie_children())
    for attempt in range(60 if driver.name == "bubblewrap" else 8):
        ended: list = []
        runner = threading.Thread(target=lambda into=ended: into.append(list(driver.exec(sandbox, ["true"]))[-1]),
                                  daemon=True)
        killer = threading.Timer(attempt % 7 / 1000, driver.kill, args=(sandbox,))
        runner.start()
        killer.start()
        runner.join(20)
        killer.join()
        assert ended, f"attempt {attempt}: the command never ended"
        assert ended[0].reason in {"killed", "exited"}, ended[0]
    assert run(driver, sandbox, ["true"]).status.exit_code == 0
    time.sleep(0.2)
    assert set(_zombie_children()) <= before  # every process bwrap left was reaped


def test_a_kill_never_reaches_the_command_that_follows(driver, sandbox):
    for _ in range(5 if driver.name == "gvisor" else 15):
        events = driver.exec(sandbox, ["python3", "-c", "import time; print('up', flush=True); time.sleep(300)"])
        assert next(events).data == b"up\n"
        killer = threading.Thread(target=driver.kill, args=(sandbox,))
        killer.start()
        assert list(events)[-1].reason == "killed"
        following = run(driver, sandbox, ["python3", "-c", "import time; time.sleep(0.05); print('ok')"])
        killer.join()
        assert (following.status.reason, following.stdout) == ("exited", "ok\n"), following.stderr


def test_the_memory_limit_ends_in_oom(driver, make_sandbox):
    sandbox = make_sandbox(memory_mb=64)
    result = py(driver, sandbox, "x = bytearray(256 * 2**20); x[::4096] = b'1' * (len(x) // 4096); print('survived')")
    assert "survived" not in result.stdout
    assert result.status.reason == "oom"


def test_a_fork_bomb_is_contained_and_the_host_keeps_answering(driver, make_sandbox):
    sandbox = make_sandbox(pids=32)
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('forks', n, e.errno, flush=True)\n"
        "time.sleep(30)\n"
    )
    events = driver.exec(sandbox, ["python3", "-c", code], timeout_s=20)
    words = next(event for event in events if isinstance(event, Chunk)).data.decode().split()
    # The bomb is at its limit and every child is alive: the host still forks and answers.
    host = subprocess.run(["true"], timeout=10)
    driver.kill(sandbox)
    assert list(events)[-1].reason == "killed"
    assert host.returncode == 0
    assert words[0] == "forks" and int(words[1]) < 32 and words[2] == "11"  # EAGAIN


def test_a_sandbox_runs_more_commands_than_its_process_limit(driver, make_sandbox):
    # Nothing of a finished command stays charged to the limit: on a host whose init reaps no
    # orphans, bubblewrap's namespace init did, one zombie per command, until none could start.
    sandbox = make_sandbox(pids=8)
    exits = [run(driver, sandbox, ["true"]).status for _ in range(12 if driver.name == "gvisor" else 24)]
    assert [(status.reason, status.exit_code) for status in exits] == [("exited", 0)] * len(exits)


def test_filling_the_workspace_stops_at_the_quota_with_enospc(driver, make_sandbox):
    sandbox = make_sandbox(disk_mb=16)
    host_free = shutil.disk_usage("/").free
    code = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        "    with open('/workspace/fill', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'0' * 2**20); f.flush(); written += 2**20\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno], written // 2**20)\n"
    )
    name, megabytes = py(driver, sandbox, code).stdout.split()
    assert name == "ENOSPC"
    assert 12 <= int(megabytes) <= 16
    assert abs(shutil.disk_usage("/").free - host_free) < 8 * 2**20  # the host's disk is untouched


def _host_connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def test_there_is_no_network(driver, sandbox):
    with socket.create_server(("127.0.0.1", 0)) as listener:  # one port surely open on the host
        ports = [listener.getsockname()[1], *(port for port in (5432, 6379) if _host_connects(port))]
        assert _host_connects(ports[0])
        code = (
            "import socket, sys\n"
            "for port in sys.argv[1:]:\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', int(port)), timeout=2); print(port, 'open')\n"
            "    except OSError as e:\n"
            "        print(port, 'refused')\n"
            "try:\n"
            "    socket.getaddrinfo('deb.debian.org', 80); print('dns', 'resolved')\n"
            "except OSError:\n"
            "    print('dns', 'failed')\n"
        )
        lines = py(driver, sandbox, code, *map(str, ports)).stdout.splitlines()
    assert lines == [*(f"{port} refused" for port in ports), "dns failed"]


def test_the_runners_environment_is_invisible_inside(driver, sandbox, monkeypatch):
    monkeypatch.setenv("AIRLOCK_TEST_SECRET", "s3cr3t-value-of-the-runner")
    result = run(driver, sandbox, ["cat", "/proc/self/environ"])
    assert b"s3cr3t" not in result.out()
    assert b"SECRET_KEY" not in result.out() and b"DATABASE_URL" not in result.out()
    env = dict(item.split("=", 1) for item in result.stdout.split("\0") if item)
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["HOME"] == "/workspace"


def test_host_files_are_unreadable(driver, sandbox, tmp_path):
    database = tmp_path / "var" / "airlock.sqlite3"  # where a deployment keeps its database
    database.parent.mkdir()
    database.write_bytes(b"SQLite format 3\0 secret rows")
    project_file = settings.BASE_DIR / "manage.py"
    assert database.read_bytes() and project_file.read_bytes()  # the host itself reads both
    code = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'rb').read(1); print(path, 'READ')\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
        "import os\n"
        "try:\n"
        "    os.listdir('/root'); print('/root', 'LISTED')\n"
        "except OSError as e:\n"
        "    print('/root', type(e).__name__)\n"
    )
    result = py(driver, sandbox, code, str(database), str(project_file), "/etc/shadow")
    assert result.stdout.splitlines() == [f"{database} FileNotFoundError", f"{project_file} FileNotFoundError",
                                          "/etc/shadow PermissionError", "/root PermissionError"]


def test_the_hosts_kernel_command_line_is_not_visible(driver, sandbox):
    inside = py(driver, sandbox, "print(repr(open('/proc/cmdline').read()))").stdout.strip()
    host = Path("/proc/cmdline").read_text()
    assert host.strip() and host.strip()[:40] not in inside, inside


READ_PROC = """
import os
print(open('/proc/self/mountinfo').read())
for pid in filter(str.isdigit, os.listdir('/proc')):  # pid 1 is bubblewrap's init, bwrap's own argv
    try:
        print(pid, open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode(errors='replace'))
    except OSError:
        pass
"""


def test_the_host_paths_of_the_root_filesystem_and_workspace_are_not_visible(driver, sandbox, built_rootfs):
    seen = py(driver, sandbox, READ_PROC).stdout
    hosts = [str(Path(settings.AIRLOCK_SANDBOX_DIR)), "/var/lib/docker"]
    if driver.name == "docker":  # Docker's own overlay names its layers' host paths in every container's mountinfo
        seen = seen[seen.index("\n1 "):]  # the processes' arguments only
    else:
        hosts.append(str(built_rootfs.path.parent))
    for host in hosts:
        assert host not in seen, (host, seen)


def test_it_runs_as_65534_without_capabilities_or_a_way_to_gain_them(driver, sandbox):
    code = (
        "import errno, os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(os.getuid(), os.getgid(), status['CapEff'].strip(), status['CapPrm'].strip())\n"
        "print(status.get('NoNewPrivs', 'n/a').strip())\n"
        "for attempt in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):\n"
        "    try:\n"
        "        attempt(); print('GAINED')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )
    result = py(driver, sandbox, code)
    lines = result.stdout.splitlines()
    assert lines[0] == "65534 65534 0000000000000000 0000000000000000", result.stderr
    # gVisor does not report NoNewPrivs in /proc; runc and bubblewrap set it.
    assert lines[1] == ("n/a" if driver.name == "gvisor" else "1")
    # EPERM, or EINVAL where uid 0 does not even exist in the sandbox's user namespace.
    assert len(lines) == 5 and set(lines[2:]) <= {"EPERM", "EINVAL"}, lines


def test_only_the_workspace_and_tmp_are_writable(driver, sandbox):
    code = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print(path, 'written')\n"
        "    except OSError as e:\n"
        "        print(path, 'refused')\n"
    )
    targets = ["/workspace/ok", "/tmp/ok", "/etc/evil", "/usr/bin/evil", "/evil", "/var/tmp/evil", "/dev/evil",
               "/dev/shm/evil", "/dev/mqueue/evil", "/run/evil", "/root/evil", "/proc/sys/kernel/evil"]
    lines = py(driver, sandbox, code, *targets).stdout.splitlines()
    assert lines[:2] == ["/workspace/ok written", "/tmp/ok written"]
    assert lines[2:] == [f"{path} refused" for path in targets[2:]]


def test_the_workspace_persists_between_commands_of_a_sandbox(driver, sandbox):
    py(driver, sandbox, "open('/workspace/note.txt', 'w').write('kept')")
    assert run(driver, sandbox, ["cat", "note.txt"]).stdout == "kept"
    assert run(driver, sandbox, ["pwd"], cwd="/workspace").stdout == "/workspace\n"


def test_a_cwd_outside_the_workspace_is_refused(driver, sandbox):
    for cwd in ("/etc", "../etc", "/workspace/../root"):
        with pytest.raises(SandboxError):
            list(driver.exec(sandbox, ["true"], cwd=cwd))


def test_argv_is_never_given_to_a_shell(driver, sandbox):
    result = run(driver, sandbox, ["echo", "$HOME; id > /workspace/pwned", "`id`"])
    assert result.stdout == "$HOME; id > /workspace/pwned `id`\n"
    assert run(driver, sandbox, ["ls", "/workspace"]).stdout == ""


def test_a_command_starts_with_no_signal_ignored_or_blocked(driver, sandbox):
    """What the supervisor ignores (SIGPIPE, SIGINT, SIGXFSZ) is its own: a command's pipeline
    ends on SIGPIPE, an interrupt interrupts it. (bash lists what it was started ignoring.)"""
    said = run(driver, sandbox, ["bash", "-c", "trap -p; grep -h '^Sig[BI]' /proc/self/status || true"])
    assert said.status.exit_code == 0
    assert "trap" not in said.stdout, said.stdout
    masks = dict(line.split(":") for line in said.stdout.splitlines())  # gVisor shows none
    glibc_own = 0x180000000  # signals 32 and 33, which only glibc itself uses (nptl): as they came
    assert all(int(mask, 16) & ~glibc_own == 0 for mask in masks.values()), said.stdout


def test_invalid_utf8_and_binary_output_come_through_unchanged(driver, sandbox):
    result = py(driver, sandbox, "import sys; sys.stdout.buffer.write(bytes(range(256)) + b'\\xff\\xfe\\xc3')")
    assert result.out() == bytes(range(256)) + b"\xff\xfe\xc3"
    tail = OutputTail(8000)
    tail.feed(result.out())
    assert "\ufffd" in tail.text


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_200_mb_of_output_does_not_grow_the_runners_memory(driver, make_sandbox):
    sandbox = make_sandbox(max_output_bytes=2**30)  # past the default cap (16 MiB) on purpose
    code = "import sys\nblock = b'x' * 2**20 + b'\\n'\nfor _ in range(200):\n    sys.stdout.buffer.write(block)\n"
    output, received, peak = CommandOutput(tail_chars=8000), 0, 0  # what the runner keeps of a command
    before = _rss_bytes()
    for event in driver.exec(sandbox, ["python3", "-c", code], timeout_s=120):
        if hasattr(event, "data"):
            output.keep(output.feed(event.stream, event.data))
            received += len(event.data)
            peak = max(peak, _rss_bytes())
        else:
            status = event
    assert status.exit_code == 0
    assert received == 200 * (2**20 + 1)
    assert len(output.tail.text) == 8000 and output.tail.truncated
    assert peak - before < 48 * 2**20


def test_output_past_the_limit_kills_the_command(driver, make_sandbox):
    sandbox = make_sandbox(max_output_bytes=2**20)
    result = py(driver, sandbox, "import sys\nwhile True:\n    sys.stdout.buffer.write(b'y' * 65536)\n")
    assert result.status.reason == "output_limit"
    assert sum(len(chunk.data) for chunk in result.chunks) <= 2**20


def test_destroy_leaves_nothing_behind(driver, make_sandbox):
    sandbox = make_sandbox()
    py(driver, sandbox, "open('/workspace/data', 'w').write('x' * 1000)")
    driver.destroy(sandbox)
    assert sandbox.id not in driver.list_sandboxes()
    if driver.name == "bubblewrap":
        root = Path(sandbox.handle["root"])
        assert not root.exists()
        assert str(root) not in Path("/proc/self/mountinfo").read_text()
        assert sandbox.id not in driver.cgroups.list_ids()
    else:
        assert driver.client.containers.list(all=True, filters={"label": f"airlock.session={sandbox.id}"}) == []
    driver.destroy(sandbox)  # idempotent


def test_a_kill_reaches_every_process_in_the_sandboxs_cgroups(driver, sandbox):
    """Bubblewrap's kill takes every process its cgroups hold, one outside the sandbox's PID
    namespace too (killing the namespace's init ends only what is inside it)."""
    if driver.name != "bubblewrap" or not driver.cgroups.available:
        pytest.skip("bubblewrap with cgroups: Docker kills a container's processes itself")
    stray = subprocess.Popen(["sleep", "60"])
    try:
        driver.cgroups.attach(sandbox.id, stray.pid)
        driver.kill(sandbox)
        assert stray.wait(timeout=10) == -signal.SIGKILL
    finally:
        stray.kill()
        stray.wait()
    assert run(driver, sandbox, ["true"]).status.exit_code == 0


def test_orphans_are_listed_and_reaped(driver, make_sandbox):
    kept, orphan = make_sandbox(), make_sandbox()
    orphans = driver.list_orphans({kept.id})
    assert orphan.id in orphans and kept.id not in orphans
    for sandbox_id in orphans:
        if sandbox_id == orphan.id:
            driver.destroy_by_id(sandbox_id)
    assert orphan.id not in driver.list_sandboxes()
    assert run(driver, kept, ["true"]).status.exit_code == 0


def test_stats_report_cpu_memory_and_disk(driver, sandbox):
    py(driver, sandbox, "open('/workspace/blob', 'wb').write(b'1' * 3 * 2**20); sum(range(3_000_000))")
    stats = driver.stats(sandbox)
    assert stats.disk_bytes is not None and stats.disk_bytes >= 3 * 2**20
    assert stats.cpu_s is not None and stats.cpu_s > 0
    assert stats.memory_bytes is not None and stats.memory_bytes > 0


def test_each_sandbox_reports_the_root_filesystem_it_runs(driver, sandbox, built_rootfs):
    assert sandbox.rootfs_digest == built_rootfs.digest
    if driver.name == "bubblewrap":  # the tree, or (as root) its overlay: the same files
        view = Path(sandbox.handle["rootfs"])
        assert view == built_rootfs.path or (view / "etc" / "os-release").read_bytes() == (
            built_rootfs.path / "etc" / "os-release").read_bytes()
    else:  # Docker's own hash of the layer it imported: a second, independent computation
        container = driver.client.containers.get(sandbox.handle["container"])
        assert driver.client.images.get(container.image.id).attrs["RootFS"]["Layers"] == [sandbox.rootfs_digest]
    inside = run(driver, sandbox, ["cat", "/etc/debian_version"]).stdout
    assert inside == (built_rootfs.path / "etc" / "debian_version").read_text()


def test_the_recorded_digest_is_the_tree_as_it_is_now(built_rootfs):
    if isinstance(built_rootfs, RuntimeUnavailable):
        unavailable("bubblewrap", built_rootfs)  # required wherever bubblewrap is
    assert rootfs._digest(built_rootfs.path)[0] == built_rootfs.digest  # nothing changed since the build


@pytest.fixture(autouse=True)
def _no_project_secrets_in_test_env():
    yield
    os.environ.pop("AIRLOCK_TEST_SECRET", None)


# A process whose main thread has exited while another runs on: /proc shows it as a zombie.
HALF_DEAD = (
    "import ctypes, sys, threading, time\n"
    "def beat():\n"
    "    while True:\n"
    "        open(sys.argv[1], 'w').write(str(time.time())); time.sleep(0.02)\n"
    "threading.Thread(target=beat).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)


def test_a_process_whose_main_thread_exited_dies_with_its_command(driver, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    code = ("import os, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', sys.argv[1], '/workspace/' + sys.argv[2]],\n"
            "                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "for _ in range(500):  # until it beats (its Python starts slowly under gVisor)\n"
            "    if os.path.exists('/workspace/' + sys.argv[2]):\n"
            "        break\n"
            "    time.sleep(0.02)\n"
            "time.sleep(0.1)\n")
    assert py(driver, sandbox, code, HALF_DEAD, token).status.exit_code == 0
    check = (f"import time; a = open('/workspace/{token}').read(); time.sleep(0.3); "
             f"print(a == open('/workspace/{token}').read())")
    assert py(driver, sandbox, check).stdout == "True\n"  # nobody beats any more
    assert leftover_processes(driver, sandbox, token) == []


def test_a_kill_reaches_a_command_whose_main_thread_exited(driver, sandbox):
    events = driver.exec(sandbox, ["python3", "-c", "print('up', flush=True)\n" + HALF_DEAD, "/workspace/beat"])
    assert next(events).data == b"up\n"
    killed_at = time.monotonic()
    threading.Thread(target=driver.kill, args=(sandbox,)).start()
    assert list(events)[-1].reason == "killed"
    assert time.monotonic() - killed_at < 3
    assert run(driver, sandbox, ["true"]).status.exit_code == 0  # the sandbox still works
