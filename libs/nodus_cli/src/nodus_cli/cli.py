"""``nodus``: the command line. ``main(argv)`` returns the exit code, so tests drive it in-process."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodus_cli import (
    commands,
    contexts,
    estimating,
    exiting,
    logins,
    offers,
    patching,
    sweepresults,
    tailing,
    volumes,
    workspaces,
)
from nodus_cli.client import BadCA, Client, Unreachable
from nodus_cli.config import Config, load
from nodus_cli.kinds import KINDS, UnknownKind, resolve
from nodus_cli.reporting import unreachable_text
from nodus_cli.requesting import PATCH_TYPES, Requests
from nodus_cli.sourcing import SourceDirs
from nodus_sdk import ConfigError

GET_OUTPUTS = ("table", "wide", "json", "yaml", "name")

EPILOG = f"""\
examples:
  nodus login --server https://nodus.example.com --token $TOKEN --project team-a
  nodus offers --gpu H100 --region us --max-rate 3
  nodus estimate -f sweep.yaml
  nodus apply -f sweep.yaml --wait
  nodus apply -f job.yaml --source-dir .
  nodus volume push imagenet ./data/imagenet
  nodus workspace push home ./notes --to notes
  nodus workspace pull home notes --to ./notes
  nodus get sweeps -o wide
  nodus get jobs -w
  nodus get sweep lr-sweep --watch
  nodus describe sweep lr-sweep
  nodus apply -f pipeline.yaml --wait
  nodus get pl
  nodus describe pipeline flow
  nodus patch sweep lr-sweep -p '{{"spec": {{"maxParallel": 8}}}}'
  nodus logs lr-sweep-0 -f
  nodus delete sweep lr-sweep
  nodus sweep results lr-sweep --csv lr.csv --chart lr.png
  nodus account -n team-a
  nodus credits grant 100.00 -n team-a
  nodus usage --month 2026-11 -o csv
  nodus invoice 2026-11
  nodus tail 'nodus.report.>' --since 5m

The gateway, token, CA and project come from --server/--token/--ca/-n, then NODUS_URL/NODUS_TOKEN/
NODUS_CA, then the current context of the config file ($NODUS_CONFIG or ~/.config/nodus/config.yaml,
written by `nodus login`), then .nodus/local.env (written by `make up`) in this directory or a parent.

