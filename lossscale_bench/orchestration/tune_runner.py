"""The Ray path of a study: its pending trials as one Ray Tune run on the joined cluster.

Why apart from ``study_runner``: this is the only code that talks to Tune
(the trainable each worker runs, the resources each trial asks for, the
``Tuner`` itself); the study runner decides *what* runs and records it, the
same for both executors. A single-device trial runs ``run_trial`` in the Tune
worker and reports through ``TuneSink``; a multi-device one drives a Ray Train
run (``distributed``). Either way the driver's ``MlflowFunnel`` writes MLflow.
Ray is imported inside the functions: ``cli`` imports the package for a dry run.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .outcomes import StudyResult, record_failure
from .placement import threads_of
from .progress import Progress
from .tune_sink import TuneSink

if TYPE_CHECKING:
    from ..tracking.tracker import Tracker


def _tune_trainable(config: dict) -> None:
    """The Tune function trainable: one lossscale_bench trial."""
    from .placement import is_distributed
    from .quiet_exit import quiet_exit_in_finalizers

    quiet_exit_in_finalizers()  # Ray's SIGTERM at the end must not print a traceback (quiet_exit.py)

    spec = config["trial"]
    if is_distributed(spec["cfg"]["resources"]):
        # devices_per_trial > 1: this function drives a Ray Train TorchTrainer and relays rank 0's reports.
        from .distributed import run_distributed_trial

        run_distributed_trial(spec)
        return
    from ..trial import run_trial

    sink = TuneSink()
    outcome = run_trial(spec["cfg"], sink=sink, trial_dir=spec["trial_dir"], threads=spec["threads"])
    sink.flush(outcome=outcome.to_dict())


def _resources_of(config: dict):
    from ray.tune import PlacementGroupFactory

    from .placement import driver_bundle, is_distributed

    res = config["trial"]["cfg"]["resources"]
    if is_distributed(res):
        # Train V2 reserves the workers' devices in its own placement group; the Tune trial only drives it.
        return PlacementGroupFactory([driver_bundle(res)])
    return PlacementGroupFactory([config["trial"]["resources"]])


def _trial_specs(todo, sdir) -> list[dict]:
    """What each Tune trial gets in its config: the trial, its folder, its threads and its Tune bundle."""
    from ..backends import ray_resources

    specs = []
    for cfg in todo:
        res = ray_resources(
            cfg.resources.get("backend", "cpu"),
            int(cfg.resources.get("devices_per_trial", 1)),
            float(cfg.resources.get("cpus_per_trial", 1)),
        )
        specs.append(
            {
                "cfg": cfg.to_dict(),
                "trial_dir": str(sdir / "trials" / cfg.trial_id),
                "threads": threads_of(cfg.resources),
                "resources": res,
            }
        )
    return specs


def run_tune(
    study,
    todo,
    tracker: Tracker,
    run_ids: dict[str, str],
    continued: dict[str, tuple],
    labels: dict[str, str],
    sdir,
    result: StudyResult,
    progress: Progress,
    max_concurrent: int | None,
    trial_plots=None,
) -> None:
    """The trials as one Tune run on the cluster :func:`.cluster.connect_ray` joined; ``continued``:
    the trials whose stored runs are taken up again as each starts (:func:`.outcomes.begin_trial`)."""
    import ray
    from ray import tune

    from .funnel import MlflowFunnel

    if max_concurrent is None:
        # multi-device trials hold their devices through Ray Train, not the Tune bundle:
        # do not start more trials than the cluster's devices can serve
        from .placement import tune_concurrency

        max_concurrent = tune_concurrency([c.resources for c in todo], ray.cluster_resources())
    funnel = MlflowFunnel(
        tracker,
        run_ids,
        labels,
        result,
        progress,
        {c.trial_id: int(c.schedule["iterations"]) for c in todo},
        trial_plots,
        continued,
    )
    # Tune's own result files are off (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS): MLflow holds the results,
    # so its end-of-run complaint that they are missing is noise.
    import logging

    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    tuner = tune.Tuner(
        tune.with_resources(_tune_trainable, _resources_of),
        param_space={"trial": tune.grid_search(_trial_specs(todo, sdir))},
        # reuse_actors: a worker process runs trial after trial, so each trial no longer pays a process
        # start, the imports of torch and the package, and the rounding kernels' compilation (~10 s a
        # trial on 2 cores, benchmarks/trial_cost.py); run_trial seeds every RNG and sets its threads
        # itself, so a trial in a reused worker trains bit for bit as in a fresh one (tested)
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent,
            reuse_actors=True,
            trial_dirname_creator=lambda t: t.config["trial"]["cfg"]["trial_id"],
        ),
        run_config=tune.RunConfig(
            name=f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=str(sdir / "ray"),
            callbacks=[funnel],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=study.max_failures),
        ),
    )
    # Ctrl-C is ours (run_study's SignalsRaise), not Tune's: its handler ends the run quietly as if done
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    tuner.fit()
    for cfg in todo:  # a trial Ray never reported on (cancelled) stays visible as failed
        if cfg.trial_id not in result.outcomes:
            record_failure(tracker, result, cfg.trial_id, run_ids[cfg.trial_id], "no result from Ray")
