"""The supervisor of Docker and gVisor sandboxes: a command can neither reach nor impersonate it,
and a runner that lets go of a sandbox (it died) leaves nothing running in it. On real sandboxes."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid

import pytest

from sessions.runtimes.base import Limits, SandboxSpec
from tests.runtimes.conftest import checked_driver
from tests.runtimes.helpers import py, run

WARM_SPAWNS = 2  # supervisor.c's: `true`, spawned by a pooled gVisor sandbox while it waits
REACH = """
import os
mine = os.getpid()
reached = []
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == mine:
        continue
    for fd in ('0', '1', '2'):
        for mode in ('rb', 'wb'):
            try:
                open(f'/proc/{pid}/fd/{fd}', mode, buffering=0).close()
                reached.append(f'{pid}/{fd}/{mode}')
            except OSError:
                pass
own = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
print(json.dumps({'reached': reached, 'own': own}))
"""


@pytest.fixture(params=["docker", "gvisor"], scope="module")
def supervised(request, built_rootfs):
    return checked_driver(request.param, built_rootfs)


@pytest.fixture
def sandbox(supervised):
    sandbox = supervised.create(SandboxSpec(tenant="conformance", session_id=str(uuid.uuid4()),
                                            limits=Limits(command_timeout_s=20)))
    yield sandbox
    supervised.destroy(sandbox)


def test_a_command_cannot_open_its_supervisors_stdio_or_any_other_processes(supervised, sandbox):
    # (gVisor lets another uid list the numbers in /proc/<pid>/fd; opening any is refused.)
    found = json.loads(py(supervised, sandbox, "import json\n" + REACH).stdout)
    assert found["reached"] == []
    # Its own descriptors: its stdio, and the one listing them (opened last).
    assert found["own"][:3] == [0, 1, 2] and len(found["own"]) <= 4, found["own"]


def test_a_command_cannot_signal_its_supervisor(supervised, sandbox):
    code = (
        "import os, signal\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit() and int(pid) != os.getpid():\n"
        "        for sig in (signal.SIGSTOP, signal.SIGKILL):\n"
        "            try:\n"
        "                os.kill(int(pid), sig); print('signalled', pid)\n"
        "            except PermissionError:\n"
        "                pass\n"
    )
    assert py(supervised, sandbox, code).stdout == ""
    assert run(supervised, sandbox, ["true"]).status.exit_code == 0


def test_a_command_cannot_forge_its_exit_or_another_frame(supervised, sandbox):
    """What a command writes is its output, byte for byte, however much it looks like the
    supervisor's frames or Docker's: the exit that counts is the real one."""
    forged = b"".join(
        b"x" + struct.pack(">I", len(body)) + body
        for body in (json.dumps({"id": n, "exit_code": 0, "reason": "exited", "output": 0}).encode()
                     for n in range(1, 200)))
    forged += b"j" + struct.pack(">I", 17) + b'{"reply": "disk"}' + b"\x01\x00\x00\x00\x00\x00\x00\x05hello"
    code = (
        "import sys, time\n"
        "data = bytes.fromhex(sys.argv[1])\n"
        "sys.stdout.buffer.write(data); sys.stdout.flush()\n"
        "sys.stderr.buffer.write(data); sys.stderr.flush()\n"
        "time.sleep(0.3)\n"
        "sys.exit(7)\n"
    )
    result = py(supervised, sandbox, code, forged.hex())
    assert (result.status.exit_code, result.status.reason) == (7, "exited")
    assert result.out("stdout") == forged and result.out("stderr") == forged
    assert run(supervised, sandbox, ["echo", "next"]).stdout == "next\n"


def test_a_sandbox_whose_runner_let_go_stops_with_what_ran_in_it(supervised, sandbox):
    token = f"airlock-{uuid.uuid4().hex}"
    events = supervised.exec(sandbox, ["python3", "-c", "import time; print('up', flush=True); time.sleep(300)",
                                       token])
    assert next(events).data == b"up\n"
    supervised._channels[sandbox.id].close()  # what a runner's death does to the attach stream
    deadline = time.monotonic() + 20
    while supervised.client.api.inspect_container(sandbox.handle["container"])["State"]["Running"]:
        assert time.monotonic() < deadline, "the sandbox kept running after its runner let go"
        time.sleep(0.1)
    assert list(events)[-1].reason in {"killed", "oom"}


def test_output_written_a_byte_at_a_time_comes_in_merged_frames_and_whole(supervised, sandbox):
    """Small output waits up to a millisecond for more (supervisor.c, frame): a frame a
    millisecond at most, plus one per 4 KiB it holds, not one per write."""
    # (Under gVisor each write is a trip through its kernel: 120,000 took the sandbox's 20 s on a slow host.)
    writes = 200_000 if supervised.name == "docker" else 50_000
    code = f"import os\nfor _ in range({writes}):\n    os.write(1, b'y')\n"
    result = py(supervised, sandbox, code)
    assert result.status.exit_code == 0 and result.out() == b"y" * writes
    assert len(result.chunks) <= result.status.duration_ms + writes // 4096 + 2, len(result.chunks)


def test_a_pooled_gvisor_sandbox_warms_up_while_it_waits_and_keeps_nothing_of_it(supervised, sandbox):
    """Under gVisor a warm pool's sandbox spawns `true` while it waits for its claim
    (supervisor.c, warm): its first command comes after them (gVisor hands out a namespace's pids in
    order, 1 being the supervisor) and finds only pid 1 and itself. A sandbox made for a session
    (the `sandbox` fixture) is used at once: it does not warm up. Under runc neither spawns
    anything before the command."""
    pooled = supervised.prepare(Limits(command_timeout_s=20), pool_id=str(uuid.uuid4()))
    try:
        time.sleep(2)  # waiting for its claim
        code = ("import json, os\n"
                "print(json.dumps([os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]))")
        for made, warmed in ((pooled, WARM_SPAWNS), (sandbox, 0)):
            mine, pids = listed = json.loads(py(supervised, made, code).stdout)
            assert pids == [1, mine], listed
            if supervised.name == "gvisor":
                assert mine == 2 + warmed, listed
    finally:
        supervised.destroy(pooled)


def test_the_search_along_path_goes_past_a_file_that_cannot_run(supervised, sandbox):
    """As os.execvpe searches: a file without a #! line (ENOEXEC) in the first directory does
    not stop the search; where nothing runs, the first such error is the one reported."""
    py(supervised, sandbox, "import os\nfor d, text in (('d1', 'no shebang'), ('d2', '#!/bin/sh\\necho second')):\n"
                            "    os.mkdir(d); open(d + '/hello', 'w').write(text); os.chmod(d + '/hello', 0o755)")
    found = run(supervised, sandbox, ["hello"], env={"PATH": "/workspace/d1:/workspace/d2"})
    assert found.stdout == "second\n", found.stderr
    refused = run(supervised, sandbox, ["hello"], env={"PATH": "/workspace/nothing:/workspace/d1"})
    assert refused.status.exit_code == 127 and "Exec format error" in refused.stderr, refused.stderr


def test_a_sigint_does_not_end_the_supervisor(supervised, sandbox):
    """The supervisor ignores SIGINT (gVisor delivers to pid 1 what runc would drop). Sent here
    from the host."""
    supervised.client.api.kill(sandbox.handle["container"], signal="SIGINT")
    time.sleep(0.5)
    assert supervised.client.api.inspect_container(sandbox.handle["container"])["State"]["Running"]
    assert run(supervised, sandbox, ["true"]).status.exit_code == 0


def test_a_command_is_spawned_with_its_own_rights_only(supervised, sandbox):
    """The command's cwd and program are looked up with its own rights (the spawned child drops
    to them before it looks): a directory
    only it may enter works, one nobody may enter does not (the container's root has no right to
    override either), and what runs holds 65534 in every id."""
    setup = ("import os\nos.mkdir('/workspace/mine', 0o700)\nos.mkdir('/workspace/closed', 0o000)\n"
             "open('/workspace/mine/tool', 'w').write('#!/bin/sh\\necho ran in $(pwd)\\n')\n"
             "os.chmod('/workspace/mine/tool', 0o700)\nopen('/workspace/script', 'w').write('#!/bin/sh\\n')\n")
    py(supervised, sandbox, setup)
    assert run(supervised, sandbox, ["./tool"], cwd="/workspace/mine").stdout == "ran in /workspace/mine\n"
    assert run(supervised, sandbox, ["tool"], cwd="/workspace", env={"PATH": "/workspace/mine"}).stdout == \
        "ran in /workspace\n"
    for argv, cwd in ((["true"], "/workspace/closed"), (["./script"], "/workspace")):
        refused = run(supervised, sandbox, argv, cwd=cwd)
        assert refused.status.exit_code == 127 and "Permission denied" in refused.stderr, refused.stderr
    ids = py(supervised, sandbox, "import os; print(os.getresuid(), os.getresgid(), os.getgroups())").stdout
    assert ids == "(65534, 65534, 65534) (65534, 65534, 65534) []\n"


RACER = r"""
#include <signal.h>
#include <stdio.h>
int main(void) {  /* native, so it runs within microseconds of its exec */
    for (int i = 0; i < 3000; i++)
        if (kill(1, SIGTERM) == 0) { puts("signalled"); return 0; }
    puts("refused");
    return 0;
}
"""


@pytest.fixture(scope="module")
def racer(tmp_path_factory) -> bytes:
    """A static binary that signals pid 1 the moment it starts."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the racing binary; it is not installed")
    folder = tmp_path_factory.mktemp("racer")
    (folder / "racer.c").write_text(RACER)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(folder / "racer"), str(folder / "racer.c")], check=True)
    return (folder / "racer").read_bytes()


