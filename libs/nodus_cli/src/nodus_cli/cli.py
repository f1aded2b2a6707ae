"""``nodus``: the command line. ``main(argv)`` returns the exit code, so tests drive it in-process."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from nodus_cli import commands, sweepresults, tailing
from nodus_cli.client import BadCA, Client, Unreachable
from nodus_cli.config import Config, load
from nodus_cli.kinds import UnknownKind, resolve
from nodus_cli.reporting import unreachable_text

EPILOG = """\
examples:
  nodus apply -f sweep.yaml
  nodus get sweeps
  nodus get sweep lr-sweep --watch
  nodus describe sweep lr-sweep
  nodus logs lr-sweep-0 -f
  nodus delete sweep lr-sweep
  nodus sweep results lr-sweep --csv lr.csv --chart lr.png
  nodus account -n team-a
  nodus credits grant 100.00 -n team-a
  nodus usage --month 2026-11 -o csv
  nodus invoice 2026-11
  nodus tail 'nodus.report.>' --since 5m

The gateway, token and CA come from --server/--token/--ca, NODUS_URL/NODUS_TOKEN/NODUS_CA, or
.nodus/local.env (written by `make up`) in this directory or a parent."""


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

    p = sub.add_parser("get", parents=[common], help="list objects, or show one")
    p.add_argument("kind", metavar="KIND", help="sweeps, jobs or budgets")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    p.add_argument("-l", "--selector", metavar="SELECTOR", help="a label selector, e.g. team=vision")
    p.add_argument("-w", "--watch", action="store_true", help="redraw a Sweep until it finishes")

    p = sub.add_parser("describe", parents=[common], help="show one object in detail")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("name", metavar="NAME")

    p = sub.add_parser("delete", parents=[common], help="delete one object")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("name", metavar="NAME")

    p = sub.add_parser("logs", parents=[common], help="print the log of a Job (one index)")
    p.add_argument("name", metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true", help="stream new lines until the Job finishes")
    p.add_argument("--index", type=int, metavar="N", help="the index of the Job (default 0)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("--attempt", type=int, metavar="N", help="only attempt N of the index (default: all)")
    p.add_argument("--timestamps", action="store_true", help="start each line with its time")

    _sweep_commands(sub, common)
    _billing_commands(sub, common)
    tailing.add_parser(sub)
    return parser


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


def _dispatch(args: argparse.Namespace, client: Client, config: Config) -> int:
    if args.command == "apply":
        return commands.apply(client, config, args.filename)
    billing = _dispatch_billing(args, client, config)
    if billing is not None:
        return billing
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
            client, config, kind, args.name, output=args.output, selector=args.selector, watch=args.watch
        )
    if args.command == "describe":
        return commands.describe(client, config, kind, args.name)
    return commands.delete(client, config, kind, args.name)


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help (0) and on usage errors (2, after printing the usage): return the code.
        return e.code if isinstance(e.code, int) else 2
    if args.command == "tail":  # the bus, not the gateway: no gateway config or client
        return tailing.run(args, os.environ, Path.cwd())
    config = load(
        server=args.server,
        token=args.token,
        namespace=args.namespace,
        environ=os.environ,
        cwd=Path.cwd(),
        ca=args.ca,
    )
    try:
        with Client(config.server, config.token, ca=config.ca) as client:
            return _dispatch(args, client, config)
    except (UnknownKind, BadCA) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Unreachable as e:
        print(unreachable_text(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """The console script."""
    raise SystemExit(main())
