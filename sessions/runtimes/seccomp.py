"""The seccomp filter of bubblewrap and Docker sandboxes (docs/architecture.md, "Runtimes").

Modelled on Docker's default profile (moby/profiles/seccomp/default.json): an allowlist, every
other system call failing with EPERM, for a process without capabilities. Stricter than it in
what a code sandbox needs least and the kernel exposes most:

- io_uring (its own syscall surface, a long line of kernel bugs): ENOSYS, as on a kernel without
  it, so programs fall back to read and write;
- no new namespaces: `unshare` and `setns` refused, `clone` only without namespace flags, and
  `clone3` ENOSYS (its flags sit in memory a filter cannot read; glibc falls back to clone);
- sockets of the families a sandbox uses only (Unix; IPv4 and IPv6 with TCP, UDP or ICMP; and
  netlink's routing protocol, which glibc reads its interfaces and addresses through): packet,
  vsock and the rest answer EAFNOSUPPORT, netlink's other protocols (netfilter, xfrm, audit, ...)
  EPROTONOSUPPORT, other IP protocols (SCTP, DCCP, ...: kernel modules loaded on demand) EPERM;
  `socketpair` of Unix sockets only;
- bpf, userfaultfd, perf_event_open, keyctl, add_key, request_key, mount, ptrace of other
  processes' memory aside, are not on the list (Docker allows them only with a capability);
- native x86-64 calls only: a 32-bit or x32 call kills the process (libseccomp's default for an
  architecture the filter does not name).

For bubblewrap the filter is compiled by libseccomp (through pyseccomp, its ctypes binding) once
per process, and bwrap loads it into the command right before exec. Docker gets the same rules
as a seccomp profile (`docker_profile`), which runc compiles with libseccomp too. gVisor keeps its
own: a command's calls reach gVisor's kernel, never the host's, and runsc filters its own."""

import errno
import functools
import json
import os
import tempfile

# Docker's default allowlist for a container without added capabilities, less io_uring.
_ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown clock_adjtime clock_getres
clock_gettime clock_nanosleep close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2
execve execveat exit exit_group faccessat faccessat2 fadvise64 fallocate fanotify_mark fchdir fchmod fchmodat
fchown fchownat fcntl fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstatfs fsync
ftruncate futex futex_waitv futimesat getcpu getcwd getdents getdents64 getegid geteuid getgid getgroups
getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresuid getrlimit
get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid getxattr
inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents
io_pgetevents ioprio_get ioprio_set io_setup io_submit kill landlock_add_rule landlock_create_ruleset
landlock_restrict_self lchown lgetxattr link linkat listen listxattr llistxattr lremovexattr lseek lsetxattr
lstat madvise membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall
mmap mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedsend mq_unlink mremap msgctl msgget
msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat open openat openat2 pause
pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll prctl pread64 preadv
preadv2 prlimit64 process_mrelease pselect6 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv
recvfrom recvmmsg recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq
rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
sched_getscheduler sched_rr_get_interval sched_setaffinity sched_setattr sched_setparam sched_setscheduler
sched_yield seccomp select semctl semget semop semtimedop sendfile sendmmsg sendmsg sendto setfsgid setfsuid
setgid setgroups setitimer setpgid setpriority setregid setresgid setresuid setreuid setrlimit set_robust_list
setsid setsockopt set_thread_area set_tid_address setuid setxattr shmat shmctl shmdt shmget shutdown
sigaltstack signalfd signalfd4 splice stat statfs statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_settime
timerfd_create timerfd_gettime timerfd_settime times tkill truncate umask uname unlink unlinkat utime utimensat
utimes vfork vmsplice wait4 waitid write writev
process_vm_readv process_vm_writev ptrace arch_prctl modify_ldt
"""
ALLOWED = tuple(_ALLOWED.split())
# Docker's too: only the personalities that change nothing dangerous (Linux, and its query).
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)
# The IP protocols a sandbox's programs open (0 is the family's default: TCP or UDP); any other
# (SCTP, DCCP, L2TP, ...) would have the kernel load its module: refused (EPERM, the default).
IP_PROTOCOLS = {AF_INET: (0, 1, 6, 17), AF_INET6: (0, 6, 17, 58)}  # ip, icmp, tcp, udp, icmpv6
AF_NETLINK, NETLINK_ROUTE = 16, 0
AF_MAX = 46  # Linux 6.x
ENOSYS_CALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3")


class SeccompUnavailable(Exception):
    pass


@functools.cache
def program() -> bytes:
    """The compiled BPF program (what `bwrap --seccomp FD` reads)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # OSError: libseccomp.so.2 is missing
        raise SeccompUnavailable(f"libseccomp is not usable here ({exc}); apt-get install -y libseccomp2") from exc
    rules = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    for name in ALLOWED:
        rules.add_rule(seccomp.ALLOW, name)
    for persona in PERSONALITIES:
        rules.add_rule(seccomp.ALLOW, "personality", seccomp.Arg(0, seccomp.EQ, persona))
    rules.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, NAMESPACE_FLAGS, 0))
    rules.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.EQ, AF_UNIX))
    rules.add_rule(seccomp.ALLOW, "socketpair", seccomp.Arg(0, seccomp.EQ, AF_UNIX))
    for family, protocols in IP_PROTOCOLS.items():
        for protocol in protocols:
            rules.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.EQ, family),
                           seccomp.Arg(2, seccomp.EQ, protocol))
    netlink = seccomp.Arg(0, seccomp.EQ, AF_NETLINK)
    rules.add_rule(seccomp.ALLOW, "socket", netlink, seccomp.Arg(2, seccomp.EQ, NETLINK_ROUTE))
    rules.add_rule(seccomp.ERRNO(errno.EPROTONOSUPPORT), "socket", netlink, seccomp.Arg(2, seccomp.NE, NETLINK_ROUTE))
    for name in ENOSYS_CALLS:
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
    for family in range(AF_MAX):  # (a larger number gets the default, EPERM)
        if family not in (*SOCKET_FAMILIES, AF_NETLINK):
            rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family))
    with tempfile.TemporaryFile() as sink:
        rules.export_bpf(sink)
        sink.seek(0)
        return sink.read()


