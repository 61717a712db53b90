/* The supervisor's spawner under gVisor (supervisor.py, Supervisor.spawn_vfork; docs/architecture.md,
 * "The supervisor"). Built into the sandbox's root filesystem (rootfs.py) and loaded with ctypes.
 *
 * A command is started with clone(CLONE_VM | CLONE_VFORK): no copy of the supervisor's memory,
 * which under gVisor costs a fork ~10 ms. The child, while the supervisor waits for its exec,
 * takes its own session, its stdio, the OOM killer's first place, uid and gid 65534 with no
 * supplementary group, its cwd, default signal handlers, then runs the program along PATH with
 * those rights. The supervisor never changes its own ids, so no command can ever signal it
 * (posix_spawn would need it to take the command's uid for the spawn).
 *
 * The child shares the supervisor's memory: it calls only system calls, ids changed by raw
 * syscalls (glibc's setresuid would signal every thread of a process it thinks it is), and
 * reports a failure before exec in `error`, which the supervisor reads once clone returns. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOBODY 65534
#define PATH_BYTES 4096

struct request {
    char *const *argv;
    char *const *envp;
    const char *path;  /* the command's PATH */
    const char *cwd;
    int fds[3];
    const int *reset;  /* the signals the supervisor handles or ignores, 0-terminated */
    sigset_t mask;  /* the supervisor's signal mask, restored just before exec */
    volatile int error;
};

static int fail(struct request *r, int code) {
    r->error = code ? code : EINVAL;
    _exit(127);
}

/* As Python's os.execvpe searches (the fork path's): every entry is tried; the first error other
 * than ENOENT and ENOTDIR is reported, else the last. */
static void run_along_path(struct request *r) {
    const char *name = r->argv[0];
    if (strchr(name, '/') != NULL) {
        syscall(SYS_execve, name, r->argv, r->envp);
        fail(r, errno);
    }
    size_t length = strlen(name);
    int saved = 0, last = ENOENT;
    for (const char *start = r->path;; ) {
        const char *end = strchrnul(start, ':');
        size_t directory = (size_t)(end - start);
        char candidate[PATH_BYTES];
        if (directory == 0) {  /* an empty entry is the cwd */
            candidate[0] = '.';
            directory = 1;
        } else if (directory < PATH_BYTES) {
            memcpy(candidate, start, directory);
        }
        if (directory + 1 + length < PATH_BYTES) {
            candidate[directory] = '/';
            memcpy(candidate + directory + 1, name, length + 1);
            syscall(SYS_execve, candidate, r->argv, r->envp);
            last = errno;
            if (saved == 0 && last != ENOENT && last != ENOTDIR) {
                saved = last;
            }
        } else {
            last = ENAMETOOLONG;
        }
        if (*end == '\0') {
            break;
        }
        start = end + 1;
    }
    fail(r, saved ? saved : last);
}

static int child(void *argument) {
    struct request *r = argument;
    struct sigaction standard;
    memset(&standard, 0, sizeof standard);
    standard.sa_handler = SIG_DFL;
    /* Handled or ignored by the supervisor: default again. The supervisor names them (Python
     * knows each signal's disposition without asking the kernel): asking for all 64 here took
     * 64 system calls, each a trip through gVisor's kernel. */
    for (const int *sig = r->reset; *sig; sig++) {
        sigaction(*sig, &standard, NULL);
    }
    if (syscall(SYS_setsid) < 0) {
        fail(r, errno);
    }
    for (int target = 0; target < 3; target++) {  /* every other descriptor is close-on-exec */
        if (syscall(SYS_dup3, r->fds[target], target, 0) < 0) {  /* dup3: every architecture has it */
            fail(r, errno);
        }
    }
    int adj = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
        syscall(SYS_write, adj, "1000", 4);
        syscall(SYS_close, adj);
    }
    if (syscall(SYS_setgroups, 0, NULL) || syscall(SYS_setresgid, NOBODY, NOBODY, NOBODY)
            || syscall(SYS_setresuid, NOBODY, NOBODY, NOBODY)) {
        fail(r, errno);
    }
    if (syscall(SYS_chdir, r->cwd)) {
        fail(r, errno);
    }
    sigprocmask(SIG_SETMASK, &r->mask, NULL);
    run_along_path(r);
    return 127;
}

/* The command's pid, or -1 with `*error` set as exec would set errno (the child reaped). */
int airlock_spawn(char *const *argv, char *const *envp, const char *path, const char *cwd,
                  int in_fd, int out_fd, int err_fd, const int *reset, int *error) {
    static char stack[1 << 16] __attribute__((aligned(16)));  /* one spawn at a time: the supervisor's */
    struct request r = {.argv = argv, .envp = envp, .path = path, .cwd = cwd, .fds = {in_fd, out_fd, err_fd},
                        .reset = reset, .error = 0};
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &r.mask);  /* no handler of the supervisor's runs in the child */
    int pid = clone(child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &r);
    int cloned = errno;
    sigprocmask(SIG_SETMASK, &r.mask, NULL);
    if (pid < 0) {
        *error = cloned;
        return -1;
    }
    if (r.error) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        *error = r.error;
        return -1;
    }
    return pid;
}
