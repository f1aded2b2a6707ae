"""``nodus login`` and ``nodus config view|use-context|set-project|current-context``: the config file's
contexts (contexts.py), written and read."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

import yaml

from nodus_cli import contexts, exiting
from nodus_cli.client import ApiError
from nodus_cli.config import DEFAULT_NAMESPACE, Config
from nodus_cli.kinds import SWEEP
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests


def login(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Check that the server takes the token (a list of Sweeps in the project), then save the context and
    make it current. Nothing is written when the check fails."""
    server, token = getattr(args, "server", None), getattr(args, "token", None)
    if not server or not token:
        print(
            "error: nodus login needs the server and a token\n"
            "fix: nodus login --server https://HOST --token TOKEN [--project P] [--ca FILE]",
            file=sys.stderr,
        )
        return exiting.USAGE
    server = server.rstrip("/")
    project = args.project or getattr(args, "namespace", None)
    ca = getattr(args, "ca", None)
    if not args.no_verify:
        config = Config(server, token, project or DEFAULT_NAMESPACE, False, None, ca)
        try:
            with Requests(config) as api:
                api.list(SWEEP, config.namespace, {"limit": "1"})
        except ApiError as e:
            print(status_text(e.status), file=sys.stderr)
            print("nothing was saved: the server did not accept the token for this project", file=sys.stderr)
            return exiting.FAILED
    file = contexts.read(environ)
    name = args.context or contexts.default_name(server)
    file.put(contexts.Context(name=name, server=server, token=token, project=project, ca=ca))
    file.current = name
    contexts.write(file)
    where = f", project {project}" if project else ""
    print(f'logged in to {server} as context "{name}"{where} (saved in {file.path})')
    return exiting.OK


def config_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    file = contexts.read(environ)
    if args.action == "view":
        data = file.as_dict() if args.raw else contexts.redacted(file)
        text = json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False)
        print(text.rstrip())
        return exiting.OK
    if args.action == "current-context":
        if file.current is None:
            fix = "fix: nodus login, or nodus config use-context NAME"
            print(f"error: {file.path} has no current context\n{fix}", file=sys.stderr)
            return exiting.FAILED
        print(file.current)
        return exiting.OK
    if args.action == "use-context":
        if file.context(args.context) is None:
            known = ", ".join(c.name for c in file.contexts) or "none"
            print(
                f'error: no context "{args.context}" in {file.path} (contexts: {known})\n'
                "fix: nodus login --server URL --token TOKEN --name NAME creates one",
                file=sys.stderr,
            )
            return exiting.FAILED
        file.current = args.context
        contexts.write(file)
        print(f'switched to context "{args.context}"')
        return exiting.OK
    # set-project
    current = file.context()
    if current is None:
        print(f"error: {file.path} has no current context\nfix: nodus login first", file=sys.stderr)
        return exiting.FAILED
    file.put(contexts.Context(current.name, current.server, current.token, args.project, current.ca))
    contexts.write(file)
    print(f'context "{current.name}" now works in project {args.project}')
    return exiting.OK
