/*
 * fabric-stdio SOCKET COMMAND [ARG...]
 * fabric-stdio --egress PORT EGRESS_SOCKET SOCKET COMMAND [ARG...]
 * fabric-stdio [--egress PORT EGRESS_SOCKET] --hold SOCKET COMMAND [ARG...]
 *
 * Runs first in every container the orchestrator starts with socket stdio (see
 * reactor_fabric/runtime/stdio_sockets.py): connects to the orchestrator's Unix socket at
 * SOCKET, makes that connection the process's stdin and stdout, and replaces itself with
 * COMMAND (the image's entrypoint and command). The MCP server then reads and writes its
 * messages straight to the orchestrator, with no engine process copying them on the way.
 * stderr is left alone: the engine still carries it.
 *
 * Why a program of its own: an image need not have a shell, and nothing may be added to
 * it. This one is linked statically, reads nothing but its arguments, and is gone (exec)
 * before the server's first instruction, so the server runs as PID, user and working
 * directory exactly as it would without it.
 *
 * --egress: a container with an egress allowlist still has no network of its own, only its
 * loopback; its programs are told to use the proxy at http://127.0.0.1:PORT. Before the
 * exec, a forwarder process is forked that listens on 127.0.0.1:PORT and carries each
 * connection, byte for byte, to the orchestrator's Unix socket EGRESS_SOCKET, where the proxy
 * and its allowlist are (this program reads no protocol). It is forked before SOCKET is
 * connected, so it never holds the stdio connection (the orchestrator sees EOF when the
 * server exits), and it dies with the server (PR_SET_PDEATHSIG), as do its connections.
 *
 * The proxy, not this program, bounds a container's connections, answers the one over its
 * bound (503 egress_busy) and records it: its socket is in the container, so a bound here
 * could be gone around, and an answer here would go unrecorded. This program only bounds its
 * own processes, at as many connections as the proxy holds at once (CARRIED); the next waits
 * in the listen backlog until one ends, and is then carried like the others. Each connection
 * ends when the proxy has closed its side (once what it sent is passed on), so the proxy's
 * deadlines end the processes too.
 *
 * --hold: once connected, COMMAND is not run before the orchestrator says so, by sending the
 * one byte GO on the connection (read alone: what follows it is the server's). The engine
 * starts the container while the orchestrator still prepares what COMMAND must find at its
 * start (an isolated task's copy of the project, filled in the directory already mounted):
 * the two overlap, and the server's first instruction sees everything. The orchestrator
 * closing the connection instead means the start was given up: exit 75, COMMAND never run.
 *
 * Exit status when it cannot do its job (the orchestrator reports the container's exit):
 *   64  usage, or a byte other than GO; 70  cannot connect to SOCKET; 71  cannot listen on
 *   127.0.0.1:PORT or start the forwarder; 75  --hold and the connection closed before GO;
 *   127 COMMAND cannot be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* Connections the proxy serves at once per container (egress_proxy.py's MAX_CONNECTIONS). */
#define MAX_CONNECTIONS 64
/* Connections carried at once: those and the ones the proxy may be refusing at once besides
 * (its MAX_REFUSING), each of which it ends within seconds. One more is not accepted until one
 * of them ends. */
#define CARRIED (MAX_CONNECTIONS + 16)
/* --hold: the byte the orchestrator sends when COMMAND may run. */
#define GO 'G'
/* Bytes held per direction of a connection: nothing more is read until they are written. */
#define CHUNK 65536

static void say(const char *what, const char *detail) {
    fprintf(stderr, "fabric-stdio: %s: %s\n", what, detail);
}

static int unix_address(const char *path, struct sockaddr_un *address) {
    memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof address->sun_path) {
        say("socket path too long", path);
        return -1;
    }
    strcpy(address->sun_path, path);
    return 0;
}

/* A decimal port 1..65535, nothing else (no sign, no spaces): 0 when it is not one. */
static int parse_port(const char *text) {
    long value = 0;
    if (*text == '\0' || strlen(text) > 5)
        return 0;
    for (const char *c = text; *c; c++) {
        if (*c < '0' || *c > '9')
            return 0;
        value = value * 10 + (*c - '0');
    }
    return value <= 65535 ? (int)value : 0;
}

