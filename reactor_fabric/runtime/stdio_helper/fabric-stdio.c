/*
 * fabric-stdio SOCKET COMMAND [ARG...]
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
 * Exit status when it cannot do its job (the orchestrator reports the container's exit):
 *   64  usage; 70  cannot connect to SOCKET; 127 COMMAND cannot be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void say(const char *what, const char *detail) {
    fprintf(stderr, "fabric-stdio: %s: %s\n", what, detail);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        say("usage", "fabric-stdio SOCKET COMMAND [ARG...]");
        return 64;
    }
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    if (strlen(argv[1]) >= sizeof address.sun_path) {
        say("socket path too long", argv[1]);
        return 64;
    }
    strcpy(address.sun_path, argv[1]);

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
    if (dup2(connection, STDIN_FILENO) < 0 || dup2(connection, STDOUT_FILENO) < 0) {
        say("dup2", strerror(errno));
        return 70;
    }
    close(connection);

    execvp(argv[2], argv + 2);
    say(argv[2], strerror(errno));
    return 127;
}
