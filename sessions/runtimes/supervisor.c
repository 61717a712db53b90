/* The in-sandbox supervisor of Docker and gVisor sandboxes (docs/architecture.md, "The supervisor").
 *
 * It is the container's main process, its pid 1, and runs every command itself: it starts it as
 * uid 65534 without capabilities in a session and process group of its own, streams the output
 * back as frames, then the exit, kills the command's whole tree on timeout, kill and output
 * limit, and everything a command left behind after it ends. It is C, built static into the
 * root filesystem (rootfs.py): under gVisor's ptrace platform a system call costs ~70 us, and a
 * supervisor in Python sent its first frame ~65 ms after the container started; this one, ~2 ms.
 *
 * The runner talks to it over the container's attached stdio (Docker's attach stream), which no
 * sandboxed process can reach: its descriptors are close-on-exec, and /proc/1/fd is closed to
 * another uid. A command's output is framed as data, so it cannot forge an exit either.
 *
 * A command is started with clone(CLONE_VM | CLONE_VFORK): no copy of the supervisor's memory
 * (under gVisor a fork costs ~10 ms). The child, while the supervisor waits for its exec, takes
 * its own session, its stdio, the OOM killer's first place, uid and gid 65534 with no
 * supplementary group, its cwd, default signal handlers, then runs the program along PATH with
 * those rights. The supervisor never changes its own ids, so no command can ever signal it. The
 * child shares the supervisor's memory: it makes only system calls (ids changed by raw
 * syscalls: glibc's setresuid would signal every thread of a process it thinks it is), and
 * reports a failure before exec in `error`, which the supervisor reads once clone returns.
 *
 * Requests on stdin, from the runner only (channel.py writes them): four bytes of length, then
 * the request, whose first byte says what it is (integers big-endian):
 *     "e" exec: id (u32), timeout in ms (u32), max output bytes (u64), argc (u32), envc (u32),
 *         has stdin (u8), then the cwd, each argument, each "NAME=value" and, if it has one,
 *         stdin, each as a length (u32) and its bytes
 *     "k" kill: id (u32), killed if it is the command that runs (else nothing)
 *     "d" disk: answered {"reply": "disk", "used": bytes used in /workspace}
 * Frames on stdout: one byte of kind, four of length (big-endian), then the payload:
 *     "1" stdout data, "2" stderr data, "x" the exit (JSON: id, exit_code, reason, output),
 *     "j" any other reply (JSON). The first frame is {"reply": "ready", "pid": 1}.
 * The JSON holds integers and fixed words only. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534
#define READ_BYTES 65536  /* one read of a pipe or of stdin, and the largest output frame */
#define OUT_HIGH (1 << 20)  /* bytes of frames waiting for the runner before commands' pipes wait */
#define TAIL_HOLD_NS 1000000  /* a command's output, under TAIL_SMALL bytes, waits this long for more */
#define TAIL_SMALL 4096
#define REQUESTS_KEPT (1 << 20)  /* bytes of the requests' buffer kept once it is empty */
#define REAP_S 10  /* for every process of a command to be gone after SIGKILL */
#define WARM_SPAWNS 2  /* of `true` in a warm pool's gVisor sandbox before its first request (warm) */
#define PATH_BYTES 4096
#define DEFAULT_PATH "/bin:/usr/bin"  /* a command's PATH when its environment has none (os.defpath) */

/* Bytes waiting: appended at the end, taken from the front without moving the rest. */
struct buffer {
    char *data;
    size_t start, end, capacity;
};

struct command {
    uint32_t id;
    const char *reason;  /* NULL until it is stopped: "timeout", "killed" or "output_limit" */
    long oom_kills;  /* the sandbox's OOM kills when it started */
    uint64_t output, max_output;
    int64_t deadline_ns;
    pid_t pid;  /* 0 once collected */
    int status;
    int fds[2];  /* its stdout and stderr pipes, -1 once they ended */
    int stdin_fd;  /* -1 without stdin, or once all of it was written */
    char *stdin_data;
    size_t stdin_sent, stdin_left;
};

struct queued {  /* an exec that came while a command ran */
    struct queued *next;
    size_t size;
    char data[];
};

