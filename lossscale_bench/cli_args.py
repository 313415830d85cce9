"""``lsbench run``'s arguments, and the store options every command that opens the store shares.

Beside ``cli_report.py`` (``lsbench report``'s arguments): ``cli.py`` builds the parser from both and
keeps the commands themselves.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["add_run_parser", "positive_int", "store_args"]


def positive_int(text: str) -> int:
    """An option's whole number of 1 or more (``--max-concurrent 0`` would start no trial and wait for ever)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of 1 or more")
    return int(text)


def store_args(sp) -> None:
    """``--runs-dir`` and ``--tracking-uri``, for every command that opens the store."""
    sp.add_argument(
        "--runs-dir",
        default=os.environ.get("LSBENCH_RUNS", "runs"),
        help="study outputs and the default MLflow store (runs/mlflow.db)",
    )
    sp.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///<runs-dir>/mlflow.db)",
    )


def add_run_parser(sub, func) -> None:
    """``lsbench run`` and its arguments; ``func`` runs the command (``cli.cmd_run``)."""
    sp = sub.add_parser("run", help="run a study (default: the embedded smoke study)")
    sp.add_argument("file", nargs="?", help="study YAML file")
    sp.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    sp.add_argument(
        "--allow-large-grid",
        action="store_true",
        help="accept a grid of more than 1000 trials (refused by default: usually a typo)",
    )
    store_args(sp)
    sp.add_argument(
        "--artifacts-uri",
        default=None,
        help="where a new study's plots and CSVs go (<uri>/<study>; a folder or a URI such as s3://...); "
        "default: an MLflow server's own artifact store, beside a SQLite store, <runs-dir>/artifacts for a "
        "database server",
    )
    sp.add_argument(
        "--max-concurrent", type=positive_int, default=None, help="at most this many trials at once (1 or more)"
    )
    sp.add_argument("--address", default=None, help="join an existing Ray cluster (else $RAY_ADDRESS, else local)")
    sp.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray instance (default: all)")
    sp.add_argument(
        "--no-resource-check",
        action="store_true",
        help="start trials even if no node can hold them now (an autoscaler adds nodes on demand); "
        "also LSBENCH_SKIP_RESOURCE_CHECK=1",
    )
    sp.add_argument(
        "--executor",
        choices=("ray", "local"),
        default="ray",
        help="'local' runs trials one by one in this process, without Ray (debugging)",
    )
    sp.add_argument(
        "--wait",
        action="store_true",
        help="if another lsbench run uses the same runs folder or store, wait for it to end "
        "(default: exit 2 naming it)",
    )
    sp.add_argument("--quiet", action="store_true", help="no per-trial progress lines")
    sp.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    sp.add_argument(
        "--reports-dir",
        default="reports",
        help="folder for the report written at the end (<study>.md with its plots); created if missing",
    )
    sp.set_defaults(func=func)