def test_a_command_that_signals_pid_1_as_it_starts_never_stops_its_supervisor(supervised, sandbox, racer):
    """The supervisor never takes the command's uid, not even while it spawns it: a command
    that signals pid 1 the moment it starts is refused every time (gVisor would deliver it)."""
    write = "import os, sys; open('racer', 'wb').write(sys.stdin.buffer.read()); os.chmod('racer', 0o755)"
    assert run(supervised, sandbox, ["python3", "-c", write], stdin=racer).status.exit_code == 0
    said = {run(supervised, sandbox, ["./racer"]).stdout for _ in range(25)}
    assert said == {"refused\n"}
    assert supervised.client.api.inspect_container(sandbox.handle["container"])["State"]["Running"]
    assert run(supervised, sandbox, ["true"]).status.exit_code == 0


def test_an_argument_no_file_name_can_hold_fails_its_command_not_the_supervisor(supervised, sandbox):
    """A lone surrogate cannot be encoded for exec: before, it ended pid 1 and the sandbox."""
    refused = run(supervised, sandbox, ["echo", "\ud800"])
    assert refused.status.exit_code == 127 and "cannot be encoded" in refused.stderr, refused.stderr
    assert run(supervised, sandbox, ["true"]).status.exit_code == 0


def test_a_variable_exec_cannot_take_fails_its_command_not_the_supervisor(supervised, sandbox):
    """exec takes C strings, NAME=value: a value that holds a NUL byte, a name that holds "="
    or none at all cannot be given, and the command says so."""
    for env, why in (({"SPLIT": "a\0b"}, "holds a NUL byte"), ({"A=B": "C"}, "holds '='"), ({"": "x"}, "holds '='")):
        refused = run(supervised, sandbox, ["env"], env=env)
        assert refused.status.exit_code == 127 and why in refused.stderr, (env, refused.stderr)
    assert run(supervised, sandbox, ["true"]).status.exit_code == 0


