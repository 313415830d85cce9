"""A data set of one's own, named by import path (``dataset: {name: mydata:squares, ...}``), with no
package edit: found in the study file's folder; its keys checked against the callable's signature at
validate (an unknown key, a required one missing, one the trial gives, a missing module or callable:
one line each, exit 2); one that returns no data set stopped before any run is opened; trained and
reported through the real CLI, its run tagged with the plug-in's name, origin and digest; editing
its file, or a file under its ``root``, changes the trial ids. The module and the study keys are the
ones docs/guide/data.md gives ("A data set of your own, in code").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from helpers import lsbench, one_error_line, study_yaml
from lossscale_bench.study import load_study

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "data.md"
#: the section of the data page this file follows: its module and its study keys
SECTION = PAGE.read_text().split("## A data set of your own, in code")[1]
PAGE_CODE = re.search(r"```python\n(.*?)```", SECTION, flags=re.S).group(1)
PAGE_KEYS = yaml.safe_load(re.search(r"```yaml\n(.*?)```", SECTION, flags=re.S).group(1))
DATA_FILE = (
    PAGE_CODE
    + '''

def in_folder(n_train: int, root=None, image_size=None):
    """The page's squares, from a folder (not read).

    Args:
        n_train: Training images.
        root: Its folder.
    """
    return squares(n_train, 2, image_size=image_size)


def not_a_data_set(n_train: int = 1):
    return [1, 2, 3]
'''
)


def _study(tmp_path: Path, dataset: dict | None = None, name: str = "own-data") -> Path:
    (tmp_path / "mydata.py").write_text(DATA_FILE)
    study = tmp_path / f"{name}.yaml"
    study.write_text(
        study_yaml(
            name=name,
            dataset=dataset or {**PAGE_KEYS["dataset"], "n_train": 6, "n_val": 2},
            model=PAGE_KEYS["model"],
            model_options=PAGE_KEYS["model_options"],
            batch_size=2,
            schedule={"iterations": 3, "lr": 0.01, "warmup_iterations": 1},
        )
    )
    return study


def test_the_data_sets_keys_come_from_its_signature_and_its_identity_from_its_file(tmp_path):
    study = load_study(_study(tmp_path, {"name": "mydata:squares", "n_train": 6, "seed": 3}))
    plugin = study.dataset_plugin()
    assert plugin.origin == "import path mydata:squares" and len(plugin.digest) == 16
    assert [o.name for o in plugin.options] == ["n_train", "n_val", "seed", "image_size", "max_val_images"]
    assert plugin.required == ("n_train",) and plugin.option("n_val").doc == "Validation images."
    (trial,) = study.trials()
    assert trial.dataset == {"name": "mydata:squares", "n_train": 6, "seed": 3, "root": None}
    assert trial.plugins == {"dataset": {"name": "mydata:squares", **plugin.identity()}}
    assert trial.plugin_tags()["lsbench.plugin.dataset.digest"] == plugin.digest


def test_editing_the_data_sets_file_or_a_file_under_its_root_changes_the_trial_ids(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "labels.txt").write_text("a\n")
    path = _study(tmp_path, {"name": "mydata:in_folder", "n_train": 6, "root": "d"})
    first = load_study(path).trials()[0]
    assert str(tmp_path) not in str(first.identity())  # the folder's content, not its path
    (tmp_path / "d" / "labels.txt").write_text("b\n")  # same size, other content
    second = load_study(path).trials()[0].trial_id
    assert second != first.trial_id
    (tmp_path / "mydata.py").write_text(DATA_FILE + "\n# an edit\n")
    (tmp_path / "e.yaml").write_text(path.read_text())
    assert load_study(tmp_path / "e.yaml").trials()[0].trial_id not in (first.trial_id, second)


@pytest.mark.parametrize(
    "dataset, words",
    [
        ({"name": "nowhere_data:build"}, ["dataset.name", "module 'nowhere_data' not found"]),
        ({"name": "mydata:no_such_set", "n_train": 6}, ["dataset.name", "has no attribute 'no_such_set'"]),
        (
            {"name": "mydata:squares", "n_train": 6, "colour": "red"},
            ["dataset.colour: not an option of mydata:squares; allowed: n_train, n_val, seed"],
        ),
        ({"name": "mydata:squares", "n_val": 2}, ["dataset.n_train", "required key missing"]),
        ({"name": "mydata:squares", "n_train": 6, "image_size": 32}, ["dataset.image_size", "given by the trial"]),
        ({"name": "no_such_set"}, ["dataset.name", "unknown dataset 'no_such_set'"]),
    ],
    ids=["module-not-found", "no-attribute", "unknown-key", "required-missing", "trials-key", "unknown-name"],
)
def test_a_bad_data_set_by_import_path_is_one_line_at_validate(tmp_path, dataset, words):
    study = _study(tmp_path, dataset)
    line = one_error_line(lsbench("validate", "--schema-only", study, cwd=tmp_path), str(study), *words)
    assert line.startswith("lsbench: error: ")


def test_a_callable_that_returns_no_data_set_stops_the_run_before_any_run_is_opened(tmp_path):
    study = _study(tmp_path, {"name": "mydata:not_a_data_set"})
    assert lsbench("validate", "--schema-only", study, cwd=tmp_path).returncode == 0  # it is a callable
    r = lsbench("run", study, "--executor", "local", "--runs-dir", tmp_path / "runs", "--quiet", cwd=tmp_path)
    one_error_line(r, "dataset.name: dataset mydata:not_a_data_set is not a data set: it returned list")
    assert not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.slow
def test_the_pages_data_set_trains_and_reports_with_its_tags(tmp_path):
    study = _study(tmp_path)
    assert lsbench("validate", study, cwd=tmp_path).returncode == 0
    r = lsbench("run", study, "--executor", "local", "--runs-dir", "runs", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "1 finished" in r.stdout, r.stdout[-2000:]
    r = lsbench("report", "--runs-dir", "runs", "--study", "own-data", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("own-data")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["lsbench.plugin.dataset.name"] == "mydata:squares"
    assert tags["lsbench.plugin.dataset.digest"] == load_study(study).dataset_plugin().digest
    assert tags["lsbench.data.train.images"] == "6" and tags["lsbench.data.val.images"] == "2"
    assert "mAP" in metrics or any(k.startswith("map") for k in metrics), sorted(metrics)
