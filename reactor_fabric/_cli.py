"""Command line: ``python -m reactor_fabric [serve options]``, ``validate-config PATH``,
``connect`` (the stdio bridge) and ``catalog``.

Exit codes:

- ``0`` — clean shutdown (SIGINT/SIGTERM), a valid suite for ``validate-config``, every service
  learned for ``catalog``;
- ``1`` — the suite is invalid (every problem is listed, one per line); for ``catalog``, a
  service could not be learned;
- ``2`` — the suite file cannot be read, or the command line is wrong;
- ``3`` — the orchestrator cannot listen (port in use, address not available).

This module only dispatches: the arguments are ``_cli_parser.py``'s, serving is
``_serve_cli.py``'s, ``lock`` is ``_lock_cli.py``'s, the operators' commands are
``_operator_cli.py``'s and the others ``_user_cli.py``'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence

from ._cli_parser import build_parser

# The commands' modules are imported when their command runs: a serving orchestrator keeps
# none of the others' imports in its memory (the bridge's WebSocket client, urllib's, …).


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    parser = build_parser(env)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if args.command is not None:
        return _run_command(args, env)
    from ._serve_cli import ServeSettings, serve  # noqa: PLC0415 (see the imports)

    settings = ServeSettings(
        config=args.config,
        host=args.host,
        port=int(args.port),
        network=args.network,
        log_level=args.log_level,
        token=args.token,
        no_auth=args.no_auth,
        runtime=args.runtime,
        replica=args.replica,
    )
    return serve(settings, env)


def _run_command(args: argparse.Namespace, env: dict[str, str]) -> int:
    """A command other than serving (its modules imported here: see the imports)."""
    from ._cli_shared import optional_suite  # noqa: PLC0415
    from ._lock_cli import lock_command  # noqa: PLC0415
    from ._operator_cli import audit_command, sessions_command  # noqa: PLC0415
    from ._user_cli import (  # noqa: PLC0415
        catalog_command,
        connect_command,
        login_command,
        rank_command,
        validate_config,
    )

    commands: dict[str, Callable[[], int]] = {
        "validate-config": lambda: validate_config(
            args.path, secrets=args.secrets, engine=args.engine, environ=env
        ),
        "connect": lambda: connect_command(args, env),
        "login": lambda: login_command(args, env),
        "catalog": lambda: catalog_command(
            args.catalog_config or args.config, args.refresh, args.json, env
        ),
        "rank": lambda: rank_command(args.catalog, args.top, args.budget),
        "lock": lambda: lock_command(args.lock_config or args.config, args.check, env),
        "audit": lambda: audit_command(args, optional_suite(args.config), env, int(args.port)),
        "sessions": lambda: sessions_command(args, env),
    }
    return commands[args.command]()