static struct buffer requests, out, tail;  /* tail: output not framed yet, merged while it waits */
static char tail_kind;
static int64_t tail_since;  /* when the tail's first byte came */
static struct command current;
static struct command *running;  /* &current while a command runs */
static struct queued *queue_head, **queue_end = &queue_head;
static const char *oom_path;
static int null_fd, wakeup_r, wakeup_w, warms;

static void say(const char *message) {
    ssize_t ignored = write(2, message, strlen(message));
    (void)ignored;
}

static void die(const char *message) {
    say(message);
    _exit(1);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* -- buffers ------------------------------------------------------------------------------ */
static size_t length(const struct buffer *b) {
    return b->end - b->start;
}

static void append(struct buffer *b, const void *data, size_t size) {
    if (b->end + size > b->capacity && b->start > 0) {
        memmove(b->data, b->data + b->start, length(b));
        b->end -= b->start;
        b->start = 0;
    }
    if (b->end + size > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->end + size) {
            capacity *= 2;
        }
        char *grown = realloc(b->data, capacity);
        if (grown == NULL) {
            die("airlock supervisor: out of memory\n");
        }
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->end, data, size);
    b->end += size;
}

static void consume(struct buffer *b, size_t size) {
    b->start += size;
    if (b->start == b->end) {
        b->start = b->end = 0;
    }
}

static uint32_t be32(const char *at) {
    const unsigned char *u = (const unsigned char *)at;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/* -- frames to the runner ----------------------------------------------------------------- */
static void header(struct buffer *b, char kind, size_t size) {
    char head[5] = {kind, (char)(size >> 24), (char)(size >> 16), (char)(size >> 8), (char)size};
    append(b, head, sizeof head);
}

static void seal(void) {
    if (length(&tail)) {
        header(&out, tail_kind, length(&tail));
        append(&out, tail.data + tail.start, length(&tail));
        consume(&tail, length(&tail));
    }
    tail_kind = 0;
}

/* Output ("1", "2") waits in `tail`, merged with more of the same stream while the runner has
 * not taken what went before, or for up to TAIL_HOLD_NS while it is small: a command writing a
 * byte at a time costs the runner a frame a millisecond at most, not one per write (the loop
 * here takes a write in microseconds). Any other frame, an exit included, goes after it at once. */
static void frame(char kind, const char *payload, size_t size) {
    int output = kind == '1' || kind == '2';
    if (output && kind == tail_kind && length(&tail) + size <= READ_BYTES) {
        append(&tail, payload, size);
        return;
    }
    seal();
    if (output) {
        append(&tail, payload, size);
        tail_kind = kind;
        tail_since = now_ns();
    } else {
        header(&out, kind, size);
        append(&out, payload, size);
    }
}

static void reply(char kind, const char *json) {
    frame(kind, json, strlen(json));
}

/* Milliseconds until the tail is due to be framed (0: now). */
static int64_t tail_wait_ms(void) {
    if (length(&tail) >= TAIL_SMALL) {
        return 0;
    }
    int64_t left = tail_since + TAIL_HOLD_NS - now_ns();
    return left <= 0 ? 0 : (left + 999999) / 1000000;
}

static void flush(void) {
    if (length(&out) == 0 && length(&tail) && tail_wait_ms() == 0) {
        seal();  /* the runner took everything before: send what waited */
    }
    while (length(&out)) {
        size_t size = length(&out) < READ_BYTES ? length(&out) : READ_BYTES;
        ssize_t sent = write(1, out.data + out.start, size);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                return;
            }
            die("");  /* the runner is gone: so is its sandbox */
        }
        consume(&out, (size_t)sent);
    }
}

/* -- the sandbox -------------------------------------------------------------------------- */
/* The file that counts OOM kills in the sandbox's memory cgroup as runc shows it inside (cgroup
 * v1 or v2); NULL where none is shown (gVisor: there an OOM ends the whole sandbox). */
static const char *oom_counters(void) {
    static const char *const paths[] = {"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        if (access(paths[i], F_OK) == 0) {
            return paths[i];
        }
    }
    return NULL;
}

static long oom_kills(void) {
    if (oom_path == NULL) {
        return 0;
    }
    int fd = open(oom_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char text[1024];
    ssize_t size = read(fd, text, sizeof text - 1);
    close(fd);
    if (size <= 0) {
        return 0;
    }
    text[size] = '\0';
    for (char *line = text; line != NULL; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "oom_kill ", 9) == 0) {
            return strtol(line + 9, NULL, 10);
        }
    }
    return 0;
}

