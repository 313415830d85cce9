"""``lsbench``: run | validate | report | ui | data | weights.

User errors (a bad study file, missing data, an absent backend, an unknown
study in the report) print one line naming the file/field/path and exit
with code 2; anything else is a bug and keeps its traceback.

Exit codes: ``core/exit_codes.py`` (what each means, beside its number) and docs/reference/exit-codes.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .cli_args import add_run_parser, store_args
from .cli_plugins import register as register_plugins_parser
from .cli_report import report_parser
from .core.exit_codes import (
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGPIPE,
    EXIT_SIGTERM,
    EXIT_STORE,
    EXIT_TRIALS_FAILED,
    EXIT_USAGE,
)


def embedded_study() -> Path:
    """The default study shipped inside the package (``studies/smoke.yaml``)."""
    return Path(__file__).parent / "studies" / "smoke.yaml"


# (module, class) of the errors a user can cause; only modules already imported are looked at,
# so classifying an error never imports torch (a bad study file fails in a fraction of a second).
USER_ERRORS = (
    ("lossscale_bench.study", "StudyError"),
    ("lossscale_bench.core.plugins", "PluginError"),
    ("lossscale_bench.data.coco", "DataNotFound"),
    ("lossscale_bench.backends.base", "BackendUnavailable"),
    ("lossscale_bench.models.ssd", "WeightsError"),
    ("lossscale_bench.data.download", "DownloadError"),
    ("lossscale_bench.trial", "CheckpointError"),
    ("lossscale_bench.report.runs", "ReportError"),
    ("lossscale_bench.orchestration.cluster", "ClusterUnavailable"),
    ("lossscale_bench.orchestration.runs_lock", "RunsFolderBusy"),
    ("lossscale_bench.tracking.store", "StoreMissing"),
    ("lossscale_bench.core.portable", "PinConflict"),
    ("lossscale_bench.core.env_vars", "EnvVarError"),
)


def _user_errors() -> tuple[type[BaseException], ...]:
    errs = []
    for mod, name in USER_ERRORS:
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, name):
            errs.append(getattr(m, name))
    return tuple(errs)


def _print_table(trials) -> None:
    from tabulate import tabulate

    from .orchestration.placement import placement_text
    from .study import trial_table

    rows = trial_table(trials, placement=placement_text)
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print(f"{len(rows)} trials")


def _print_notices(study, stream=None) -> None:
    """What a valid study may not mean (a loss scale where there is nothing to rescue): a note, not an
    error. ``validate`` writes it to stderr beside its errors; ``run`` to stdout with the results, so a
    failing run's stderr stays the one error line."""
    from .study.notices import study_notices

    for line in study_notices(study):
        print(f"lsbench: note: {line}", file=stream or sys.stderr)


def cmd_validate(args) -> int:
    """Check every file given (a bad one does not hide the next) and every path each study names.

    One ``ok`` line (and the grid) per good file on stdout, one ``lsbench: error:`` line per problem on
    stderr; exit 2 after the last file if any had a problem. The environment switches are checked too
    (:mod:`.orchestration.environment`). ``--schema-only`` skips the path and environment checks:
    a study meant for another machine (its data and weights are there, not here).
    """
    from .orchestration.environment import environment_problems
    from .study import StudyError, load_study
    from .study.paths import path_problems

    failed = paths_missing = 0
    for f in args.files:
        try:
            study = load_study(f, allow_large_grid=args.allow_large_grid)
            problems = [] if args.schema_only else path_problems(study)
            paths_missing += bool(problems)
            if not args.schema_only:  # what `run` would refuse in this shell (another machine has its own)
                problems += environment_problems(study)
        except StudyError as exc:
            problems = list(getattr(exc, "problems", [exc]))  # every problem in the file, one line each
            partial = getattr(exc, "partial", None)  # valid but for keys the data checks do not read
            if partial is not None and not args.schema_only:
                try:
                    problems += path_problems(partial)
                except StudyError as more:
                    problems += more.problems
        if problems:
            failed += 1
            for exc in problems:
                print(f"lsbench: error: {exc}", file=sys.stderr)
            continue
        print(f"{f}: ok{' (schema only: paths not checked)' if args.schema_only else ''}, study {study.name!r}")
        _print_notices(study)
        _print_table(study.trials())
        if study.seed_plan is not None:
            from .study.seed_plan import plan_summary

            print(plan_summary(study))
    if paths_missing:
        print(
            "lsbench: (a study meant for another machine: lsbench validate --schema-only checks it without its paths)",
            file=sys.stderr,
        )
    return EXIT_USAGE if failed else EXIT_OK


