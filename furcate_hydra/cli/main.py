"""``furcate``'s command line: parse, run one command, say what went wrong in one message."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from furcate_hydra.cli.locate import UsageError, sweep_dir_or_newest
from furcate_hydra.errors import FurcateConfigError

__all__ = ["main"]

# exit status for a command line or sweep dir that cannot be used (argparse's own)
USAGE_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    _end_quickly()
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (FurcateConfigError, UsageError) as exc:
        print(f"furcate {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # `furcate status | head`
        return 0


def _end_quickly() -> None:
    """The command's process ends without taking MLflow's modules apart (~0.75 s of a
    ``furcate status``), its MLflow connections closed first (``quick_exit``)."""
    from furcate_hydra.quick_exit import close_at_exit, end_quickly
    from furcate_hydra.store.opened_in_process import close_mlflow_connections

    end_quickly()
    close_at_exit(close_mlflow_connections)


def _status(args: argparse.Namespace) -> int:
    from furcate_hydra.cli.status import print_status
    from furcate_hydra.store.sweep_reader import SweepReader

    reader = SweepReader(_sweep_dir(args), args.tracking_uri)
    print_status(reader.snapshot(), sys.stdout, as_json=args.json)
    return 0


def _report(args: argparse.Namespace) -> int:
    from furcate_hydra.cli.report import write_report
    from furcate_hydra.store.sweep_reader import SweepReader

    reader = SweepReader(_sweep_dir(args), args.tracking_uri)
    path = write_report(reader, Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def _sweep_dir(args: argparse.Namespace) -> Path:
    # the line saying which sweep was taken goes to stderr: stdout may be --json
    return sweep_dir_or_newest(args.sweep_dir, args.tracking_uri, sys.stderr)


def _ls(args: argparse.Namespace) -> int:
    from furcate_hydra.cli.ls import print_sweeps
    from furcate_hydra.store.sweep_list import list_sweeps
    from furcate_hydra.store.sweep_reader import open_client
    from furcate_hydra.store.tracking_uri import TrackingUri, resolve_tracking_uri

    if args.limit < 1:
        raise FurcateConfigError("--limit", args.limit, "must be at least 1", "e.g. --limit 20")
    tracking = (
        TrackingUri(args.tracking_uri, "--tracking-uri")
        if args.tracking_uri
        else resolve_tracking_uri(None)
    )
    client = open_client(tracking)
    sweeps = list_sweeps(client, args.experiment or (), args.limit)
    print_sweeps(sweeps, tracking.uri, sys.stdout, as_json=args.json)
    return 0


def _index(args: argparse.Namespace) -> int:
    from furcate_hydra.store.index_command import run_index
    from furcate_hydra.store.tracking_uri import TrackingUri, resolve_tracking_uri

    tracking = (
        TrackingUri(args.tracking_uri, "--tracking-uri")
        if args.tracking_uri
        else resolve_tracking_uri(None)
    )
    print(run_index(tracking, drop=args.drop))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="furcate",
        description="Look at furcate sweeps: their jobs' states, reports, a store's sweeps.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    store_help = (
        "read this MLflow store instead of the one the sweep dir names (a store that moved, or "
        "the same store through an mlflow server)"
    )
    sweep_help = (
        "the sweep's dir (hydra.sweep.dir); default: the newest sweep under ./multirun, else "
        "the newest one the store (--tracking-uri, MLFLOW_TRACKING_URI, ./mlflow.db) records "
        "whose dir is still there"
    )

    status = commands.add_parser(
        "status",
        help="each job's state, and why the failed ones failed",
        description="The state of a sweep, read from the MLflow store it records into: counts "
        "per status and one line per job (status, reason, start, duration, return value). "
        "Works from any directory and while the sweep runs.",
    )
    status.add_argument("sweep_dir", nargs="?", metavar="SWEEP_DIR", help=sweep_help)
    status.add_argument("--json", action="store_true", help="one JSON object: counts, jobs")
    status.add_argument("--tracking-uri", metavar="URI", help=store_help)
    status.set_defaults(run=_status)

    report = commands.add_parser(
        "report",
        help="an HTML report with figures, in the sweep dir",
        description="Write report/report.html (self-contained) and its figures as PNGs into the "
        "sweep dir: the job table, the return value against each swept parameter, learning "
        "curves per metric, and resource peaks per job.",
    )
    report.add_argument("sweep_dir", nargs="?", metavar="SWEEP_DIR", help=sweep_help)
    report.add_argument("--out", metavar="DIR", help="write there instead of SWEEP_DIR/report")
    report.add_argument("--tracking-uri", metavar="URI", help=store_help)
    report.set_defaults(run=_report)

    ls = commands.add_parser(
        "ls",
        help="the sweeps a store holds, newest first",
        description="List the sweeps recorded in an MLflow store, newest first, with their "
        "state and job counts.",
    )
    ls.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="the store (default: MLFLOW_TRACKING_URI, else ./mlflow.db, as the launcher's)",
    )
    ls.add_argument("--experiment", action="append", metavar="NAME", help="only this experiment")
    ls.add_argument("--limit", type=int, default=20, help="at most this many sweeps (20)")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    ls.set_defaults(run=_ls)

    index = commands.add_parser(
        "index",
        help="index a big store's tags for furcate's lookups (--drop: remove them)",
        description="Add furcate's own indexes to a sqlite or PostgreSQL MLflow store's tags "
        "table: the skip check, claims, furcate status and the MLflow UI's runs of one sweep "
        "then read the matching runs instead of every run's tag. MLflow's migrations keep "
        "working; --drop removes them.",
    )
    index.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="the store's database (default: MLFLOW_TRACKING_URI, else ./mlflow.db); for an "
        "mlflow server, the --backend-store-uri it was started with",
    )
    index.add_argument("--drop", action="store_true", help="drop furcate's indexes instead")
    index.set_defaults(run=_index)
    return parser