/* Wait for every child that ended: the command, and what it left behind (orphans come to pid 1,
 * which this is). 1 while any child is left. */
static int collect(void) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0) {
            if (errno == EINTR) {
                continue;
            }
            return 0;
        }
        if (pid == 0) {
            return 1;
        }
        if (running != NULL && pid == running->pid) {
            running->pid = 0;
            running->status = status;
        }
    }
}

/* Kill every other process of the sandbox until none is left. kill(-1) from pid 1 reaches them
 * all whatever their state (a process whose main thread has exited shows as a zombie in /proc
 * while its other threads run on), and each comes back to pid 1 to be collected, so none is
 * missed however fast a command forks. */
static void reap(void) {
    int64_t deadline = now_ns() + (int64_t)REAP_S * 1000000000;
    while (now_ns() < deadline) {
        kill(-1, SIGKILL);
        if (!collect()) {
            return;
        }
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    say("airlock supervisor: processes outlived SIGKILL for 10 s\n");
}

/* -- a command's spawn -------------------------------------------------------------------- */
struct spawn {
    char *const *argv;
    char *const *envp;
    const char *path;  /* the command's PATH */
    const char *cwd;
    int fds[3];
    sigset_t mask;  /* the supervisor's signal mask, restored just before exec */
    volatile int error;
};

static int fail(struct spawn *s, int code) {
    s->error = code ? code : EINVAL;
    _exit(127);
}

/* As Python's os.execvpe searches: every entry is tried; the first error other than ENOENT and
 * ENOTDIR is reported, else the last. */
static void run_along_path(struct spawn *s) {
    const char *name = s->argv[0];
    if (strchr(name, '/') != NULL) {
        syscall(SYS_execve, name, s->argv, s->envp);
        fail(s, errno);
    }
    size_t size = strlen(name);
    int saved = 0, last = ENOENT;
    for (const char *start = s->path;;) {
        const char *end = strchrnul(start, ':');
        size_t directory = (size_t)(end - start);
        char candidate[PATH_BYTES];
        if (directory == 0) {  /* an empty entry is the cwd */
            candidate[0] = '.';
            directory = 1;
        } else if (directory < PATH_BYTES) {
            memcpy(candidate, start, directory);
        }
        if (directory + 1 + size < PATH_BYTES) {
            candidate[directory] = '/';
            memcpy(candidate + directory + 1, name, size + 1);
            syscall(SYS_execve, candidate, s->argv, s->envp);
            last = errno;
            if (saved == 0 && last != ENOENT && last != ENOTDIR) {
                saved = last;
            }
        } else {
            last = ENAMETOOLONG;
            saved = saved ? saved : last;
        }
        if (*end == '\0') {
            break;
        }
        start = end + 1;
    }
    fail(s, saved ? saved : last);
}

static int child(void *argument) {
    struct spawn *s = argument;
    struct sigaction standard;
    memset(&standard, 0, sizeof standard);
    standard.sa_handler = SIG_DFL;
    static const int handled[] = {SIGCHLD, SIGPIPE, SIGINT};  /* what main() handles or ignores */
    for (size_t i = 0; i < sizeof handled / sizeof *handled; i++) {
        sigaction(handled[i], &standard, NULL);
    }
    if (syscall(SYS_setsid) < 0) {
        fail(s, errno);
    }
    for (int target = 0; target < 3; target++) {  /* every other descriptor is close-on-exec */
        if (syscall(SYS_dup3, s->fds[target], target, 0) < 0) {  /* dup3: every architecture has it */
            fail(s, errno);
        }
    }
    int adj = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
        syscall(SYS_write, adj, "1000", 4);
        syscall(SYS_close, adj);
    }
    if (syscall(SYS_setgroups, 0, NULL) || syscall(SYS_setresgid, NOBODY, NOBODY, NOBODY)
            || syscall(SYS_setresuid, NOBODY, NOBODY, NOBODY)) {
        fail(s, errno);
    }
    if (syscall(SYS_chdir, s->cwd)) {
        fail(s, errno);
    }
    sigprocmask(SIG_SETMASK, &s->mask, NULL);
    run_along_path(s);
    return 127;
}

