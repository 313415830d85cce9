"""Detectors from outside the package: a builder named by import path, and one an installed
distribution declares as an entry point, validate, train and report with no package edit.

Why: the registry was closed (``model: [mymodels:ssdlite]`` was "unknown model"), and with the least
edit that opened it an edited model file kept its trial ids, so finished trials of the old model would
have been reused. Checked here, with real model files written by the tests and the real CLI: a study
names a builder by import path, found in the study file's folder; its options are checked against the
builder's signature at validate; it trains through ``lsbench run --executor local`` and ``lsbench
report`` reads it back, its run tagged with the plug-in's name, origin and digest; editing the file
changes the trial ids (a built-in row's id does not change); a plug-in that cannot be found or used
is one line, exit 2, at validate or before any run is opened (the store then holds no run at all).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_error_line, study_yaml
from lossscale_bench.study import load_study

MODEL_FILE = '''"""A detector of the test's own: the package's ssd_tiny, wrapped."""

from lossscale_bench.models.ssd import ssd_tiny


def tiny_detector(num_classes, *, image_size: int = 64, width: int = 8, dropout_free: bool = True):
    """ssd_tiny at a width of one's own.

    Args:
        image_size: Input size in pixels.
        width: Channel width of the backbone's first stage.
        dropout_free: Has no effect (an option only this builder takes).
    """
    return ssd_tiny(num_classes, image_size=image_size, width=width)


def not_a_detector(num_classes, **options):
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, num_classes)

        def forward(self, images, targets=None):
            return self.fc(torch.stack([i.mean((1, 2)) for i in images]))

    return Classifier()
'''


def _cli(*args, cwd: Path, path: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [path, os.environ.get("PYTHONPATH", "")] if p)}
    return subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _study(tmp_path: Path, model: str = "mymodels:tiny_detector", options="{width: 8}", name="plug") -> Path:
    (tmp_path / "mymodels.py").write_text(MODEL_FILE)
    study = tmp_path / f"{name}.yaml"
    study.write_text(
        study_yaml(
            name=name,
            model=model,
            model_options=options,
            batch_size=2,
            schedule={"iterations": 3, "lr": 0.01, "warmup_iterations": 1},
            dataset={"name": "synthetic", "train_images": 6, "val_images": 2, "image_size": 64, "seed": 0},
        )
    )
    return study


# ---------------------------------------------------------------------------------------- import path
def test_an_import_path_model_is_found_in_the_study_folder_and_its_options_come_from_its_signature(tmp_path):
    study = load_study(_study(tmp_path, options="{width: 8, dropout_free: false}"))
    plugin = study.model_plugin("mymodels:tiny_detector")
    assert plugin.origin == "import path mymodels:tiny_detector" and len(plugin.digest) == 16
    assert [o.name for o in plugin.options] == ["image_size", "width", "dropout_free"]
    assert plugin.option("width").default == 8 and plugin.option("width").doc.startswith("Channel width")
    (trial,) = study.trials()
    assert trial.model_options == {"width": 8, "dropout_free": False}  # its own key, accepted
    assert trial.plugins == {"model": {"name": "mymodels:tiny_detector", **plugin.identity()}}
    assert str(tmp_path) not in str(trial.identity())  # no machine path in the id
    assert trial.plugin_tags()["lsbench.plugin.model.digest"] == plugin.digest


def test_editing_the_model_file_changes_the_trial_ids_and_a_built_in_rows_do_not(tmp_path):
    path = _study(tmp_path)
    before = load_study(path).trials()[0].trial_id
    (tmp_path / "b").mkdir()
    tiny = _study(tmp_path / "b", model="ssd_tiny", name="builtin")
    tiny_before = load_study(tiny).trials()[0].trial_id
    (tmp_path / "mymodels.py").write_text(MODEL_FILE + "\n# an edit\n")
    assert load_study(path).trials()[0].trial_id != before
    assert load_study(tiny).trials()[0].trial_id == tiny_before
    assert "plugins" not in load_study(tiny).trials()[0].identity()  # built-ins add nothing


@pytest.mark.parametrize(
    "model, options, words",
    [
        ("nowhere_module:build", "{width: 8}", ["model[0]", "module 'nowhere_module' not found"]),
        ("mymodels:no_such_builder", "{width: 8}", ["model[0]", "has no attribute 'no_such_builder'"]),
        ("mymodels:tiny_detector", "{width: 8, depth: 3}", ["model_options.depth", "unknown key"]),
        ("ssd_tiny", "{dropout_free: true}", ["model_options.dropout_free", "unknown key"]),
    ],
    ids=["module-not-found", "no-attribute", "option-it-does-not-take", "builtin-refuses-it"],
)
def test_a_bad_import_path_is_one_line_at_validate(tmp_path, model, options, words):
    study = _study(tmp_path, model=model, options=options)
    line = one_error_line(_cli("validate", "--schema-only", study, cwd=tmp_path), str(study), *words)
    assert line.startswith("lsbench: error: ")


def test_a_mixed_grid_takes_only_the_options_every_model_takes(tmp_path):
    study = _study(tmp_path, model="[ssd_tiny, mymodels:tiny_detector]", options="{dropout_free: true}")
    one_error_line(
        _cli("validate", "--schema-only", study, cwd=tmp_path),
        "model_options.dropout_free: only meaningful for mymodels:tiny_detector, but the grid has ssd_tiny",
    )


def test_a_builder_that_is_not_a_detector_stops_the_run_before_any_run_is_opened(tmp_path):
    study = _study(tmp_path, model="mymodels:not_a_detector", options=None)
    assert _cli("validate", "--schema-only", study, cwd=tmp_path).returncode == 0  # it is a callable
    r = _cli("run", study, "--executor", "local", "--runs-dir", tmp_path / "runs", "--quiet", cwd=tmp_path)
    one_error_line(
        r,
        "model[0]: mymodels:not_a_detector is not a detector",
        "in training, model(images, targets) returned a Tensor (expected a dict of loss tensors)",
    )
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("meta.yaml")), "a run was opened"
    assert not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.slow
def test_an_import_path_model_trains_and_reports_with_its_tags(tmp_path):
    study = _study(tmp_path)
    assert _cli("validate", study, cwd=tmp_path).returncode == 0
    r = _cli("run", study, "--executor", "local", "--runs-dir", "runs", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "1 finished" in r.stdout and "mymodels:tiny_detector" in r.stdout, r.stdout[-2000:]
    r = _cli("report", "--runs-dir", "runs", "--study", "plug", cwd=tmp_path)
    assert r.returncode == 0 and "mymodels:tiny_detector" in r.stdout, r.stderr[-2000:]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("plug")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    tags = run.data.tags
    assert tags["lsbench.plugin.model.name"] == "mymodels:tiny_detector"
    assert tags["lsbench.plugin.model.origin"] == "import path mymodels:tiny_detector"
    assert tags["lsbench.plugin.model.digest"] == load_study(study).model_plugin("mymodels:tiny_detector").digest


# ---------------------------------------------------------------------------------------- entry points
def _distribution(site: Path, version: str) -> None:
    """A distribution ``tinydet`` whose entry point names the test's builder, as an installer leaves it."""
    (site / "tinydet").mkdir(parents=True, exist_ok=True)
    (site / "tinydet" / "__init__.py").write_text(MODEL_FILE)
    info = site / f"tinydet-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tinydet\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[lossscale_bench.models]\ntinydet_ssd = tinydet:tiny_detector\n")


def test_an_entry_point_model_is_a_name_and_its_version_is_in_the_ids(tmp_path):
    ids = {}
    for version in ("0.1", "0.2"):
        site = tmp_path / f"site{version}"
        _distribution(site, version)
        study = _study(tmp_path, model="tinydet_ssd")
        r = _cli("run", study, "--dry-run", cwd=tmp_path, path=str(site))
        assert r.returncode == 0, r.stderr[-2000:]
        ids[version] = [w for w in r.stdout.split() if w.startswith("tinydet_ssd-")]
        r = _cli("plugins", cwd=tmp_path, path=str(site))
        assert "tinydet_ssd" in r.stdout and f"entry point lossscale_bench.models of tinydet {version}" in r.stdout
    assert ids["0.1"] and ids["0.1"] != ids["0.2"]  # a new version never reuses the old one's results
    r = _cli("validate", "--schema-only", _study(tmp_path, model="tinydet_ssd"), cwd=tmp_path)
    one_error_line(r, "model: unknown model 'tinydet_ssd'")  # not installed here