def cmd_run(args) -> int:
    from .study import load_study

    path = args.file or str(embedded_study())
    study = load_study(path, allow_large_grid=args.allow_large_grid)
    if study.resources.repeatable and not args.dry_run:  # before anything imports torch (core/portable.py says why)
        from .core.portable import pin

        pin()
    if args.dry_run:
        return _dry_run(study, path)
    if _cannot_start(study, args):
        return EXIT_USAGE
    import functools
    import signal

    from .orchestration import Interrupted, run_study
    from .report.plots import run_plots

    run = functools.partial(
        run_study,
        study,
        runs_dir=args.runs_dir,
        tracking_uri=args.tracking_uri,
        max_concurrent=args.max_concurrent,
        address=args.address,
        num_cpus=args.num_cpus,
        executor=args.executor,
        quiet=args.quiet,
        trial_plots=run_plots,
        check_resources=not args.no_resource_check,
        wait=args.wait,
        artifacts_uri=args.artifacts_uri,
    )
    looks = None
    try:
        if study.seed_plan is None:
            result = run()
        else:  # seeds added in rounds until each comparison is decided
            result, looks = _run_plan(study, run, args)
    except Interrupted as exc:
        print(
            f"lsbench: interrupted by {exc}: {exc.killed} unfinished trial run(s) marked KILLED; "
            f"the same command resumes them",
            file=sys.stderr,
        )
        return EXIT_SIGINT if exc.signum == signal.SIGINT else EXIT_SIGTERM
    return _after_run(args, study, result, looks)


def _run_plan(study, run, args):
    """A seed plan's rounds under one stop-signal guard, its parent run ended after the last (``orchestration.rounds``)."""
    from .orchestration.rounds import plan_rounds
    from .seed_rounds import run_in_rounds
    from .tracking.store import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri, Path(args.runs_dir).expanduser().resolve())
    with plan_rounds(uri, study.name) as rounds:
        result, looks = run_in_rounds(study, rounds.each(run), tracking_uri=uri)
    return result, looks


def _dry_run(study, path: str) -> int:
    """``lsbench run --dry-run``: the trial table, the first round of a seed plan, the notices."""
    print(f"study {study.name!r} from {path}")
    _print_table(study.trials())
    if study.seed_plan is not None:
        from .study.seed_plan import plan_text

        print(f"(the first round: {plan_text(study.seed_plan)})")
    _print_notices(study, sys.stdout)
    return 0


def _cannot_start(study, args) -> bool:
    """Whether a problem found before any trial starts stops the run (each one printed): the environment,
    the study's paths (raises :class:`StudyError`), a reports folder that cannot be written."""
    from .orchestration.environment import environment_problems
    from .study.paths import check_paths

    problems = environment_problems()  # the trials read them: a misspelt value would silently mean another
    for problem in problems:
        print(f"lsbench: error: {problem}", file=sys.stderr)
    if problems:
        return True
    check_paths(study)  # missing data or weights: one line now, not a failed trial each after Ray started
    from .cli_plugins import plugin_dataset_problems, plugin_model_problems, print_problems

    # a plug-in that is no detector or no data set: before any run is opened
    if print_problems(plugin_model_problems(study) or plugin_dataset_problems(study)):
        return True
    if not args.no_report:  # written after the last trial: found unwritable now, not after hours of training
        from .core.writable import folder_problem

        problem = folder_problem(args.reports_dir)
        if problem:
            print(
                f"lsbench: error: --reports-dir {args.reports_dir} {problem}; the report is written there "
                "after the trials: pass a folder that can be written, or --no-report",
                file=sys.stderr,
            )
            return True
    return False