def program_fd() -> int:
    """A new pipe's read end holding the program, for one bwrap (the caller closes it)."""
    bpf = program()
    read, write = os.pipe()
    try:
        os.write(write, bpf)  # a few KiB: below any pipe's buffer, so this never blocks
    finally:
        os.close(write)
    return read


@functools.cache
def docker_profile() -> str:
    """The same rules in Docker's seccomp profile format (what `--security-opt seccomp=` takes)."""

    def rule(names, *args: dict, action: str = "SCMP_ACT_ALLOW", errno_ret: int | None = None) -> dict:
        entry = {"names": list(names), "action": action}
        if errno_ret is not None:
            entry["errnoRet"] = errno_ret
        if args:
            entry["args"] = list(args)
        return entry

    def arg(index: int, value: int, op: str = "SCMP_CMP_EQ", **more) -> dict:
        return {"index": index, "value": value, "op": op, **more}

    refuse = {"action": "SCMP_ACT_ERRNO"}
    rules = [
        rule(ALLOWED),
        *(rule(["personality"], arg(0, persona)) for persona in PERSONALITIES),
        rule(["clone"], arg(0, NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ", valueTwo=0)),
        rule(["socket"], arg(0, AF_UNIX)),
        rule(["socketpair"], arg(0, AF_UNIX)),
        *(rule(["socket"], arg(0, family), arg(2, protocol))
          for family, protocols in IP_PROTOCOLS.items() for protocol in protocols),
        rule(["socket"], arg(0, AF_NETLINK), arg(2, NETLINK_ROUTE)),
        rule(["socket"], arg(0, AF_NETLINK), arg(2, NETLINK_ROUTE, "SCMP_CMP_NE"), **refuse,
             errno_ret=errno.EPROTONOSUPPORT),
        rule(ENOSYS_CALLS, **refuse, errno_ret=errno.ENOSYS),
        *(rule(["socket"], arg(0, family), **refuse, errno_ret=errno.EAFNOSUPPORT)
          for family in range(AF_MAX) if family not in (*SOCKET_FAMILIES, AF_NETLINK)),
    ]
    return json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": errno.EPERM,
                       "architectures": ["SCMP_ARCH_X86_64"], "syscalls": rules}, separators=(",", ":"))
