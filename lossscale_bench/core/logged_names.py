"""Every metric and tag lsbench writes to the MLflow store, with what it means: the one list.

The code that logs a value names it where it logs it (a trainer hook, a scaler's ``metrics()``,
the tracker); this table says what each name means for someone reading the store or the MLflow UI,
and ``docs/reference/metrics.md`` is generated from it (``tools/gen_reference.py``). The generator
fails when the package names an ``lsbench.*`` tag that has no entry here, and
``tests/test_reference_docs.py`` runs real trials and fails when one logs a metric whose name no
entry matches. A part in angle brackets stands for one of the values it lists (``<mean,max>``) or
for any text (``<prefix>``).
"""

from __future__ import annotations

import re

__all__ = ["EXPERIMENT_TAGS", "METRICS", "TAGS", "entry_for"]

#: metric name (or pattern) -> what it is; logged on trial runs unless the text says otherwise
METRICS: dict[str, str] = {
    # every step (the per-step values are kept; a window of log_every steps is written at a time)
    "lr": "Learning rate of the step.",
    "loss": "Training loss of the step (non-finite values are logged as such).",
    "loss_<part>": "A part of the training loss: `loss_classification`, `loss_bbox_regression`.",
    "overflow": "1 when the step's gradients were not finite, else 0.",
    "skipped": "1 when the optimizer step was skipped (non-finite gradients), else 0.",
    "skipped_steps": "Steps skipped so far.",
    "images_per_sec": "Training throughput of the step.",
    "loss_scale": "The loss scale of the step (a per-layer method: the scale of the loss itself).",
    # logged steps (every log_every steps and the last): gradient telemetry over the layers
    "underflow_rate_<mean,max>": "Share of a layer's gradient elements below the gradient format's "
    "smallest normal, mean and max over the layers.",
    "flush_rate_<mean,max>": "Share of a layer's activation-gradient elements flushed to zero in the gradient "
    "format, mean and max over the layers.",
    "saturate_rate_<mean,max>": "Share of a layer's activation-gradient elements at or past the format's "
    "largest value, mean and max over the layers.",
    "param_flush_rate_<mean,max>": "As `flush_rate`, for the parameter gradients.",
    "param_saturate_rate_<mean,max>": "As `saturate_rate`, for the parameter gradients.",
    "layers_mostly_flushed": "Layers with more than half of their gradient elements flushed.",
    # scaling methods (logged steps)
    "<prefix>scale_log2_<min,median,max>": "A per-layer method's layer factors, log2, over the layers (last "
    "step); `<prefix>` is `ada_` (adaptive), `amax_`, `lw_` "
    "(layerwise_dynamic) or `layer_`.",
    "<prefix>accum_scale_log2_<min,max>": "A per-layer method's accumulated scales (the product of the factors "
    "down to each layer), log2.",
    "<prefix>merge_points": "A per-layer method's scaling points merged with their neighbour.",
    "<prefix>point_scale_log2_<min,median,max>": "A point scaler's absolute scale per scaling point, log2.",
    "lw_points_backed_off": "layerwise_dynamic: scaling points whose scale backed off at the step.",
    "dyn_hysteresis_left": "dynamic, style deepspeed: overflows left before the scale is halved.",
    "saturated_share": "saturation: share of parameter-gradient elements at or past the format's maximum.",
    # evaluations
    "map": "Validation mAP (a fraction) at an evaluation (`eval.every` and the last step).",
    "map_50": "Validation mAP at IoU 0.5 (a fraction) at an evaluation.",
    "final_map": "mAP of the last evaluation: the report's default metric.",
    "final_map_50": "mAP at IoU 0.5 of the last evaluation.",
    "best_map": "The best evaluation's mAP.",
    "skipped_steps_total": "Steps skipped over the whole trial.",
    # the device (end of training)
    "host_max_rss_mb": "cpu backend: the process's peak resident memory, MiB.",
    "host_minor_faults": "cpu backend: the process's minor page faults.",
    "host_freed_memory_kept": "cpu backend: 1 when the allocator keeps freed memory (`LSBENCH_MALLOC`).",
    "gpu_max_<allocated,reserved>_mb": "cuda backend: peak memory allocated and reserved by torch, MiB.",
    "hpu_max_allocated_mb": "hpu backend: peak memory allocated, MiB.",
    "replica_param_drift": "Multi-device trials: the largest difference between the replicas' parameter sums.",
    # the study's parent run
    "trials_<status>": "On the study's parent run: trials finished, diverged, failed, pending, and in total "
    "(`trials_total`), counted from the store.",
}

