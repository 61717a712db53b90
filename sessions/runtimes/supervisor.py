"""The in-sandbox supervisor of Docker and gVisor sandboxes (docs/architecture.md, "Runtimes").

It is the container's main process, its pid 1, and runs every command itself: it starts it
(posix_spawn under runc, `python3 -I -S -c SOURCE posix-spawn`; under gVisor the root
filesystem's vfork spawner, spawn.c, or fork + exec in a tree built without one) as uid
65534 without capabilities in a session and process group of its own, and streams the output
back as frames, then the exit. A warm pool's gVisor sandbox (`… SOURCE warm`) warms gVisor up
while it waits for its claim (Supervisor.warm). The runner talks to it over the container's
attached stdio (Docker's attach stream), which no sandboxed process can reach: its descriptors
are not inherited, and /proc/<its pid>/fd is closed to another uid. A command's output is
framed as data, so it cannot forge an exit either.

This file is a standalone program, passed to `python3 -I -S -c` inside the sandbox: nothing of
Airlock, and of Python's library only modules built into the interpreter or frozen in it (under
gVisor each imported file costs milliseconds of start: json, base64 and shutil took ~90 ms).
Under gVisor's ptrace platform a system call costs ~70 us: a command's way here makes as few as
it can.

Requests on stdin: four bytes of length (big-endian), then a dict in `marshal` format (what
the runner sends; the supervisor never sends marshal, which is not safe to read from an
untrusted writer):
    {"op": "exec", "id": n, "argv": [...], "cwd": "/workspace", "env": {...}, "timeout_s": 15,
     "max_output": bytes, "stdin": bytes or None}
    {"op": "kill", "id": n}        kill command n, if it is the one running (else nothing)
    {"op": "disk"}                 answered {"reply": "disk", "used": bytes of /workspace}
Frames on stdout: one byte of kind, four of length (big-endian), then the payload:
    b"1" stdout data, b"2" stderr data, b"x" the exit (JSON), b"j" any other reply (JSON).
The first frame is {"reply": "ready", "pid": its pid, "spawn": "posix_spawn" | "vfork" | "fork"};
each exit says `spawn` again, as it was done (a spawner that did not load falls back to fork).
Their JSON holds integers and fixed words only, so it is written without the json module."""

import _signal as signal  # the module `signal` imports enum, the one file that makes it slow
import _struct as struct  # the module `struct` only re-exports it, from a file: ~2.5 ms more under gVisor
import errno
import fcntl
import marshal
import os
import select
import sys
import time

NOBODY = 65534
OUT_HIGH = 1 << 20  # bytes of frames waiting to be read by the runner before commands' pipes wait
READ = 65536
REAP_S = 10  # for every process of a command to be gone after SIGKILL
FRAME_MAX = READ  # output waiting to be sent is merged into frames of up to this much (as one read)
SPAWNER = "/usr/local/lib/airlock/spawn.so"  # spawn.c, built into the root filesystem (rootfs.py)
WARM_SPAWNS = 2  # of `true` in a warm pool's gVisor sandbox before its first request (Supervisor.warm)


def oom_counters() -> str | None:
    """The file that counts OOM kills in the sandbox's memory cgroup as runc shows it inside
    (cgroup v1 or v2); None where none is shown (gVisor: there an OOM ends the whole sandbox).
    Found once: under gVisor a system call costs ~70 us, a failed open ~90."""
    return next((path for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
                 if os.path.exists(path)), None)


def oom_kills(path: str | None) -> int:
    """OOM kills so far, read from `path` (oom_counters); 0 without one."""
    if path is None:
        return 0
    try:
        with open(path) as counters:
            for line in counters:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def nonblocking(fd: int) -> None:
    """os.set_blocking in one system call, not two: a new pipe's end has no other status flag."""
    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)


