/* airlock-enter: the bubblewrap driver's first program for each command (enter.py;
 * docs/architecture.md, "Runtimes").
 *
 *     airlock-enter FILE... -- PROGRAM [ARG...]
 *
 * Writes "0" to each FILE, the `tasks` file of one of the sandbox's cgroups (cgroup v1) or its
 * `cgroup.procs` (v2), which moves the writer itself into that group; then execs PROGRAM (an
 * absolute path) with ARGs and the environment it was given. Everything PROGRAM starts (bwrap
 * and the command) is in the sandbox's groups from its first instruction, and no process has to
 * be moved from outside. A move from outside takes the kernel's global lock on thread groups, whose
 * writer first waits out an RCU grace period when none has passed lately (~11 ms on a command
 * that follows a pause); a single thread moving itself through `tasks` does not take it.
 *
 * Any failure exits 127 with a line on stderr (which names no host path), before PROGRAM starts. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
            fprintf(stderr, "airlock-enter: cannot join the sandbox's cgroups: %s\n", strerror(errno));
            return 127;
        }
        close(fd);
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "airlock-enter: usage: airlock-enter FILE... -- PROGRAM [ARG...]\n");
        return 127;
    }
    execv(argv[i + 1], argv + i + 1);
    fprintf(stderr, "airlock-enter: cannot run %s: %s\n", argv[i + 1], strerror(errno));
    return 127;
}
