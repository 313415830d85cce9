"""The study file's ``report:`` section (the equivalence margin) changes no id of any trial.

Why a test: a trial id is what ``lsbench run`` uses to skip finished work and the report to pool seeds
(:mod:`lossscale_bench.study.grid`, :mod:`lossscale_bench.study.configs`). A report setting that leaked into
an id would re-run every finished trial of a study the day its margin changed. So every shipped study's
trial ids, configuration ids and study-setting ids are held to the values they had before the section
existed (``shipped_ids.json``), and changing the margin must change none of them.

The pinned parts: a study that reads files (VOC, COCO, backbone weights) has their content fingerprints
in its ids, which differ between a machine with the data and one without, and a CUDA study's default
loader depends on whether DALI is installed. Both are pinned here (every fingerprint reads ``pinned``, DALI
reads as installed), so the ids are the same on every machine; everything else is the real recipe.
A deliberate id change (a model or method version bump) updates ``shipped_ids.json`` in the same commit:
``python -c "import tests.study.test_report_settings as t; t.write_ids()"`` from the repository root.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lossscale_bench.study import StudyError, grid, load_study, load_study_text
from lossscale_bench.study.configs import setting_id

ROOT = Path(__file__).resolve().parents[2]
IDS_FILE = Path(__file__).with_name("shipped_ids.json")
SHIPPED = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("studies/*.yaml")) + ["lossscale_bench/studies/smoke.yaml"]


def _pin(monkeypatch) -> None:
    real_fingerprint, real_find_spec = grid.trial_fingerprint, importlib.util.find_spec
    monkeypatch.setattr(grid, "trial_fingerprint", lambda ds, mo: {k: "pinned" for k in real_fingerprint(ds, mo)})
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "nvidia.dali" else real_find_spec(name, *a)
    )


def _ids(study) -> list[str]:
    """``trial_id config_id setting_id`` per trial, in grid order."""
    return [f"{t.trial_id} {t.config_id()} {setting_id(t.flat_params())}" for t in study.trials()]


def _with_margin(rel: str, margin: str):
    """The shipped study with ``report: {equivalence_margin: <margin>}`` added, read as from its own folder."""
    path = ROOT / rel
    text = path.read_text(encoding="utf-8").rstrip("\n") + f"\nreport: {{equivalence_margin: {margin}}}\n"
    return load_study_text(text, str(path), base_dir=path.parent)


def write_ids() -> None:  # pragma: no cover - run by hand after a deliberate id change
    with pytest.MonkeyPatch.context() as mp:
        _pin(mp)
        ids = {rel: _ids(load_study(ROOT / rel)) for rel in SHIPPED}
    IDS_FILE.write_text(json.dumps(ids, indent=1) + "\n", encoding="utf-8")


def test_the_list_covers_every_shipped_study():
    assert set(json.loads(IDS_FILE.read_text(encoding="utf-8"))) == set(SHIPPED)
    assert len(SHIPPED) >= 10


@pytest.mark.parametrize("rel", SHIPPED)
def test_shipped_study_ids_are_unchanged_and_the_margin_changes_none(rel, monkeypatch):
    _pin(monkeypatch)
    want = json.loads(IDS_FILE.read_text(encoding="utf-8"))[rel]
    study = load_study(ROOT / rel)
    assert study.report.equivalence_margin == 1.0  # no shipped study sets it: the default
    assert _ids(study) == want
    params = [t.flat_params() for t in study.trials()]
    for margin in ("0.25", "5"):
        other = _with_margin(rel, margin)
        assert other.report.equivalence_margin == float(margin)
        assert _ids(other) == want
        assert [t.flat_params() for t in other.trials()] == params  # nothing of it is logged as a param


def test_a_bad_margin_is_one_line_naming_the_file_and_the_field(tmp_path):
    base = (
        "name: t\ndataset: synthetic\nmodel: ssd_tiny\nbatch_size: 8\nprecision: fp32\nscaling: [none]\n"
        "schedule: {iterations: 10, lr: 0.001}\n"
    )
    # outside [1e-6, 100] mAP points the report's statistics divided by zero (1e-300) or overflowed (1e308),
    # after `lsbench run` had trained every trial
    for value, problem in (
        ("-1", "-1 is out of range"),
        ("0", "0 is out of range"),
        ("abc", "expected a number"),
        (".nan", "expected a finite number"),
        ("true", "expected a number"),
        ("1.0e-300", "1e-300 is out of range"),
        ("1.0e+308", "1e+308 is out of range"),
        ("1.0e-7", "1e-07 is out of range"),
        ("100.5", "100.5 is out of range"),
    ):
        f = tmp_path / "m.yaml"
        f.write_text(base + f"report: {{equivalence_margin: {value}}}\n")
        with pytest.raises(StudyError) as e:
            load_study(f)
        text = str(e.value)
        assert len(text.splitlines()) == 1 and str(f) in text and "report.equivalence_margin" in text
        assert problem in text and "allowed: numbers 1e-06 <= x <= 100 (mAP points" in text
    f.write_text(base + "report: {margin: 1}\n")
    with pytest.raises(StudyError, match=r"report\.margin: unknown key; allowed: equivalence_margin"):
        load_study(f)
    f.write_text(base + "report:\n")  # an empty section: the defaults
    assert load_study(f).report.equivalence_margin == 1.0