/* The command's pid, or -1 with errno set as exec would set it (the child reaped). */
static pid_t spawn(char *const *argv, char *const *envp, const char *path, const char *cwd, int in, int out_fd,
                   int err_fd) {
    static char stack[1 << 16] __attribute__((aligned(16)));  /* one spawn at a time */
    struct spawn s = {.argv = argv, .envp = envp, .path = path, .cwd = cwd, .fds = {in, out_fd, err_fd}};
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &s.mask);  /* no handler of the supervisor's runs in the child */
    pid_t pid = clone(child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &s);
    int cloned = errno;
    sigprocmask(SIG_SETMASK, &s.mask, NULL);
    if (pid < 0) {
        errno = cloned;
        return -1;
    }
    if (s.error) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        errno = s.error;
        return -1;
    }
    return pid;
}

/* -- requests ----------------------------------------------------------------------------- */
struct reader {
    const char *at;
    size_t left;
    int short_of_bytes;
};

static const char *take(struct reader *r, size_t size) {
    if (r->short_of_bytes || r->left < size) {
        r->short_of_bytes = 1;
        return NULL;
    }
    const char *at = r->at;
    r->at += size;
    r->left -= size;
    return at;
}

static uint32_t take32(struct reader *r) {
    const char *at = take(r, 4);
    return at ? be32(at) : 0;
}

/* A length-prefixed string as a C string (malloc'd); *nul set if it holds a NUL byte. */
static char *take_string(struct reader *r, int *nul) {
    uint32_t size = take32(r);
    const char *at = take(r, size);
    char *copy = malloc(at ? (size_t)size + 1 : 1);  /* (a short request asks for nothing) */
    if (copy == NULL) {
        die("airlock supervisor: out of memory\n");
    }
    if (at != NULL) {
        memcpy(copy, at, size);
        *nul |= memchr(at, '\0', size) != NULL;
    }
    copy[at ? size : 0] = '\0';
    return copy;
}

static void free_strings(char **strings) {
    for (char **s = strings; s && *s; s++) {
        free(*s);
    }
    free(strings);
}

static void refuse(uint32_t id, const char *program, const char *why) {
    char message[PATH_BYTES + 256];
    snprintf(message, sizeof message, "airlock: cannot run '%.4000s': %s\n", program, why);
    frame('2', message, strlen(message));
    char exit_frame[128];
    snprintf(exit_frame, sizeof exit_frame, "{\"id\": %" PRIu32 ", \"exit_code\": 127, \"reason\": \"exited\", "
             "\"output\": 0}", id);
    reply('x', exit_frame);
}

static void nonblocking(int fd) {
    fcntl(fd, F_SETFL, O_NONBLOCK);  /* a new pipe's end has no other status flag */
}