static int listen_on_loopback(int port) {
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0)
        return -1;
    int yes = 1;
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons((unsigned short)port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes) != 0
        || bind(listener, (struct sockaddr *)&address, sizeof address) != 0
        || listen(listener, MAX_CONNECTIONS) != 0) {
        int saved = errno;
        close(listener);
        errno = saved;
        return -1;
    }
    return listener;
}

/* Dies with its parent; 0 when the parent is already gone (it died before the prctl). */
static int follow_parent(pid_t parent) {
    return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent;
}

/* One direction of a connection: bytes read from `from`, not yet all written to `to`. */
struct direction {
    int from, to;
    size_t start, end;
    int done; /* EOF read and passed on */
    char data[CHUNK];
};

static struct direction upstream, downstream;

/*
 * Carries bytes both ways until each side has ended its sending; any error ends the whole
 * connection (the process exits, which closes both). Non-blocking, so a write the peer does
 * not take never stops the other direction. Once the proxy's sending has ended and been
 * passed on, its close (POLLHUP: nothing sent could be read any more) ends the connection too,
 * though the client still holds its side open.
 */
static _Noreturn void pump(int tcp, int egress) {
    struct direction *both[2] = {&upstream, &downstream};
    upstream.from = downstream.to = tcp;
    upstream.to = downstream.from = egress;
    if (fcntl(tcp, F_SETFL, O_NONBLOCK) != 0 || fcntl(egress, F_SETFL, O_NONBLOCK) != 0)
        _exit(1);
    for (;;) {
        struct pollfd wanted[3];
        int count = 0;
        for (int i = 0; i < 2; i++) {
            struct direction *d = both[i];
            if (d->done)
                continue;
            /* Either the buffer holds bytes to write, or it is empty and may be refilled. */
            wanted[count].fd = d->start < d->end ? d->to : d->from;
            wanted[count].events = d->start < d->end ? POLLOUT : POLLIN;
            wanted[count].revents = 0;
            count++;
        }
        if (count == 0)
            _exit(0);
        /* Only the client's direction is left: watch the proxy's side for its close. */
        int watching = downstream.done;
        if (watching) {
            wanted[count].fd = egress;
            wanted[count].events = 0; /* POLLHUP and POLLERR are always reported */
            wanted[count].revents = 0;
        }
        if (poll(wanted, (nfds_t)(count + watching), -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (watching && wanted[count].revents != 0)
            _exit(0);
        count = 0;
        for (int i = 0; i < 2; i++) {
            struct direction *d = both[i];
            if (d->done)
                continue;
            if (wanted[count++].revents == 0)
                continue;
            ssize_t n;
            if (d->start < d->end) {
                n = send(d->to, d->data + d->start, d->end - d->start, MSG_NOSIGNAL);
                if (n > 0) {
                    d->start += (size_t)n;
                    if (d->start == d->end)
                        d->start = d->end = 0;
                }
            } else {
                n = read(d->from, d->data, sizeof d->data);
                if (n > 0) {
                    d->start = 0;
                    d->end = (size_t)n;
                } else if (n == 0) {
                    /* The sender finished: so does our sending to the other side. */
                    if (shutdown(d->to, SHUT_WR) != 0)
                        _exit(1);
                    d->done = 1;
                }
            }
            if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
                _exit(1);
        }
    }
}

/*
 * The forwarder: accepts on the loopback listener and gives each connection a process of its
 * own, which connects to the orchestrator's egress socket and pumps. Never returns.
 */
static _Noreturn void forward(int listener, const struct sockaddr_un *egress, pid_t parent) {
    if (!follow_parent(parent))
        _exit(0);
    /* Not the container's stdin or stdout: the engine's attach must end with the server. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0) {
        say("egress forwarder", strerror(errno));
        _exit(71);
    }
    close(null);
    /* A peer that went away is an error to handle, not a reason to die. */
    signal(SIGPIPE, SIG_IGN);
    pid_t self = getpid();
    int running = 0;
    for (;;) {
        /* Finished connections are reaped here, which also keeps the count of those left; at
         * CARRIED, the next connection is not accepted until one has ended. */
        while (running > 0) {
            pid_t ended = waitpid(-1, NULL, running >= CARRIED ? 0 : WNOHANG);
            if (ended > 0)
                running--;
            else if (ended < 0 && errno == EINTR)
                continue;
            else {
                if (ended < 0 && errno == ECHILD)
                    running = 0; /* none left to wait for: the count was wrong */
                break;
            }
        }
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno != EINTR && errno != ECONNABORTED) {
                /* Out of descriptors or memory, or a network error: try again shortly. */
                say("egress accept", strerror(errno));
                poll(NULL, 0, 1000);
            }
            continue;
        }
        pid_t worker = fork();
        if (worker == 0) {
            close(listener);
            if (!follow_parent(self))
                _exit(0);
            /* No proxy to reach: the client sees its connection closed, not a hang. */
            int connection = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (connection < 0)
                _exit(1);
            int result;
            do {
                result = connect(connection, (const struct sockaddr *)egress, sizeof *egress);
            } while (result != 0 && errno == EINTR);
            if (result != 0)
                _exit(1);
            pump(client, connection);
        }
        if (worker > 0)
            running++;
        else /* (at the container's pids limit): this connection is closed unanswered */
            say("egress fork", strerror(errno));
        close(client);
    }
}