#: run tag (or pattern) -> what it holds
TAGS: dict[str, str] = {
    "lsbench.role": "`study` (the parent run of a study) or `trial`.",
    "lsbench.study": "The study's name (also an experiment tag).",
    "lsbench.status": "The trial's state: `pending`, `running`, `finished`, `diverged`, `failed` or "
    "`interrupted`; on the parent run, `finished` or `failed` (or `interrupted`).",
    "lsbench.trials": "On the parent run: the trials' counts in words.",
    "lsbench.trial_id": "The trial id: everything that affects training, hashed (resume finds a trial by it).",
    "lsbench.config_id": "The trial id without the seed: the seeds of one report row share it.",
    "lsbench.label": "The row's label in the report tables.",
    "lsbench.row": "The scaling entry's index in the study file.",
    "lsbench.precision": "The trial's precision.",
    "lsbench.emulated": "Whether the precision is a CPU emulation (`true`/`false`).",
    "lsbench.baseline": "Whether the trial belongs to the study's baseline row.",
    "lsbench.eval_metric": "The evaluation protocol (`coco`, `voc07`, `voc`).",
    "lsbench.backend": "The backend and device the trial ran on, in words.",
    "lsbench.error": "A failed trial's error (its last lines).",
    "lsbench.previous_error": "The error of the attempt before a rerun.",
    "lsbench.failed_attempts": "How many attempts of the trial failed before this one.",
    "lsbench.retries": "Retries of the trial under Ray after its process died.",
    "lsbench.resumed_from_step": "The checkpoint step the trial resumed from.",
    "lsbench.plot_error": "Why the trial's plots could not be drawn (the trial's result stands).",
    "lsbench.diverged_step": "The step at which training diverged.",
    "lsbench.diverged_reason": "Why it counts as diverged (non-finite loss, too many skipped steps, ...).",
    "lsbench.diverged_scale": "The loss scale when it diverged.",
    "lsbench.last_finite_loss": "The last finite training loss before the divergence.",
    "lsbench.data.<split>.images": "Images in the `train` or `val` split.",
    "lsbench.data.<split>.<skipped>": "What the loader skipped in a split, counted: `skipped_boxes`, "
    "`crowd_boxes`, `dropped_difficult`; `unknown_objects` and "
    "`dropped_annotations` (with `dataset.bad_annotations: drop`) as JSON "
    "counts by reason.",
    "lsbench.plugin.<kind>.name": "A plug-in from outside the package the trial uses (`<kind>`: model, method, precision or dataset): "
    "its name (a model's import path, or an entry point's name).",
    "lsbench.plugin.<kind>.origin": "Where that plug-in comes from: `import path ...` or "
    "`entry point <group> of <distribution> <version>`.",
    "lsbench.plugin.<kind>.digest": "sha256 of that plug-in's source (its module file; for "
    "an entry point also its distribution's version and RECORD hashes), also in the trial id.",
    "lsbench.world_size": "Multi-device trials: the number of replicas.",
    "lsbench.replica_param_drift": "Multi-device trials: the replicas' largest parameter-sum difference.",
    "lsbench.replicas_missing": "Multi-device trials: ranks whose end record did not arrive.",
    "lsbench.replica_status": "Multi-device trials: each rank's status and error.",
    "mlflow.parentRunId": "A trial run's parent: the study's run (MLflow nests the trials under it).",
    "mlflow.note.content": "The run's description in the UI: status, final mAP or why it diverged or failed.",
}

#: experiment tag (or pattern) -> what it holds
EXPERIMENT_TAGS: dict[str, str] = {
    "lsbench.study": "The study's name.",
    "mlflow.experimentKind": "`custom_model_development`: the UI opens the experiment's model-training pages.",
    "mlflow.sharedViewState.<key>": "lsbench's saved runs-table view (key `lsbench`: label, status, final mAP, "
    "skipped steps, grouped by status), opened by the link `lsbench ui` prints.",
}


def _pattern(name: str) -> re.Pattern:
    """A table name as a regular expression: ``<a,b>`` one of the values, ``<text>`` any text."""
    parts = re.split(r"(<[^>]+>)", name)
    return re.compile(
        "".join(
            ("(" + "|".join(map(re.escape, p[1:-1].split(","))) + ")" if "," in p else ".+")
            if p.startswith("<")
            else re.escape(p)
            for p in parts
        )
        + r"\Z"
    )


def entry_for(name: str, table: dict[str, str]) -> str | None:
    """The key of ``table`` (:data:`METRICS`, :data:`TAGS`, ...) that describes the logged ``name``, or None."""
    return next((key for key in table if _pattern(key).match(name)), None)
