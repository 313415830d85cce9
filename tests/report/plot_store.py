"""A real SQLite MLflow store filled the way the trial code fills it, with step
histories and ``layers/layers_history.csv`` artifacts (for the plot tests)."""

from __future__ import annotations

import csv
import math
import struct
from pathlib import Path

STUDY = "plotty"
OTHER = "plotty_b"
LAYERS = ["backbone.0", "backbone.1", "backbone.2", "backbone.10", "head.loc.0", "head.conf.0"]
# telemetry.LayerHistory.FIELDS (telemetry imports torch; test_layers_csv_matches_telemetry checks it)
FIELDS = [
    "step",
    "layer",
    "underflow_rate",
    "flush_rate",
    "saturate_rate",
    "param_flush_rate",
    "param_saturate_rate",
    "nonzero",
    "scale",
    "accum_scale",
    "grad_format",
    "subnormal_below",
    "flush_at_or_below",
    "saturate_above",
]
STEPS = 40
LOG_EVERY = 5


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; asserts the magic bytes."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:16]
    assert png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def write_layers_csv(path: Path, *, adaptive: bool, steps: int = STEPS, every: int = LOG_EVERY) -> Path:
    """A layers history: every ``every`` steps one row per layer; scales only when adaptive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for step in range(0, steps, every):
            acc = 1.0
            for i, layer in enumerate(reversed(LAYERS)):  # backward order, as the probe records
                rate = min(1.0, 0.05 * i + step / (4 * steps)) if not adaptive else 0.01 * i
                scale = 2.0 ** (i % 3) if adaptive else ""
                acc = acc * scale if adaptive else ""
                w.writerow(
                    {
                        "step": step,
                        "layer": layer,
                        "underflow_rate": rate,
                        "flush_rate": rate / 10,
                        "nonzero": 1000 + i,
                        "scale": scale,
                        "accum_scale": acc,
                    }
                )
    return path


def _trial(
    client,
    exp_id,
    parent_id,
    study,
    tmp: Path,
    *,
    trial_id,
    row,
    label,
    status,
    seed,
    method="fixed",
    precision="mixed16",
    final_map=None,
    diverge_at=None,
    scale_path=None,
    layers=None,
):
    from mlflow.entities import Metric, Param

    tags = {
        "mlflow.parentRunId": parent_id,
        "lsbench.role": "trial",
        "lsbench.study": study,
        "lsbench.trial_id": trial_id,
        "lsbench.status": status,
        "lsbench.row": str(row),
        "lsbench.label": label,
        "lsbench.precision": precision,
        "lsbench.eval_metric": "voc07",
    }
    if diverge_at is not None:
        tags["lsbench.diverged_step"] = str(diverge_at)
    rid = client.create_run(exp_id, tags=tags, run_name=trial_id).info.run_id
    params = {
        "model": "ssd_tiny",
        "batch_size": "4",
        "seed": str(seed),
        "precision": precision,
        "scaling.method": method,
    }
    ts = 1_700_000_000_000
    metrics = []
    last = STEPS if diverge_at is None else diverge_at + 1
    for s in range(last):
        loss = 8.0 * math.exp(-s / 15) + 1.0 + 0.05 * seed + 0.1 * row
        if diverge_at is not None and s == diverge_at:
            loss = math.nan
        metrics.append(Metric("loss", loss, ts + s, s))
        if scale_path is not None:
            metrics.append(Metric("loss_scale", float(scale_path(s)), ts + s, s))
        metrics.append(Metric("lr", 0.001, ts + s, s))
    if final_map is not None:
        metrics += [
            Metric("map", final_map, ts, last),
            Metric("final_map", final_map, ts, last),
            Metric("final_map_50", final_map + 0.2, ts, last),
            Metric("best_map", final_map, ts, last),
        ]
    for i in range(0, len(metrics), 900):
        client.log_batch(
            rid, metrics=metrics[i : i + 900], params=[Param(k, v) for k, v in params.items()] if i == 0 else []
        )
    if layers is not None:
        csv_path = write_layers_csv(tmp / trial_id / "layers_history.csv", adaptive=layers == "adaptive", steps=last)
        client.log_artifact(rid, str(csv_path), "layers")
    if status != "running":
        client.set_terminated(rid, "FAILED" if status == "failed" else "FINISHED")
    return rid


def fill(root: Path) -> str:
    """Create the store under ``root``; returns its tracking URI."""
    from mlflow import MlflowClient

    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    tmp = root / "csv"

    def dyn(s):  # dynamic scaling: halves on overflow at steps 10 and 30, doubles every 10 clean steps
        scale = 2.0**16
        for t in range(1, s + 1):
            scale = scale / 2 if t in (10, 30) else scale * 2 if t % 10 == 0 else scale
        return scale

    for study in (STUDY, OTHER):
        exp = client.create_experiment(study, artifact_location=(root / "artifacts" / study).resolve().as_uri())
        parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": study}).info.run_id

        def T(**kw):
            return _trial(client, exp, parent, study, tmp / study, **kw)  # noqa: B023 - called in this iteration only

        if study == OTHER:
            T(
                trial_id="o0",
                row=0,
                label="adaptive",
                status="finished",
                seed=0,
                method="adaptive",
                final_map=0.2,
                scale_path=lambda s: 1024.0,
                layers="adaptive",
            )
            continue
        for seed, m in ((0, 0.30), (1, 0.31)):
            T(
                trial_id=f"r0-s{seed}",
                row=0,
                label="FP32 baseline",
                status="finished",
                seed=seed,
                method="none",
                precision="fp32",
                final_map=m,
                scale_path=lambda s: 1.0,
            )
        for seed, m in ((0, 0.33), (1, 0.34)):
            T(
                trial_id=f"r1-s{seed}",
                row=1,
                label="adaptive",
                status="finished",
                seed=seed,
                method="adaptive",
                final_map=m,
                scale_path=lambda s: 1024.0,
                layers="adaptive" if seed == 0 else None,
            )
        for seed, m in ((0, 0.32), (1, 0.325)):
            T(
                trial_id=f"r2-s{seed}",
                row=2,
                label="loss scale (dynamic, interval=10)",
                status="finished",
                seed=seed,
                method="dynamic",
                final_map=m,
                scale_path=dyn,
            )
        T(
            trial_id="r2-s2",
            row=2,
            label="loss scale (dynamic, interval=10)",
            status="diverged",
            seed=2,
            method="dynamic",
            diverge_at=25,
            scale_path=dyn,
        )
        for seed in (0, 1):
            T(
                trial_id=f"r3-s{seed}",
                row=3,
                label="no loss scale",
                status="diverged",
                seed=seed,
                diverge_at=12 + seed,
                scale_path=lambda s: 1.0,
                layers="plain" if seed == 0 else None,
            )
        T(trial_id="r4-s0", row=4, label="loss scale (8)", status="failed", seed=0, scale_path=lambda s: 8.0)
    return uri


_STORES: dict[str, str] = {}


def shared_store(tmp_path_factory) -> str:
    """One store per pytest session, shared by the test modules that import this one."""
    base = str(tmp_path_factory.getbasetemp())
    if base not in _STORES:
        _STORES[base] = fill(tmp_path_factory.mktemp("plot-store"))
    return _STORES[base]