/* Start the command of an exec request; report it failed (exit 127) if it cannot start. */
static void start(const char *request, size_t size) {
    struct reader r = {.at = request + 1, .left = size - 1};
    uint32_t id = take32(&r), timeout_ms = take32(&r);
    const char *max = take(&r, 8);
    uint64_t max_output = max ? (uint64_t)be32(max) << 32 | be32(max + 4) : 0;
    uint32_t argc = take32(&r), envc = take32(&r);
    const char *has_stdin = take(&r, 1);
    int nul = 0;
    char *cwd = take_string(&r, &nul);
    if (r.short_of_bytes || argc == 0 || argc > r.left / 4 || envc > r.left / 4) {
        free(cwd);
        refuse(id, "?", "the runner's request was malformed");
        return;
    }
    char **argv = calloc((size_t)argc + 1, sizeof *argv), **envp = calloc((size_t)envc + 1, sizeof *envp);
    if (argv == NULL || envp == NULL) {
        die("airlock supervisor: out of memory\n");
    }
    for (uint32_t i = 0; i < argc; i++) {
        argv[i] = take_string(&r, &nul);
    }
    const char *path = DEFAULT_PATH;
    for (uint32_t i = 0; i < envc; i++) {
        envp[i] = take_string(&r, &nul);
        if (strncmp(envp[i], "PATH=", 5) == 0) {
            path = envp[i] + 5;
        }
    }
    uint32_t stdin_size = has_stdin && *has_stdin ? take32(&r) : 0;
    /* An empty stdin is /dev/null: a pipe with nothing to write would never be closed. */
    const char *stdin_data = stdin_size ? take(&r, stdin_size) : NULL;
    int fds[2][2] = {{-1, -1}, {-1, -1}}, in[2] = {null_fd, -1};
    if (r.short_of_bytes) {
        refuse(id, argv[0], "the runner's request was malformed");
    } else if (nul) {
        refuse(id, argv[0], "an argument, the environment or the cwd holds a NUL byte");
    } else if (pipe2(fds[0], O_CLOEXEC) || pipe2(fds[1], O_CLOEXEC) || (stdin_data && pipe2(in, O_CLOEXEC))) {
        refuse(id, argv[0], strerror(errno));
    } else {
        current = (struct command){.id = id, .oom_kills = oom_kills(), .max_output = max_output,
                                   .deadline_ns = now_ns() + (int64_t)timeout_ms * 1000000,
                                   .fds = {fds[0][0], fds[1][0]}, .stdin_fd = -1};
        current.pid = spawn(argv, envp, path, cwd, in[0], fds[0][1], fds[1][1]);
        if (current.pid < 0) {
            refuse(id, argv[0], strerror(errno));
        } else {
            running = &current;
            nonblocking(fds[0][0]);
            nonblocking(fds[1][0]);
            if (stdin_data != NULL) {
                current.stdin_fd = in[1];
                current.stdin_left = stdin_size;
                current.stdin_data = malloc(stdin_size ? stdin_size : 1);
                if (current.stdin_data == NULL) {
                    die("airlock supervisor: out of memory\n");
                }
                memcpy(current.stdin_data, stdin_data, stdin_size);
                nonblocking(in[1]);
            }
        }
    }
    for (int i = 0; i < 2; i++) {  /* the command's ends, and ours where it did not start */
        for (int end = 0; end < 2; end++) {
            if (fds[i][end] >= 0 && (end == 1 || running == NULL)) {
                close(fds[i][end]);
            }
        }
    }
    if (in[0] != null_fd) {
        close(in[0]);
    }
    if (in[1] >= 0 && running == NULL) {
        close(in[1]);
    }
    free(cwd);
    free_strings(argv);
    free_strings(envp);
}

static void stop(const char *reason) {
    if (running->reason == NULL) {
        running->reason = reason;
    }
    reap();
}

static void handle(const char *request, size_t size) {
    char op = size ? request[0] : 0;
    if (op == 'k' && size >= 5) {
        if (running != NULL && running->id == be32(request + 1)) {
            stop("killed");
        }
    } else if (op == 'e' && running != NULL) {
        struct queued *waiting = malloc(sizeof *waiting + size);
        if (waiting == NULL) {
            die("airlock supervisor: out of memory\n");
        }
        waiting->next = NULL;
        waiting->size = size;
        memcpy(waiting->data, request, size);
        *queue_end = waiting;
        queue_end = &waiting->next;
    } else if (op == 'e') {
        start(request, size);
    } else if (op == 'd') {
        struct statvfs usage;
        unsigned long long used = 0;
        if (statvfs("/workspace", &usage) == 0) {
            used = (unsigned long long)(usage.f_blocks - usage.f_bfree) * usage.f_frsize;
        }
        char message[96];
        snprintf(message, sizeof message, "{\"reply\": \"disk\", \"used\": %llu}", used);
        reply('j', message);
    } else {
        say("airlock supervisor: a request it does not know was ignored\n");
    }
}

/* Take what arrived on stdin; 0 once the runner has gone (stdin ended). */
static int read_requests(void) {
    char data[READ_BYTES];
    ssize_t size = read(0, data, sizeof data);
    if (size < 0) {
        return errno == EAGAIN || errno == EINTR;
    }
    if (size == 0) {
        return 0;
    }
    append(&requests, data, (size_t)size);
    while (length(&requests) >= 4) {
        size_t request = be32(requests.data + requests.start);
        if (length(&requests) < 4 + request) {
            break;
        }
        handle(requests.data + requests.start + 4, request);
        consume(&requests, 4 + request);
    }
    if (length(&requests) == 0 && requests.capacity > REQUESTS_KEPT) {  /* a large stdin came: give it back */
        free(requests.data);
        requests = (struct buffer){0};
    }
    return 1;
}