int main(int argc, char **argv) {
    int first = 1, port = 0;
    struct sockaddr_un egress;
    if (argc > 1 && strcmp(argv[1], "--egress") == 0) {
        if (argc < 6) {
            say("usage", "fabric-stdio --egress PORT EGRESS_SOCKET SOCKET COMMAND [ARG...]");
            return 64;
        }
        if ((port = parse_port(argv[2])) == 0) {
            say("not a port (1-65535)", argv[2]);
            return 64;
        }
        if (unix_address(argv[3], &egress) != 0)
            return 64;
        first = 4;
    }
    int hold = 0;
    if (argc > first && strcmp(argv[first], "--hold") == 0) {
        hold = 1;
        first += 1;
    }
    if (argc - first < 2) {
        say("usage", "fabric-stdio [--egress PORT EGRESS_SOCKET] [--hold] SOCKET COMMAND [ARG...]");
        return 64;
    }
    struct sockaddr_un address;
    if (unix_address(argv[first], &address) != 0)
        return 64;

    if (port != 0) {
        int listener = listen_on_loopback(port);
        if (listener < 0) {
            fprintf(stderr, "fabric-stdio: egress listen on 127.0.0.1:%d: %s\n", port,
                    strerror(errno));
            return 71;
        }
        /* Forked now, while no stdio connection exists for it to inherit. */
        pid_t parent = getpid();
        pid_t forwarder = fork();
        if (forwarder < 0) {
            say("egress forwarder", strerror(errno));
            return 71;
        }
        if (forwarder == 0)
            forward(listener, &egress, parent);
        close(listener);
    }

    /* CLOEXEC on the original: only the duplicates on 0 and 1 reach the server. */
    int connection = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connection < 0) {
        say("socket", strerror(errno));
        return 70;
    }
    int result;
    do {
        result = connect(connection, (struct sockaddr *)&address, sizeof address);
    } while (result != 0 && errno == EINTR);
    if (result != 0) {
        say("connect", strerror(errno));
        return 70;
    }
    if (hold) {
        char go;
        ssize_t got;
        do {
            got = read(connection, &go, 1);
        } while (got < 0 && errno == EINTR);
        if (got < 0) {
            say("read", strerror(errno));
            return 70;
        }
        if (got == 0) {
            say("hold", "the orchestrator gave the start up");
            return 75;
        }
        if (go != GO) {
            say("hold", "not the byte GO");
            return 64;
        }
    }
    if (dup2(connection, STDIN_FILENO) < 0 || dup2(connection, STDOUT_FILENO) < 0) {
        say("dup2", strerror(errno));
        return 70;
    }
    close(connection);

    execvp(argv[first + 1], argv + first + 1);
    say(argv[first + 1], strerror(errno));
    return 127;
}