def keep_descriptors_to_itself() -> None:
    """Whatever the container runtime passed beyond stdio closes on a command's exec (Python
    opens its own descriptors close-on-exec)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:  # noqa: SIM105 - contextlib is one more file to import at start
                os.set_inheritable(int(name), False)
            except OSError:  # the directory's own descriptor, closed by now
                pass


def wait(readers: list[int], writers: list[int], timeout: float | None) -> tuple[set[int], set[int]]:
    """poll(2): no descriptor-number limit, unlike select."""
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    for fd in writers:
        poller.register(fd, select.POLLOUT | (select.POLLIN if fd in readers else 0))
    ready_r, ready_w = set(), set()
    for fd, events in poller.poll(None if timeout is None else timeout * 1000):
        if events & (select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL):
            (ready_r if fd in readers else ready_w).add(fd)
        if events & (select.POLLOUT | select.POLLERR | select.POLLHUP) and fd in writers:
            ready_w.add(fd)
    return ready_r, ready_w


def program(name: str, env: dict) -> str:
    """The file execvpe would run for `name`: as given when it holds a slash, else the first
    executable regular file of that name along the command's own PATH (checked with the real
    ids, the command's at the time); OSError as execvpe would fail (EACCES if one was found
    that may not be run, else ENOENT)."""
    if "/" in name:
        return name
    denied = False
    for directory in env.get("PATH", os.defpath).split(":"):
        candidate = f"{directory or '.'}/{name}"
        try:
            if not os.path.isfile(candidate):
                continue
        except OSError:
            continue
        if os.access(candidate, os.X_OK):
            return candidate
        denied = True
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code))


def load_spawner():
    """spawn.c's `airlock_spawn` through ctypes (~16 ms under gVisor, once), or None where it
    does not load."""
    try:
        import ctypes
        spawn = ctypes.CDLL(SPAWNER).airlock_spawn
    except (ImportError, OSError, AttributeError):
        return None
    strings = ctypes.POINTER(ctypes.c_char_p)
    spawn.argtypes = [strings, strings, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    spawn.restype = ctypes.c_int
    return ctypes, spawn


class Supervisor:
    def __init__(self, posix_spawn: bool, warm: bool = False):
        self.requests = bytearray()
        self.out = bytearray()  # frames ready to send
        self.tail, self.tail_kind = bytearray(), b""  # output not framed yet: merged while it waits
        self.running = None  # the command that runs: a dict
        self.queue = []  # requests that came while a command ran
        keep_descriptors_to_itself()
        self.oom_counters = oom_counters()
        self.null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # a command's stdin when it is given none
        os.setgroups([])  # a command is spawned with this process's supplementary groups: none
        self.spawner = None  # loaded once the runner knows this is ready (serve)
        self.how = "posix_spawn" if posix_spawn else "vfork" if os.path.exists(SPAWNER) else "fork"
        self.warms = warm  # spawns `true` before its first request (warm): a warm pool's gVisor sandbox
        for fd in (0, 1):
            os.set_blocking(fd, False)
        # A command's exit wakes the loop: SIGCHLD writes a byte to this pipe.
        self.wakeup, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)

    # -- the runner's side ------------------------------------------------------------------
    def frame(self, kind: bytes, payload: bytes) -> None:
        """Queue a frame. Output (b"1", b"2") waits in `tail`, merged with more of the same
        stream while the runner has not taken what went before: a command writing a byte at a
        time costs the runner one frame per turn, not one per write."""
        if kind in (b"1", b"2") and kind == self.tail_kind and len(self.tail) + len(payload) <= FRAME_MAX:
            self.tail += payload
            return
        self.seal()
        if kind in (b"1", b"2"):
            self.tail, self.tail_kind = bytearray(payload), kind
        else:
            self.out += kind + struct.pack(">I", len(payload)) + payload

    def seal(self) -> None:
        if self.tail:
            self.out += self.tail_kind + struct.pack(">I", len(self.tail)) + self.tail
        self.tail, self.tail_kind = bytearray(), b""

    def reply(self, kind: bytes, message: dict) -> None:
        """`message`: integers and strings of [a-z_] only (the exit's reason, a reply's name)."""
        fields = (f'"{key}": {value}' if isinstance(value, int) else f'"{key}": "{value}"'
                  for key, value in message.items())
        self.frame(kind, ("{" + ", ".join(fields) + "}").encode())

    def flush(self) -> None:
        if not self.out:
            self.seal()  # the runner took everything before: send what waited
        while self.out:
            try:
                sent = os.write(1, self.out[:READ])
            except BlockingIOError:
                return
            del self.out[:sent]

    def read_requests(self) -> bool:
        """Take what arrived on stdin; False once the runner has gone (stdin ended)."""
        try:
            data = os.read(0, READ)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.requests += data
        while len(self.requests) >= 4:
            size = struct.unpack(">I", self.requests[:4])[0]
            if len(self.requests) < 4 + size:
                break
            # From the runner only: no sandboxed process can write to this stdin (the module docstring).
            request = marshal.loads(self.requests[4:4 + size])  # noqa: S302
            del self.requests[:4 + size]
            self.handle(request)
        return True

    def handle(self, request: dict) -> None:
        op = request.get("op")
        if op == "kill":
            if self.running is not None and self.running["id"] == request.get("id"):
                self.stop("killed")
        elif op == "exec" and self.running is not None:
            self.queue.append(request)
        elif op == "exec":
            self.start(request)
        elif op == "disk":
            usage = os.statvfs("/workspace")
            self.reply(b"j", {"reply": "disk", "used": (usage.f_blocks - usage.f_bfree) * usage.f_frsize})

    # -- a command --------------------------------------------------------------------------
    def start(self, request: dict) -> None:
        command = {"id": request["id"], "reason": None, "oom_kills": oom_kills(self.oom_counters), "output": 0,
                   "max_output": request["max_output"], "deadline": time.monotonic() + request["timeout_s"],
                   "pipes": {}, "stdin": None, "pid": None}
        stdin = request.get("stdin")
        try:
            pid, pipes, stdin_fd = self.spawn(request, stdin is not None)
        except (OSError, ValueError) as exc:  # ValueError: a string no file name can hold (a lone surrogate)
            why = getattr(exc, "strerror", None) or "an argument, the environment or the cwd cannot be encoded"
            self.frame(b"2", f"airlock: cannot run {request['argv'][0]!r}: {why}\n".encode(errors="replace"))
            self.reply(b"x", {"id": request["id"], "exit_code": 127, "reason": "exited", "output": 0,
                              "spawn": self.how})
            return
        command.update(pid=pid, pipes=pipes)
        if stdin_fd is not None:
            command["stdin"] = [stdin_fd, memoryview(stdin)]  # what is left to write, without copies
        self.running = command

    def spawn(self, request: dict, with_stdin: bool):
        """Start the command: its own session and process group, uid and gid 65534 with no
        supplementary group and no capability (its bounding set keeps the container's three,
        which nothing it executes can gain under no-new-privileges), its cwd and program looked
        up with those rights, first in line for the OOM killer; stdin from a pipe or /dev/null,
        its output into pipes, no other descriptor of this process, SIGPIPE at its default."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if with_stdin else (self.null, None)
        try:
            how = {"posix_spawn": self.spawn_posix, "vfork": self.spawn_vfork, "fork": self.spawn_fork}[self.how]
            pid = how(request, in_r, out_w, err_w)
        except (OSError, ValueError):  # reported by start
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                if fd != self.null:
                    os.close(fd)
        for fd in (out_r, err_r) + ((in_w,) if in_w is not None else ()):
            nonblocking(fd)
        return pid, {out_r: b"1", err_r: b"2"}, in_w

    @staticmethod
    def spawn_posix(request: dict, in_r: int, out_w: int, err_w: int) -> int:
        """posix_spawn (a vfork: no copy of this process's memory). The child is born with this
        process's ids, so for the spawn this process takes 65534 as its real and effective uid
        and gid (0 kept as saved, to take root back): the cwd and the program along the
        command's PATH are looked up with the command's rights, and its exec clears every
        capability. The command may run before root is taken back and, its real uid being this
        process's then, may signal it: only where the kernel drops what a pid namespace's init
        does not handle (runc; SIGINT is ignored here, SIGCHLD's handler does nothing), never
        under gVisor, which delivers them (`spawn_fork` there)."""
        os.setresgid(NOBODY, NOBODY, 0)
        os.setresuid(NOBODY, NOBODY, 0)
        try:
            os.chdir(request["cwd"])
            pid = os.posix_spawn(
                program(request["argv"][0], request["env"]), request["argv"], request["env"], setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGXFSZ),  # what this process ignores
                file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                              (os.POSIX_SPAWN_DUP2, err_w, 2)])
        finally:
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
            os.chdir("/")
        os.setresuid(0, NOBODY, 0)  # its score is written as its owner; its ids keep it from signalling this one
        try:
            with open(f"/proc/{pid}/oom_score_adj", "w") as adj:
                adj.write("1000")
        except OSError:
            pass
        finally:
            os.setresuid(0, 0, 0)
        return pid

    def spawn_vfork(self, request: dict, in_r: int, out_w: int, err_w: int) -> int:
        """spawn.c: the child takes its ids, cwd and program itself before exec, and this process
        keeps root throughout, as with fork, at the cost of a posix_spawn."""
        ctypes, spawn = self.spawner
        argv = [os.fsencode(arg) for arg in request["argv"]]
        envp = [os.fsencode(f"{name}={value}") for name, value in request["env"].items()]
        path, cwd = os.fsencode(request["env"].get("PATH", os.defpath)), os.fsencode(request["cwd"])
        if any(b"\0" in item for item in (*argv, *envp, path, cwd)):
            raise OSError(errno.EINVAL, "an argument, the environment or the cwd holds a NUL byte")
        # The signals this process handles or ignores, for the child to set to their default:
        # Python knows each one's disposition (read from the kernel when it started, kept since).
        reset = [signum for signum in signal.valid_signals() if signal.getsignal(signum) is not signal.SIG_DFL]
        error = ctypes.c_int(0)
        pid = spawn((ctypes.c_char_p * (len(argv) + 1))(*argv, None),
                    (ctypes.c_char_p * (len(envp) + 1))(*envp, None), path, cwd, in_r, out_w, err_w,
                    (ctypes.c_int * (len(reset) + 1))(*reset, 0), ctypes.byref(error))
        if pid < 0:
            raise OSError(error.value, os.strerror(error.value))
        return pid

    @staticmethod
    def spawn_fork(request: dict, in_r: int, out_w: int, err_w: int) -> int:
        """fork, then in the child: its ids, cwd and program, exec. This process keeps root
        throughout, so no process of the sandbox may ever signal it."""
        # An error of the child before exec (a cwd or argv[0] that is missing) comes back here.
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:  # the pids limit: the command's leftovers are at it
            os.close(status_r)
            os.close(status_w)
            raise
        if pid == 0:  # the child: only async-signal-safe work until exec
            try:
                os.setsid()
                for fd, target in ((in_r, 0), (out_w, 1), (err_w, 2)):
                    os.dup2(fd, target)  # every other descriptor is close-on-exec
                with open("/proc/self/oom_score_adj", "w") as adj:
                    adj.write("1000")
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                for ignored in (signal.SIGPIPE, signal.SIGINT, signal.SIGXFSZ):
                    signal.signal(ignored, signal.SIG_DFL)
                os.chdir(request["cwd"])
                os.execvpe(request["argv"][0], request["argv"], request["env"])  # noqa: S606 - argv, never a shell
            except OSError as exc:
                os.write(status_w, struct.pack(">i", exc.errno or 1))
            finally:
                os._exit(127)
        os.close(status_w)
        failure = os.read(status_r, 4)
        os.close(status_r)
        if failure:
            os.waitpid(pid, 0)
            code = struct.unpack(">i", failure)[0]
            raise OSError(code, os.strerror(code))
        return pid

    def warm(self) -> None:
        """A gVisor sandbox's first spawns are its slowest: `true` through the driver took ~25 ms
        first, ~17 second, ~9 from the third on, and spawns run side by side did not warm it
        (docs/architecture.md, "The supervisor"). A warm pool's sandbox (argv `warm`) waits
        for its claim: meanwhile, until the first request comes, its supervisor spawns `true`
        WARM_SPAWNS times, one after the other, as a command would be (65534, no output, nothing
        left running), and the session's first commands find it warm; a request that comes
        meanwhile waits for one spawn at most."""
        for _ in range(WARM_SPAWNS):
            if wait([0], [], 0)[0]:  # a request (or the runner's end) came first
                return
            try:
                null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
                try:
                    pid = self.spawn_vfork({"argv": ["true"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/"},
                                           null, null, null)
                finally:
                    os.close(null)
            except OSError:  # a tree without `true`, or no descriptor left: nothing to warm with
                return
            os.waitpid(pid, 0)

    def stop(self, reason: str) -> None:
        command = self.running
        if command["reason"] is None:
            command["reason"] = reason
        self.reap()

    def collect(self) -> bool:
        """Wait for every child that ended: the command, and what it left behind (orphans come to
        pid 1, which this is). True while any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            command = self.running
            if command is not None and pid == command["pid"]:
                command["pid"], command["status"] = None, status

    def reap(self) -> None:
        """Kill every other process of the sandbox until none is left. kill(-1) from pid 1
        reaches them all whatever their state (a process whose main thread has exited shows as
        a zombie in /proc while its other threads run on), and each comes back to pid 1 to be
        collected, so none is missed however fast a command forks."""
        deadline = time.monotonic() + REAP_S
        while time.monotonic() < deadline:
            try:  # noqa: SIM105 - contextlib is one more file to import at start
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:  # nothing left to signal
                pass
            if not self.collect():
                return
            time.sleep(0.001)
        os.write(2, b"airlock supervisor: processes outlived SIGKILL for %d s\n" % REAP_S)

    def pump(self) -> None:
        """One turn of a running command: its output, its stdin, its deadline, its end."""
        command = self.running
        if command["reason"] is None and time.monotonic() > command["deadline"]:
            self.stop("timeout")
        if command["stdin"] is not None and not command["stdin"][1]:
            os.close(command["stdin"][0])
            command["stdin"] = None
        if command["pid"] is not None:
            self.collect()
            if command["pid"] is None:
                self.reap()  # what it left behind dies with it, and the pipes it held close
        if command["pid"] is None and not command["pipes"]:
            self.finish(command)

    def finish(self, command: dict) -> None:
        if command["stdin"] is not None:
            os.close(command["stdin"][0])
        reason = command["reason"] or ("oom" if oom_kills(self.oom_counters) > command["oom_kills"] else "exited")
        self.reply(b"x", {"id": command["id"], "exit_code": os.waitstatus_to_exitcode(command["status"]),
                          "reason": reason, "output": command["output"], "spawn": self.how})
        self.running = None
        while self.queue and self.running is None:
            self.start(self.queue.pop(0))

    def read_output(self, fd: int) -> None:
        command = self.running
        try:
            data = os.read(fd, READ)
        except BlockingIOError:
            return
        if not data:
            os.close(fd)
            del command["pipes"][fd]
            return
        if command["reason"] is not None:
            return  # stopped: drained and dropped until the pipe ends
        if command["output"] + len(data) > command["max_output"]:
            self.stop("output_limit")
            return
        command["output"] += len(data)
        self.frame(command["pipes"][fd], data)

    def write_stdin(self) -> None:
        fd, data = self.running["stdin"]
        try:
            sent = os.write(fd, data[:READ])
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin: the rest is dropped
            sent = len(data)
        self.running["stdin"][1] = data[sent:]

    # -- the loop ---------------------------------------------------------------------------
    def serve(self) -> None:
        self.reply(b"j", {"reply": "ready", "pid": os.getpid(), "spawn": self.how})
        self.flush()
        if self.how == "vfork":  # off the sandbox's start: a warm pool's sandbox has it loaded when claimed
            self.spawner = load_spawner()
            if self.spawner is None:
                self.how = "fork"
            elif self.warms:
                self.warm()
        while True:
            command = self.running
            readers = [0, self.wakeup]
            writers = [1] if self.out or self.tail else []
            timeout = None
            if command is not None:
                if len(self.out) + len(self.tail) < OUT_HIGH or command["reason"] is not None:
                    readers += list(command["pipes"])
                if command["stdin"] is not None and command["stdin"][1]:
                    writers.append(command["stdin"][0])
                if command["reason"] is None:
                    timeout = max(0.0, command["deadline"] - time.monotonic())
            ready_r, ready_w = wait(readers, writers, timeout)
            if self.wakeup in ready_r:
                try:  # noqa: SIM105 - contextlib is one more file to import at start
                    os.read(self.wakeup, 4096)  # a byte a signal: what is left (if any) wakes the next turn
                except BlockingIOError:
                    pass
            if command is None:
                self.collect()  # whatever a reap left to collect
            if 0 in ready_r and not self.read_requests():
                self.reap()
                return
            if 1 in ready_w:
                self.flush()
            if command is not None:
                for fd in ready_r:
                    if fd in command["pipes"]:
                        self.read_output(fd)
                if command["stdin"] is not None and command["stdin"][0] in ready_w:
                    self.write_stdin()
                self.pump()
            self.flush()


if __name__ == "__main__":
    if os.getpid() != 1:  # reap() kills every process it may signal: only its own sandbox's
        sys.exit("airlock supervisor: it runs as its sandbox's pid 1 only")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Pid 1 gets only the signals it handles (under runc; gVisor delivers every signal to it):
    # SIGCHLD, whose handler does nothing. Not SIGINT, which Python's handler would end it by:
    # with posix_spawn, a command may signal it while it spawns (Supervisor.spawn_posix).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Supervisor(posix_spawn="posix-spawn" in sys.argv[1:], warm="warm" in sys.argv[1:]).serve()