{exiting.TABLE}"""


def _connection_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # The same options before and after the command (`nodus -n x get sweeps`, `nodus get sweeps -n x`);
    # after it they default to SUPPRESS, so a sub-command never resets what was given before it.
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--server", default=default, help="the gateway URL (default: NODUS_URL, local.env)")
    parser.add_argument("--token", default=default, help="the bearer token (default: NODUS_TOKEN, local.env)")
    parser.add_argument(
        "--ca",
        default=default,
        metavar="FILE",
        help="a CA (PEM) to trust for https (default: NODUS_CA, local.env)",
    )
    parser.add_argument(
        "-n", "--namespace", default=default, help='the namespace (project) to work in (default "default")'
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodus",
        description="Run and inspect Nodus Sweeps and Jobs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("apply", parents=[common], help="create the objects in YAML or JSON files")
    p.add_argument(
        "-f", "--filename", action="append", required=True, metavar="FILE", help="a file, or - for stdin"
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="then wait for each Sweep, Job and Pipeline to finish, showing its progress (exit 1 if one "
        "fails)",
    )
    p.add_argument(
        "--source-dir",
        metavar="DIR",
        help="pack DIR and upload it as the code of every Job and Sweep without a source of its own "
        "(spec.source.dir in a manifest does this for one object)",
    )

    kinds = ", ".join(k.plural for k in KINDS)
    p = sub.add_parser("get", parents=[common], help="list objects, or show one")
    p.add_argument("kind", metavar="KIND", help=kinds)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument(
        "-o", "--output", choices=GET_OUTPUTS, default="table", help="wide adds node, GPU, region, rate ..."
    )
    p.add_argument("-l", "--selector", metavar="SELECTOR", help="a label selector, e.g. team=vision")
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="keep the view current (Ctrl-C ends it, exit 0); one Sweep: until it ends (0 Succeeded, 1 not)",
    )

    p = sub.add_parser("describe", parents=[common], help="show one object in detail")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("name", metavar="NAME")

    p = sub.add_parser("delete", parents=[common], help="delete one object")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("name", metavar="NAME")

    p = sub.add_parser("patch", parents=[common], help="change one object in place")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-p", "--patch", required=True, metavar="PATCH", help="the patch, as JSON or YAML")
    p.add_argument(
        "--type",
        dest="patch_type",
        choices=tuple(PATCH_TYPES),
        default="merge",
        help="merge (a partial object, the default), json (a list of RFC 6902 operations), strategic "
        "(read as merge)",
    )
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")

    p = sub.add_parser(
        "estimate", parents=[common], help="the dry run: cost, rate, startup, holds, blocking reasons"
    )
    p.add_argument("-f", "--filename", action="append", required=True, metavar="FILE", help="a file, or -")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p.add_argument(
        "--source-dir", metavar="DIR", help="as for apply: the code of Jobs and Sweeps without a source"
    )

    p = sub.add_parser("offers", parents=[common], help="the GPU offerings: variants, rates, regions")
    p.add_argument("--gpu", metavar="GPU", help="a family (H100) or variant (H100-SXM-80G); H100:8 pins GPUs")
    p.add_argument("--family", metavar="FAMILY", help="only this GPU family, e.g. A100")
    p.add_argument("--region", metavar="REGION", help="only this region class, e.g. eu")
    p.add_argument("--max-rate", metavar="USD", help="at most this rate per node-hour, e.g. 2.50")
    p.add_argument(
        "--interruptible",
        action="store_true",
        help="only offerings with interruptible capacity (--max-rate then compares that rate)",
    )
    p.add_argument("-o", "--output", choices=offers.OUTPUTS, default="table")

    p = sub.add_parser("logs", parents=[common], help="print the log of a Job (one index)")
    p.add_argument("name", metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true", help="stream new lines until the Job finishes")
    p.add_argument("--index", type=int, metavar="N", help="the index of the Job (default 0)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("--attempt", type=int, metavar="N", help="only attempt N of the index (default: all)")
    p.add_argument("--timestamps", action="store_true", help="start each line with its time")

    _sweep_commands(sub, common)
    _data_commands(sub, common)
    _billing_commands(sub, common)
    _config_commands(sub, common)
    tailing.add_parser(sub)
    return parser


def _config_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "login", parents=[common], help="save a server and token as a context of the config file"
    )
    p.add_argument("--project", metavar="PROJECT", help="the project (namespace) to work in by default")
    p.add_argument("--name", dest="context", metavar="NAME", help="the context's name (default: host:port)")
    p.add_argument(
        "--no-verify", action="store_true", help="save without checking that the server takes the token"
    )

    p = sub.add_parser("config", parents=[common], help="view or change the config file's contexts")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("view", parents=[common], help="print the config file (tokens redacted)")
    a.add_argument("--raw", action="store_true", help="with the tokens")
    a.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    a = actions.add_parser("use-context", parents=[common], help="make a context the current one")
    a.add_argument("context", metavar="NAME")
    a = actions.add_parser("set-project", parents=[common], help="set the current context's project")
    a.add_argument("project", metavar="PROJECT")
    actions.add_parser("current-context", parents=[common], help="print the current context's name")


def _sweep_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("sweep", parents=[common], help="work with one Sweep: its results")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser(
        "results",
        parents=[common],
        help="print a Sweep's cells with the best marked; write them as CSV and a cost/throughput chart",
    )
    a.add_argument("name", metavar="NAME")
    a.add_argument("-o", "--output", choices=sweepresults.OUTPUTS, default="table")
    a.add_argument("--csv", dest="csv_path", metavar="FILE", help="also write the results as CSV to FILE")
    a.add_argument(
        "--chart",
        dest="chart_path",
        metavar="FILE.png",
        help="also write a cost-versus-throughput chart (PNG) marking the best cells to FILE.png",
    )


def _data_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("volume", parents=[common], help="Volumes: push a folder as a new revision, list")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser(
        "push", parents=[common], help="pack DIR and make it the Volume's next revision (created if missing)"
    )
    a.add_argument("name", metavar="NAME")
    a.add_argument("dir", metavar="DIR")
    a = actions.add_parser("ls", parents=[common], help="list the Volumes (as `nodus get volumes`)")
    a.add_argument("-o", "--output", choices=("table", "wide"), default="table")

    p = sub.add_parser("workspace", parents=[common], help="a Workspace's files: push, pull, ls")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser(
        "push", parents=[common], help="send a file, or a folder's files, into the home (created if missing)"
    )
    a.add_argument("name", metavar="NAME")
    a.add_argument("path", metavar="PATH", help="a local file or folder")
    a.add_argument("--to", default="", metavar="DIR", help="the folder in the home (default: its top)")
    a = actions.add_parser("pull", parents=[common], help="copy a file or folder of the home here")
    a.add_argument("name", metavar="NAME")
    a.add_argument("path", metavar="PATH", help='a file or folder in the home ("/" for all of it)')
    a.add_argument("--to", default=".", metavar="LOCAL", help="the local folder (default: .)")
    a = actions.add_parser("ls", parents=[common], help="list the files under a folder of the home")
    a.add_argument("name", metavar="NAME")
    a.add_argument("path", metavar="PATH", nargs="?", default="")


def _dispatch_data(args: argparse.Namespace, client: Client, config: Config) -> int | None:
    """The Volume and Workspace commands' exit code; None for any other command."""
    if args.command == "volume":
        if args.action == "push":
            return volumes.push(client, config, args.name, args.dir)
        return volumes.ls(client, config, output=args.output)
    if args.command == "workspace":
        if args.action == "push":
            return workspaces.push(client, config, args.name, args.path, to=args.to)
        if args.action == "pull":
            return workspaces.pull(client, config, args.name, args.path, to=args.to)
        return workspaces.ls(client, config, args.name, args.path)
    return None


