/*
 * The floor under every relay in the bench: a process in the middle that does nothing but
 * copy bytes, in C, on a poll(2) loop of one thread (as the Python relays and the bridge
 * are: one loop for both directions) with no parsing.
 * What it adds to a round trip is what any process between client and agent costs on the
 * machine at hand: two more pipe hops and two more wake-ups. The bench compiles it with the
 * system's C compiler into its scratch directory; without one its rows are not measured.
 *
 *     c_relay AGENT [ARGS...]
 *
 * At end of either input it closes the other side's output; it exits with the agent.
 * Output a pipe does not take at once waits for that pipe to be writable; input from that
 * side is not read meanwhile (so at most one read is held per direction).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define READ_SIZE 65536

/* One direction: read from `from`, write to `to`; `held` bytes of `buffer` from `offset`
   are waiting for `to` to be writable. */
struct hop {
    int from;
    int to;
    char buffer[READ_SIZE];
    size_t offset;
    size_t held;
    int open;
};

static void nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* Write what `to` takes now; -1 when it failed for good. */
static int flush(struct hop *hop) {
    while (hop->held > 0) {
        ssize_t n = write(hop->to, hop->buffer + hop->offset, hop->held);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -1;
        }
        hop->offset += (size_t)n;
        hop->held -= (size_t)n;
    }
    return 0;
}

/* The source is readable: read once, and write it on. -1 at end of input or on failure. */
static int pass(struct hop *hop) {
    ssize_t n = read(hop->from, hop->buffer, READ_SIZE);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : -1;
    if (n == 0)
        return -1;
    hop->offset = 0;
    hop->held = (size_t)n;
    return flush(hop);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: c_relay AGENT [ARGS...]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int to_agent[2], from_agent[2];
    if (pipe(to_agent) < 0 || pipe(from_agent) < 0) {
        perror("pipe");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        dup2(to_agent[0], 0);
        dup2(from_agent[1], 1);
        close(to_agent[0]);
        close(to_agent[1]);
        close(from_agent[0]);
        close(from_agent[1]);
        execvp(argv[1], argv + 1);
        perror("execvp");
        _exit(127);
    }
    close(to_agent[0]);
    close(from_agent[1]);
    static struct hop hops[2];
    hops[0].from = 0;
    hops[0].to = to_agent[1];
    hops[1].from = from_agent[0];
    hops[1].to = 1;
    for (int i = 0; i < 2; i++) {
        hops[i].open = 1;
        nonblocking(hops[i].from);
        nonblocking(hops[i].to);
    }
    while (hops[1].open) {
        struct pollfd fds[2];
        for (int i = 0; i < 2; i++) {
            struct hop *hop = &hops[i];
            memset(&fds[i], 0, sizeof fds[i]);
            fds[i].fd = !hop->open ? -1 : hop->held ? hop->to : hop->from;
            fds[i].events = hop->held ? POLLOUT : POLLIN;
        }
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("poll");
            return 1;
        }
        for (int i = 0; i < 2; i++) {
            struct hop *hop = &hops[i];
            if (fds[i].fd < 0 || !fds[i].revents)
                continue;
            if ((hop->held ? flush(hop) : pass(hop)) < 0) {
                hop->open = 0;
                close(hop->to);
            }
        }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