def _after_run(args, study, result, looks) -> int:
    """The counts, the notices, the report and the seed rounds' looks after a run; the exit code."""
    counts = result.counts()
    print(f"study {study.name}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()))
    _print_notices(study, sys.stdout)  # with the results they qualify; stderr stays for errors
    if not args.no_report:
        from .report import write_report

        text, out = write_report(
            result.tracking_uri,
            study=study.name,
            fmt="markdown",
            reports_dir=args.reports_dir,
            margin=study.report.equivalence_margin,
        )
        print()
        print(text)
        print(f"(written to {out})")
    if looks is not None:
        from .report.sequential import method_text
        from .seed_rounds import looks_text

        print(f"\nseeds added until decided ({method_text(study.seed_plan.spending)}):")
        print("\n".join(looks_text(looks)))
    # scripts and schedulers branch on the code: a failed trial is not a success (diverged is a result)
    return EXIT_TRIALS_FAILED if counts.get("failed") else EXIT_OK


def cmd_weights(args) -> int:
    from .models.convert import main as convert_main

    return convert_main(args)


def cmd_ui(args) -> int:
    from .tracking import open_store, resolve_tracking_uri

    if not 1 <= args.port <= 65535:  # else the server dies with uvicorn tracebacks after a minute, exit 0
        print(f"lsbench: error: --port {args.port}: a TCP port is 1 to 65535", file=sys.stderr)
        return EXIT_USAGE
    # a damaged store is one line here, not a server that dies with a traceback in its log
    uri = open_store(resolve_tracking_uri(args.tracking_uri, args.runs_dir), create=False, missing_ok=True)
    from .tracking.ui_server import port_problem, serve

    busy = port_problem(args.host, args.port)
    if busy:  # before the server starts: it would die with a traceback and leave its workers behind
        print(f"lsbench: error: {busy}", file=sys.stderr)
        return EXIT_USAGE
    url = f"http://{args.host}:{args.port}"
    print(f"MLflow UI for {uri} at {url} (Ctrl-C stops it)", flush=True)
    try:  # each study's runs table with lsbench's columns (MLflow has no default view to set instead)
        from .tracking import study_view_urls

        for name, view in study_view_urls(uri, url):
            print(f"  {name}: {view}", flush=True)
    except Exception:  # noqa: BLE001 - the links are a convenience; the server says what is wrong
        pass
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host}: anyone who can reach this address can read the runs", file=sys.stderr)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        "1",
    ]
    return serve(cmd, args.port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lsbench", description="Mixed-precision loss-scaling studies of SSD detectors")
    from . import __version__

    p.add_argument("--version", action="version", version=f"lsbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    add_run_parser(sub, cmd_run)

    sp = sub.add_parser("validate", help="validate study files and the paths they name; print their trial tables")
    sp.add_argument("files", nargs="+", help="study files (YAML) to check, each on its own")
    sp.add_argument(
        "--schema-only",
        action="store_true",
        help="check the file alone, not its data and weights paths (a study for another machine)",
    )
    sp.add_argument("--allow-large-grid", action="store_true", help="accept a grid of more than 1000 trials")
    sp.set_defaults(func=cmd_validate)

    report_parser(sub, store_args)
    register_plugins_parser(sub)

    # Listed for --help; main() hands `lsbench data ...` to data/download.py before parsing.
    sub.add_parser("data", help="download, verify and extract VOC or COCO: lsbench data {voc,coco} --root DIR")

    sp = sub.add_parser("weights", help="backbone weight files: lsbench weights convert IN OUT")
    wsub = sp.add_subparsers(dest="weights_command", required=True)
    wp = wsub.add_parser(
        "convert",
        help="the fc-reduced VGG16 (chainercv .npz or vgg16_reducedfc.pth) as a "
        "backbone file with conv6/conv7 for ssd300_vgg16/ssd512_vgg16",
    )
    wp.add_argument("input", help="chainercv ssd_vgg16_imagenet_converted_*.npz or amdegroot's vgg16_reducedfc.pth")
    wp.add_argument("output", help="the backbone file to write (model_options.backbone_weights)")
    wp.add_argument(
        "--format",
        choices=("auto", "chainercv", "pytorch"),
        default="auto",
        help="input layout (auto: .npz is chainercv, else PyTorch)",
    )
    wp.set_defaults(func=cmd_weights)

    sp = sub.add_parser("ui", help="serve the MLflow UI for the study store")
    store_args(sp)
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=5000, help="port to serve the UI on (default 5000)")
    sp.set_defaults(func=cmd_ui)
    return p


#: library output the CLI turns off (a user's own setting wins): MLflow draws a "Downloading artifacts"
#: progress bar for every artifact a report or a resumed trial reads, about two per trial;
#: lsbench prints its own progress. Set before MLflow is imported, and inherited by Ray's local workers.
QUIET_ENV = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


def main(argv: list[str] | None = None) -> int:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["data"]:
        # `lsbench data ...` has its own parser (data/download.py), imported only when used.
        from .data.download import main as data_main

        return int(data_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `lsbench validate ... | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # own flush at exit does not raise again, and exit as a process killed by SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, _user_errors()):  # first: a missing store (StoreMissing) is a wrong path, exit 2
            print(f"lsbench: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        store_error = getattr(sys.modules.get("lossscale_bench.tracking.store"), "StoreError", None)
        # a store fault inside a Ray callback reaches here wrapped: look down the cause chain
        cause, seen = exc, set()
        while store_error is not None and cause is not None and id(cause) not in seen:
            if isinstance(cause, store_error):
                print(f"lsbench: error: {cause}", file=sys.stderr)
                return EXIT_STORE
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        raise


if __name__ == "__main__":
    sys.exit(main())