def _billing_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("account", parents=[common], help="show the credits of a project")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    p = sub.add_parser("credits", parents=[common], help="grant or revoke credits (the cluster admin)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("grant", "add credits to the project"),
        ("revoke", "take credits back (only what no running Attempt holds)"),
    ):
        a = actions.add_parser(action, parents=[common], help=text)
        a.add_argument("amount", metavar="AMOUNT", help="USD, such as 100.00")
        a.add_argument(
            "--id",
            dest="grant_id",
            metavar="ID",
            help="names the grant: the same id again counts once (default: a new id, printed)",
        )
        a.add_argument("--note", default="", help="why, for whoever reads the ledger")

    p = sub.add_parser("usage", parents=[common], help="list the charges of a project, one per Attempt")
    p.add_argument("--month", metavar="YYYY-MM", help="one UTC month (default: every month)")
    p.add_argument("-o", "--output", choices=("table", "csv", "json"), default="table")

    p = sub.add_parser("invoice", parents=[common], help="show the invoice of a project for a month")
    p.add_argument("month", metavar="MONTH", help="the UTC month, YYYY-MM")
    p.add_argument("-o", "--output", choices=("table", "csv", "json"), default="table")


def _dispatch(args: argparse.Namespace, client: Client, api: Requests, config: Config) -> int:
    if args.command == "apply":
        return commands.apply(
            client, config, args.filename, wait=args.wait, api=api, source_dir=args.source_dir
        )
    if args.command == "estimate":
        sources = SourceDirs(client, config.server, args.source_dir)
        return estimating.estimate(api, config, args.filename, output=args.output, sources=sources)
    if args.command == "offers":
        return _offers(args, api, config)
    done = _dispatch_billing(args, client, config)
    if done is None:
        done = _dispatch_data(args, client, config)
    if done is not None:
        return done
    if args.command == "sweep":
        return sweepresults.results(
            client,
            config,
            args.name,
            output=args.output,
            csv_path=args.csv_path,
            chart_path=args.chart_path,
        )
    if args.command == "logs":
        return commands.logs(
            client,
            config,
            args.name,
            follow=args.follow,
            index=args.index,
            tail=args.tail,
            attempt=args.attempt,
            timestamps=args.timestamps,
        )
    kind = resolve(args.kind)
    if args.command == "get":
        return commands.get(
            api, config, kind, args.name, output=args.output, selector=args.selector, watch=args.watch
        )
    if args.command == "describe":
        return commands.describe(api, config, kind, args.name)
    if args.command == "patch":
        return patching.patch(
            api, config, kind, args.name, args.patch, patch_type=args.patch_type, output=args.output
        )
    return commands.delete(api, config, kind, args.name)


