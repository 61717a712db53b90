"""The kernel surface a sandboxed command reaches, on every driver: the calls with the longest
record of kernel bugs are refused. Bubblewrap and Docker sandboxes run under Airlock's filter
(sessions/runtimes/seccomp.py); gVisor's calls reach its own kernel, whose host process runsc
filters itself (checked from the host)."""

import json
from pathlib import Path

import pytest

from tests.runtimes.helpers import py

PROBE = r"""
import ctypes, errno, json, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    return "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
buffer = ctypes.create_string_buffer(256)
found = {
    "io_uring_setup": call(425, 4, ctypes.addressof(buffer)),
    "bpf": call(321, 0, ctypes.addressof(buffer), 64),
    "userfaultfd": call(323, 0),
    "keyctl": call(250, 0, 0),
    "add_key": call(248, 0, 0, 0, 0, 0),
    "perf_event_open": call(298, ctypes.addressof(buffer), 0, -1, -1, 0),
    "unshare_user": call(272, 0x10000000),
    "unshare_net": call(272, 0x40000000),
    "setns": call(308, 0, 0),
    "mount": call(165, 0, ctypes.addressof(buffer), 0, 0, 0),
    "clone3": call(435, 0, 0),
}
for name, family, kind, protocol in (
        ("netlink_route", 16, socket.SOCK_RAW, 0), ("netlink_netfilter", 16, socket.SOCK_RAW, 12),
        ("netlink_xfrm", 16, socket.SOCK_RAW, 6), ("packet", 17, socket.SOCK_RAW, 0),
        ("vsock", 40, socket.SOCK_STREAM, 0), ("inet", 2, socket.SOCK_STREAM, 0), ("unix", 1, socket.SOCK_STREAM, 0),
        ("sctp", 2, socket.SOCK_STREAM, 132), ("dccp", 10, 6, 33), ("udp6", 10, socket.SOCK_DGRAM, 17)):
    try:
        socket.socket(family, kind, protocol).close()
        found["socket_" + name] = "ok"
    except OSError as exc:
        found["socket_" + name] = errno.errorcode.get(exc.errno, str(exc.errno))
for name, family in (("pair_unix", 1), ("pair_inet", 2), ("pair_vsock", 40)):
    try:
        [s.close() for s in socket.socketpair(family)]
        found["socket" + name] = "ok"
    except OSError as exc:
        found["socket" + name] = errno.errorcode.get(exc.errno, str(exc.errno))
found["seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][:1]
print(json.dumps(found))
"""
REFUSED = {"EPERM", "ENOSYS", "ENODEV", "EACCES", "EINVAL", "EAFNOSUPPORT", "ENOTSUP", "EOPNOTSUPP", "EBADF", "EFAULT"}


def probe(driver, sandbox) -> dict:
    result = py(driver, sandbox, PROBE)
    assert result.status.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_kernels_riskiest_calls_are_refused(driver, sandbox):
    found = probe(driver, sandbox)
    # (gVisor's own kernel emulates new namespaces and packet sockets: they never reach the host's)
    for name in ("bpf", "userfaultfd", "keyctl", "add_key", "perf_event_open", "setns", "mount"):
        assert found[name] in REFUSED, (name, found[name])
    assert found["socket_inet"] == found["socket_unix"] == "ok"  # what a program needs still works


@pytest.mark.parametrize("driver", ["bubblewrap", "docker"], indirect=True)  # gVisor: the next test
def test_bubblewrap_and_docker_sandboxes_run_under_airlocks_seccomp_filter(driver, sandbox):
    found = probe(driver, sandbox)
    assert found["seccomp"] == ["2"]  # filtered
    assert found["io_uring_setup"] == found["clone3"] == "ENOSYS"  # as on a kernel without them: programs fall back
    assert found["bpf"] == found["keyctl"] == found["unshare_user"] == found["unshare_net"] == found["mount"] == "EPERM"
    assert found["socket_vsock"] == found["socket_packet"] == "EAFNOSUPPORT"
    assert found["socket_netlink_netfilter"] == found["socket_netlink_xfrm"] == "EPROTONOSUPPORT"
    assert found["socket_netlink_route"] == "ok"  # glibc reads interfaces and addresses through it
    assert found["socket_sctp"] == found["socket_dccp"] == "EPERM"  # their kernel modules stay unloaded
    assert found["socket_udp6"] == found["socketpair_unix"] == "ok"
    assert found["socketpair_inet"] in REFUSED and found["socketpair_vsock"] in REFUSED


@pytest.mark.parametrize("driver", ["gvisor"], indirect=True)
def test_gvisors_kernel_runs_under_its_own_host_filter(driver, sandbox):
    pid = driver.client.containers.get(sandbox.handle["container"]).attrs["State"]["Pid"]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Seccomp"].strip() == "2"  # runsc's sandbox process, seen from the host


def test_what_programs_need_still_works_under_the_filter(driver, sandbox):
    code = ("import subprocess, threading, os\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "print(subprocess.run(['python3', '-c', 'print(7)'], capture_output=True, text=True).stdout.strip())\n"
            "pid = os.fork()\n"
            "if pid == 0: os._exit(3)\n"
            "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    result = py(driver, sandbox, code)
    assert result.stdout.split() == ["7", "3"], result.stderr