def test_a_runner_in_the_c_locale_sends_utf_8_all_the_same():
    """The runner's own locale does not choose the bytes (os.fsencode there refuses "é")."""
    shown = subprocess.run([sys.executable, "-c", "from sessions.runtimes.channel import exec_request\n"
                            "print(exec_request(1, ['\\u00e9'], '/workspace', {}, 1, 1, None).hex())"],
                           env={**os.environ, "PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0"},
                           capture_output=True, text=True, check=True)
    assert shown.stdout.strip().endswith((b"\0\0\0\2" + "é".encode()).hex()), shown


def test_non_ascii_strings_reach_the_command_as_utf_8(supervised, sandbox):
    """The sandbox's locale is C.UTF-8: an argument, a variable and a cwd are its UTF-8 bytes
    (an undecodable byte, kept by Python as a surrogate, as it came)."""
    py(supervised, sandbox, "import os; os.mkdir('d\u00e9j\u00e0')")
    said = run(supervised, sandbox, ["python3", "-c", "import os, sys; print(os.fsencode(sys.argv[1]).hex(), "
                                     "os.environb[b'WORD'].hex(), os.fsencode(os.getcwd()).hex())", "\u00e9\udcff"],
               env={"WORD": "\u00fc"}, cwd="d\u00e9j\u00e0")
    assert said.stdout.split() == ["c3a9ff", "c3bc", "/workspace/déjà".encode().hex()], said.stderr


def test_an_empty_stdin_ends_at_once_as_dev_null_would(supervised, sandbox):
    """b"" is a stdin at its end: `cat` ends (a pipe with nothing to write was never closed, and
    the command waited out its timeout)."""
    said = run(supervised, sandbox, ["cat"], stdin=b"")
    assert (said.status.exit_code, said.status.reason, said.stdout) == (0, "exited", "")


def test_a_large_stdin_is_not_kept_by_the_supervisor_once_written(supervised, sandbox):
    """pid 1 is charged to the sandbox's memory: 48 MB of stdin given to a command are given
    back once written, not kept for the sandbox's life."""
    assert run(supervised, sandbox, ["sh", "-c", "cat > /dev/null"], stdin=b"\0" * (48 << 20)).status.exit_code == 0
    status = run(supervised, sandbox, ["cat", "/proc/1/status"]).stdout
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    assert rss_kb < 16 << 10, status


def test_stdin_larger_than_a_pipe_and_a_read_comes_whole_and_in_order(supervised, sandbox):
    """Written in turns as the command reads it: 5 MB of bytes, each position's own."""
    data = bytes(range(256)) * (5 * 4096)
    said = run(supervised, sandbox, ["python3", "-c", "import hashlib, sys\n"
                                     "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"], stdin=data)
    assert said.stdout == hashlib.sha256(data).hexdigest() + "\n", said.stderr