/* -- a command's course ------------------------------------------------------------------- */
static void finish(struct command *command) {
    if (command->stdin_fd >= 0) {
        close(command->stdin_fd);
    }
    free(command->stdin_data);
    const char *reason = command->reason ? command->reason : oom_kills() > command->oom_kills ? "oom" : "exited";
    int status = command->status;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : status;
    char message[160];
    snprintf(message, sizeof message, "{\"id\": %" PRIu32 ", \"exit_code\": %d, \"reason\": \"%s\", \"output\": %"
             PRIu64 "}", command->id, code, reason, command->output);
    reply('x', message);
    running = NULL;
    while (queue_head != NULL && running == NULL) {
        struct queued *next = queue_head;
        queue_head = next->next;
        if (queue_head == NULL) {
            queue_end = &queue_head;
        }
        start(next->data, next->size);
        free(next);
    }
}

static void read_output(int index) {
    struct command *command = running;
    char data[READ_BYTES];
    ssize_t size = read(command->fds[index], data, sizeof data);
    if (size < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    if (size <= 0) {
        close(command->fds[index]);
        command->fds[index] = -1;
        return;
    }
    if (command->reason != NULL) {
        return;  /* stopped: drained and dropped until the pipe ends */
    }
    if (command->output + (uint64_t)size > command->max_output) {
        stop("output_limit");
        return;
    }
    command->output += (uint64_t)size;
    frame(index ? '2' : '1', data, (size_t)size);
}

static void write_stdin(void) {
    struct command *command = running;
    size_t size = command->stdin_left < READ_BYTES ? command->stdin_left : READ_BYTES;
    ssize_t sent = write(command->stdin_fd, command->stdin_data + command->stdin_sent, size);
    if (sent < 0) {
        if (errno == EAGAIN || errno == EINTR) {
            return;
        }
        sent = (ssize_t)command->stdin_left;  /* the command closed its stdin: the rest is dropped */
    }
    command->stdin_sent += (size_t)sent;
    command->stdin_left -= (size_t)sent;
}

/* One turn of a running command: its deadline, its stdin, its end. */
static void pump(void) {
    struct command *command = running;
    if (command->reason == NULL && now_ns() > command->deadline_ns) {
        stop("timeout");
    }
    if (command->stdin_fd >= 0 && command->stdin_left == 0) {
        close(command->stdin_fd);
        command->stdin_fd = -1;
        free(command->stdin_data);  /* the sandbox's memory, not kept for the command's whole run */
        command->stdin_data = NULL;
    }
    if (command->pid != 0) {
        collect();
        if (command->pid == 0) {
            reap();  /* what it left behind dies with it, and the pipes it held close */
        }
    }
    if (command->pid == 0 && command->fds[0] < 0 && command->fds[1] < 0) {
        finish(command);
    }
}

/* A gVisor sandbox's first spawns are its slowest (docs/architecture.md, "The supervisor"). A
 * warm pool's sandbox (argv "warm") waits for its claim: meanwhile, until the first request
 * comes, it spawns `true` WARM_SPAWNS times, as a command would be (65534, no output, nothing
 * left running), and the session's first commands find it warm; a request that comes meanwhile
 * waits for one spawn at most. */
static void warm(void) {
    static char *const argv[] = {"true", NULL}, *const envp[] = {"PATH=/usr/bin:/bin", NULL};
    for (int i = 0; i < WARM_SPAWNS; i++) {
        struct pollfd request = {.fd = 0, .events = POLLIN};
        if (poll(&request, 1, 0) != 0) {  /* a request (or the runner's end) came first */
            return;
        }
        pid_t pid = spawn(argv, envp, "/usr/bin:/bin", "/", null_fd, null_fd, null_fd);
        if (pid < 0) {  /* a tree without `true`: nothing to warm with */
            return;
        }
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
}

static void serve(void) {
    reply('j', "{\"reply\": \"ready\", \"pid\": 1}");
    flush();
    if (warms) {
        warm();
    }
    for (;;) {
        struct command *command = running;
        struct pollfd fds[6] = {{.fd = 0, .events = POLLIN}, {.fd = wakeup_r, .events = POLLIN}};
        int count = 2, at_out = -1, at_pipe[2] = {-1, -1}, at_stdin = -1, timeout = -1;
        if (length(&out)) {
            at_out = count;
            fds[count++] = (struct pollfd){.fd = 1, .events = POLLOUT};
        }
        if (command != NULL) {
            if (length(&out) + length(&tail) < OUT_HIGH || command->reason != NULL) {
                for (int i = 0; i < 2; i++) {
                    if (command->fds[i] >= 0) {
                        at_pipe[i] = count;
                        fds[count++] = (struct pollfd){.fd = command->fds[i], .events = POLLIN};
                    }
                }
            }
            if (command->stdin_fd >= 0 && command->stdin_left) {
                at_stdin = count;
                fds[count++] = (struct pollfd){.fd = command->stdin_fd, .events = POLLOUT};
            }
            if (command->reason == NULL) {
                int64_t left_ms = (command->deadline_ns - now_ns() + 999999) / 1000000;
                timeout = left_ms <= 0 ? 0 : left_ms < INT32_MAX ? (int)left_ms : INT32_MAX;
            }
        }
        if (length(&tail) && !length(&out)) {  /* a small tail held (frame): framed when due */
            int held = (int)tail_wait_ms();
            timeout = timeout < 0 || held < timeout ? held : timeout;
        }
        if (poll(fds, (nfds_t)count, timeout) < 0 && errno != EINTR) {
            die("airlock supervisor: poll failed\n");
        }
        if (fds[1].revents) {
            char wakeups[4096];  /* a byte a signal: what is left (if any) wakes the next turn */
            ssize_t ignored = read(wakeup_r, wakeups, sizeof wakeups);
            (void)ignored;
        }
        if (command == NULL) {
            collect();  /* whatever a reap left to collect */
        }
        if (fds[0].revents && !read_requests()) {
            reap();
            _exit(0);
        }
        if (at_out >= 0 && fds[at_out].revents) {
            flush();
        }
        if (command != NULL) {
            for (int i = 0; i < 2; i++) {
                if (at_pipe[i] >= 0 && fds[at_pipe[i]].revents && command->fds[i] >= 0) {
                    read_output(i);
                }
            }
            if (at_stdin >= 0 && fds[at_stdin].revents && command->stdin_fd >= 0 && command->stdin_left) {
                write_stdin();
            }
            pump();
        }
        flush();
    }
}

static void woken(int signum) {
    (void)signum;
    int saved = errno;
    ssize_t ignored = write(wakeup_w, "", 1);
    (void)ignored;
    errno = saved;
}

/* Whatever the container runtime passed beyond stdio closes on a command's exec. */
static void keep_descriptors_to_itself(void) {
    DIR *listing = opendir("/proc/self/fd");
    if (listing == NULL) {
        return;
    }
    for (struct dirent *entry; (entry = readdir(listing)) != NULL;) {
        int fd = atoi(entry->d_name);
        if (fd > 2 && fd != dirfd(listing)) {
            fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
    }
    closedir(listing);
}

int main(int argc, char **argv) {
    if (getpid() != 1) {  /* reap() kills every process it may signal: only its own sandbox's */
        die("airlock supervisor: it runs as its sandbox's pid 1 only\n");
    }
    warms = argc > 1 && strcmp(argv[1], "warm") == 0;
    /* Pid 1 gets only the signals it handles (under runc; gVisor delivers every signal to it):
     * SIGCHLD, whose handler only wakes the loop. SIGPIPE and SIGINT are ignored. */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    keep_descriptors_to_itself();
    oom_path = oom_counters();
    null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);  /* a command's stdin when it is given none */
    int wakeup[2];
    if (null_fd < 0 || pipe2(wakeup, O_NONBLOCK | O_CLOEXEC)) {
        die("airlock supervisor: no descriptor for /dev/null or its wake-up pipe\n");
    }
    wakeup_r = wakeup[0];
    wakeup_w = wakeup[1];
    for (int fd = 0; fd < 2; fd++) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    struct sigaction chld;
    memset(&chld, 0, sizeof chld);
    chld.sa_handler = woken;
    chld.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &chld, NULL);
    serve();
    return 0;
}
