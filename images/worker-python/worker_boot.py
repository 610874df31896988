"""An interpreter for one ``run_python``, started before it is needed (worker_server.Spare).

Started as ``python worker_boot.py`` in the session's environment (under ``prlimit``, in a
process group of its own, its stdout and stderr the run's), it waits for its order on stdin:
the working directory and the script's path, separated by a NUL, then the end of the input.
Then stdin becomes /dev/null and the script runs as ``python SCRIPT`` would run it in that
directory — ``__main__``, ``sys.argv``, its tracebacks (without this program's frame), its
exit status — but for ``sys.path[0]``, the working directory (the project: its modules import
as with ``python -c``). An interpreter's start is most of a short run's cost (about 11 ms of
14 here); started ahead, a call pays only for its code.

Nothing of this program is left where the script can see it: ``__main__``'s namespace is
emptied first, and the script is compiled without its ``__future__`` flags. An interpreter told
nothing (its stdin closed unused) exits 0 without running anything.
"""

import os
import sys


def _boot() -> None:
    # Everything used after __main__ is emptied is a local of this function.
    read, environ = os.read, os
    order = bytearray()
    while chunk := read(0, 65536):
        order += chunk
    if not order:
        raise SystemExit(0)
    null = environ.open(environ.devnull, environ.O_RDONLY)
    environ.dup2(null, 0)
    environ.close(null)
    cwd, script = bytes(order).decode("utf-8", "surrogateescape").split("\0")
    environ.chdir(cwd)
    system = sys
    system.argv[:] = [script]
    system.path[0] = cwd
    main = system.modules["__main__"].__dict__
    builtins = main["__builtins__"]
    main.clear()
    main.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=None,
        __spec__=None,
        __file__=script,
        __cached__=None,
        __builtins__=builtins,
    )
    try:
        with open(script, "rb") as file:
            code = compile(file.read(), script, "exec", dont_inherit=True)
    except SyntaxError as exc:  # (as the interpreter says it of a script: no frames)
        system.excepthook(type(exc), exc.with_traceback(None), None)
        raise SystemExit(1) from None
    try:
        exec(code, main)  # noqa: S102 - running the client's code is this program's purpose
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports any, then status 1
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        system.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


_boot()