def _offers(args: argparse.Namespace, api: Requests, config: Config) -> int:
    try:
        max_rate = offers.parse_rate(args.max_rate) if args.max_rate is not None else None
    except ValueError as e:
        print(f"error: --max-rate: {e}", file=sys.stderr)
        return exiting.USAGE
    filters = offers.Filters(
        gpu=args.gpu,
        family=args.family,
        region=args.region,
        max_rate=max_rate,
        interruptible=args.interruptible,
    )
    return offers.offers(api, config, filters, output=args.output)


def _dispatch_billing(args: argparse.Namespace, client: Client, config: Config) -> int | None:
    """The billing commands' exit code; None for any other command."""
    if args.command == "account":
        return commands.account(client, config, output=args.output)
    if args.command == "credits":
        return commands.credits(
            client, config, args.action, args.amount, grant_id=args.grant_id, note=args.note
        )
    if args.command == "usage":
        return commands.usage(client, config, month=args.month, output=args.output)
    if args.command == "invoice":
        return commands.invoice(client, config, args.month, output=args.output)
    return None


def connection(args: argparse.Namespace, environ: Mapping[str, str], cwd: Path) -> Config:
    """Server, token, CA and namespace: flags, then the environment, then the config file's current
    context, then .nodus/local.env. A context's token and CA go only to the context's own server, as
    local.env's go only to the local stack's."""
    ctx = contexts.read(environ).context()
    server, token, ca = args.server, args.token, args.ca
    if ctx is not None and not server and not environ.get("NODUS_URL"):
        server = ctx.server
    target = (server or environ.get("NODUS_URL") or "").rstrip("/")
    ours = ctx is not None and target == ctx.server.rstrip("/")
    if ctx is not None and ours:
        token = token or (None if environ.get("NODUS_TOKEN") else ctx.token)
        ca = ca or (None if environ.get("NODUS_CA") else ctx.ca)
    config = load(server=server, token=token, namespace=args.namespace, environ=environ, cwd=cwd, ca=ca)
    if ctx is not None and ours and args.namespace is None and ctx.project:
        # The context's project is a default, like "default": a manifest's own namespace still wins.
        config = dataclasses.replace(config, namespace=ctx.project)
    return config


def _guarded(work: Callable[[], int]) -> int:
    """Run a command; what it did not handle becomes its message and exit code (exiting.py)."""
    try:
        return work()
    except UnknownKind as e:
        print(f"error: {e}\nfix: run `nodus get KIND` with one of the kinds listed", file=sys.stderr)
        return exiting.FAILED
    except BadCA as e:
        print(f"error: {e}\nfix: pass a PEM file of CA certificates with --ca or NODUS_CA", file=sys.stderr)
        return exiting.FAILED
    except (contexts.ConfigFileError, ConfigError) as e:
        print(
            f"error: {e}\nfix: correct the file, or point NODUS_CONFIG at another one "
            "(`nodus login` writes a new one)",
            file=sys.stderr,
        )
        return exiting.FAILED
    except Unreachable as e:
        print(unreachable_text(e), file=sys.stderr)
        return exiting.UNREACHABLE
    except KeyboardInterrupt:
        return exiting.INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help (0) and on usage errors (2, after printing the usage): return the code.
        return e.code if isinstance(e.code, int) else exiting.USAGE
    if args.command == "tail":  # the bus, not the gateway: no gateway config or client
        return tailing.run(args, os.environ, Path.cwd())
    if args.command == "login":
        return _guarded(lambda: logins.login(args, os.environ))
    if args.command == "config":
        return _guarded(lambda: logins.config_command(args, os.environ))

    def work() -> int:
        config = connection(args, os.environ, Path.cwd())
        with Client(config.server, config.token, ca=config.ca) as client, Requests(config) as api:
            return _dispatch(args, client, api, config)

    return _guarded(work)


def run() -> None:
    """The console script."""
    raise SystemExit(main())
