"""Trial identity: ids by content, configurations kept apart in the store, the report and `run`.

The two cases behind it: a study re-run under its name with another ``lr``
had its row average both lr values as seeds (and count the old
configuration's failures); the same study pointed at another VOC folder
reported "1 of 1 trials already finished" and the old mAP.
"""

from __future__ import annotations

import io
import os
import shutil
import time

import pandas as pd
import pytest

from helpers import tiny_data_study
from lossscale_bench.study import load_study_text
from lossscale_bench.study.configs import change_note
from lossscale_bench.study.fingerprint import MISSING, data_fingerprint, file_sha256, weights_fingerprint

TINY = """
name: ident
dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64}
model: [ssd_tiny]
model_options: {width: 8, image_size: 64}
batch_size: [2]
precision: fp32
scaling: [{method: none, label: plain}]
seeds: SEEDS
schedule: {iterations: 3, lr: LR}
eval: {metric: coco}
"""


def _study(lr="0.01", seeds="[0, 1, 2]", extra=""):
    return load_study_text(TINY.replace("LR", lr).replace("SEEDS", seeds) + extra)


def _voc_study(root, weights=None):
    extra = f", backbone_weights: {weights}" if weights else ""
    return load_study_text(f"""
name: tinyvoc
dataset: {{name: voc, root: {root}, classes: [square, disc]}}
model: [ssd_tiny]
model_options: {{width: 8, image_size: 64{extra}}}
batch_size: [2]
precision: fp32
scaling: [{{method: none}}]
schedule: {{iterations: 2, lr: 1.0e-3}}
eval: {{metric: voc07}}
""")


@pytest.fixture(scope="module")
def voc_folders(tmp_path_factory):
    """Two tiny VOC-format folders with other images, and a copy of the first one elsewhere."""
    from lossscale_bench.data.voc import make_tiny_voc

    base = tmp_path_factory.mktemp("voc")
    make_tiny_voc(base / "a", {"trainval": 4, "test": 2}, seed=1)
    make_tiny_voc(base / "b", {"trainval": 4, "test": 2}, seed=2)
    shutil.copytree(base / "a", base / "elsewhere" / "a_copy")
    return base / "a", base / "b", base / "elsewhere" / "a_copy"


# --------------------------------------------------------------------------- ids by content


def test_another_voc_folder_is_another_trial_the_same_data_elsewhere_is_not(voc_folders):
    a, b, a_copy = voc_folders
    (ta,), (tb,), (tc,) = _voc_study(a).trials(), _voc_study(b).trials(), _voc_study(a_copy).trials()
    assert ta.trial_id != tb.trial_id  # was equal: the root was not in the id at all
    assert ta.trial_id == tc.trial_id  # content, not path: machine-independent
    assert ta.fingerprint["data"].startswith("voc:") and ta.fingerprint != tb.fingerprint
    assert str(a) not in str(ta.identity())
    from lossscale_bench.study.grid import make_trial_id

    assert make_trial_id(ta.identity()) == ta.trial_id  # the config carries what its id hashes


def test_voc_fingerprint_follows_the_split_lists_and_annotations(voc_folders, tmp_path):
    a, _, _ = voc_folders
    d = tmp_path / "v"
    shutil.copytree(a, d)
    cfg = {"name": "voc", "root": str(d), "classes": ["square", "disc"]}
    first = data_fingerprint(cfg)
    assert first == data_fingerprint({**cfg, "root": str(a)})
    lst = d / "ImageSets" / "Main" / "trainval.txt"
    ids = lst.read_text().split()
    lst.write_text("\n".join(ids[:-1]) + "\n")  # one image fewer in the training split
    second = data_fingerprint(cfg)
    assert second != first
    ann = d / "Annotations" / f"{ids[0]}.xml"
    ann.write_text(ann.read_text() + "<!-- edited -->")  # an annotation changed size
    assert data_fingerprint(cfg) not in (first, second)
    # an unused split does not matter: only what the study reads is fingerprinted
    third = data_fingerprint(cfg)
    (d / "ImageSets" / "Main" / "unused.txt").write_text("x\n")
    assert data_fingerprint(cfg) == third
    # another evaluation split does
    assert data_fingerprint({**cfg, "val_split": "val"}) != third


def test_an_annotation_edit_of_the_same_byte_length_is_another_trial(voc_folders, tmp_path):
    """The XMLs are hashed, not sized; a fix of the same length (difficult 0 -> 1, a box
    37 -> 73) kept the id and the old result was reused as "already finished"."""
    a, _, _ = voc_folders
    d = tmp_path / "v"
    shutil.copytree(a, d)
    (before,) = _voc_study(d).trials()
    xml = sorted((d / "Annotations").glob("*.xml"))[0]
    st = xml.stat()
    text = xml.read_text()
    assert "<difficult>0</difficult>" in text
    xml.write_text(text.replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1))
    os.utime(xml, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only the content differs
    assert xml.stat().st_size == st.st_size and xml.stat().st_mtime_ns == st.st_mtime_ns
    (after,) = _voc_study(d).trials()
    assert after.fingerprint["data"].startswith("voc:") and after.fingerprint != before.fingerprint
    assert after.trial_id != before.trial_id


def test_the_bad_annotations_policy_is_not_part_of_the_id(voc_folders):
    """error and drop train the same on clean data, and error gives no result on bad data: one id."""
    a, _, _ = voc_folders
    (plain,) = _voc_study(a).trials()
    drop = load_study_text(f"""
name: tinyvoc
dataset: {{name: voc, root: {a}, classes: [square, disc], bad_annotations: drop}}
model: [ssd_tiny]
model_options: {{width: 8, image_size: 64}}
batch_size: [2]
precision: fp32
scaling: [{{method: none}}]
schedule: {{iterations: 2, lr: 1.0e-3}}
eval: {{metric: voc07}}
""").trials()[0]
    assert drop.dataset["bad_annotations"] == "drop" and plain.dataset["bad_annotations"] == "error"
    assert drop.trial_id == plain.trial_id


def test_missing_data_and_weights_give_markers_that_no_real_fingerprint_has(tmp_path, voc_folders):
    a, _, _ = voc_folders
    assert data_fingerprint({"name": "voc", "root": str(tmp_path / "none"), "classes": ["x"]}) == MISSING
    partial = tmp_path / "partial"
    shutil.copytree(a, partial)
    (partial / "ImageSets" / "Main" / "test.txt").unlink()
    assert data_fingerprint({"name": "voc", "root": str(partial)}).startswith("incomplete:")
    assert data_fingerprint({"name": "coco2017", "root": str(tmp_path / "none")}) == MISSING
    assert (
        data_fingerprint({"name": "synthetic"}) == ""
        and data_fingerprint({"name": "coco2017", "fake_data": True}) == ""
    )
    assert weights_fingerprint(tmp_path / "w.pt") == f"{MISSING}:w.pt"
    assert weights_fingerprint(None) == ""
    # a study whose data and weights are absent still expands (dry runs of shipped studies)
    s = _voc_study(tmp_path / "none", tmp_path / "w.pt")
    (t,) = s.trials()
    assert t.fingerprint == {"data": MISSING, "weights": f"{MISSING}:w.pt"}


def test_weights_by_content_not_by_name(tmp_path):
    w1, w2, w3 = tmp_path / "one" / "vgg.pth", tmp_path / "two" / "other_name.pth", tmp_path / "vgg.pth"
    for p, data in ((w1, b"weights-1"), (w2, b"weights-1"), (w3, b"weights-2")):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def tid(p):
        opts = "{width: 8, image_size: 64" + (f", backbone_weights: {p}" if p else "") + "}"
        text = TINY.replace("LR", "0.01").replace("SEEDS", "[0]")
        (t,) = load_study_text(
            text.replace("model_options: {width: 8, image_size: 64}", f"model_options: {opts}")
        ).trials()
        return t.trial_id

    assert tid(w1) == tid(w2)  # same bytes, other folder and name
    assert tid(w1) != tid(w3)  # same name, other bytes (was equal: only the basename was in the id)
    assert tid(w1) != tid(None)


def test_file_digest_is_cached_by_path_size_and_mtime(tmp_path):
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(1 << 20) * 48)  # 48 MiB
    t0 = time.perf_counter()
    first = file_sha256(f)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert file_sha256(f) == first
    warm = time.perf_counter() - t0
    assert warm < cold / 10, (cold, warm)
    with open(f, "r+b") as fh:  # same size, new content and mtime
        fh.write(b"x")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert file_sha256(f) != first


def test_voc_fingerprint_of_many_images_is_cheap(tmp_path):
    """VOC07+12 lists 21.5k images, whose XMLs are hashed (0.4 s of CPU: benchmarks/fingerprint_speed.py,
    docs/records/index.md); 8k here."""
    d = tmp_path / "big"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (d / sub).mkdir(parents=True)
    ids = [f"{i:06d}" for i in range(8_000)]
    for i in ids:
        (d / "Annotations" / f"{i}.xml").write_bytes(b"<annotation/>")
        (d / "JPEGImages" / f"{i}.jpg").write_bytes(b"\xff\xd8")
    (d / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(ids[:6_000]) + "\n")
    (d / "ImageSets" / "Main" / "test.txt").write_text("\n".join(ids[6_000:]) + "\n")
    t0 = time.perf_counter()
    fp = data_fingerprint({"name": "voc", "root": str(d)})
    took = time.perf_counter() - t0
    assert fp.startswith("voc:")
    assert took < 2.0, f"{took:.2f} s for 8k images"


def test_fingerprint_reads_the_sources_the_loader_reads(voc_folders, tmp_path):
    """One definition of the VOC layout (dataset_files/voc_layout.py), used by the loader and the fingerprint
    (they were two copies that had to be kept in step)."""
    from lossscale_bench.data import voc as data_voc
    from lossscale_bench.dataset_files import voc_layout
    from lossscale_bench.study import fingerprint, paths

    assert fingerprint.voc_sources is data_voc.voc_sources is voc_layout.voc_sources
    # the loader finds the devkit through voc_sources; a resolve_devkit of its own would be a second copy
    assert getattr(data_voc, "resolve_devkit", voc_layout.resolve_devkit) is voc_layout.resolve_devkit
    assert paths.required_paths is voc_layout.required_paths
    a, _, _ = voc_folders
    devkit = tmp_path / "VOCdevkit"
    for year in ("VOC2007", "VOC2012"):
        shutil.copytree(a, devkit / year)
    train, val = voc_layout.voc_sources({"name": "voc0712", "root": str(tmp_path)})
    assert train == [(devkit / "VOC2007", "trainval"), (devkit / "VOC2012", "trainval")]
    assert val == [(devkit / "VOC2007", "test")]


def test_every_option_that_changes_a_result_changes_the_id():
    base = _study(seeds="[0]").trials()[0]
    edits = [
        "schedule: {iterations: 3, lr: 0.01, momentum: 0.8}",
        "schedule: {iterations: 3, lr: 0.01, grad_clip: 5}",
        "schedule: {iterations: 4, lr: 0.01}",
        "eval: {metric: voc07}",
        "eval: {metric: coco, max_images: 2}",
        "divergence: {patience: 3}",
        "on_divergence: continue",
        "loader: dali",
        "model_options: {width: 16, image_size: 64}",
    ]
    for edit in edits:
        key = edit.split(":")[0]
        text = (
            "\n".join(
                line
                for line in (TINY.replace("LR", "0.01").replace("SEEDS", "[0]")).splitlines()
                if not line.startswith(key + ":")
            )
            + "\n"
            + edit
            + "\n"
        )
        (t,) = load_study_text(text).trials()
        assert t.trial_id != base.trial_id, edit
        assert t.config_id() != base.config_id(), edit
    # what does not change a result does not change the id
    for same in ("log_every: 3", "max_failures: 5", "description: other words"):
        (t,) = _study(seeds="[0]", extra=same + "\n").trials()
        assert t.trial_id == base.trial_id, same
    # seeds of one configuration share its config id
    a, b = _study(seeds="[0, 1]").trials()
    assert a.trial_id != b.trial_id and a.config_id() == b.config_id()


# --------------------------------------------------------------------------- the store and the report


def _log(tracker, exp_id, parent, cfg, status, final_map=None, start=None):
    run_id = tracker.ensure_trial_run(exp_id, parent, cfg)
    if final_map is not None:
        tracker.log_metrics(run_id, [("final_map", final_map, 3)])
    tracker.set_tags(run_id, {"lsbench.status": status})
    if status != "pending":
        tracker.end_trial(run_id, status)
    return run_id


def test_report_never_pools_two_lr_values_as_seeds(tmp_path):
    """lr 0.01 (one seed failed) then lr 0.02 (one seed pending) under one study name: apart everywhere."""
    from lossscale_bench.report import load_runs, render, summarize
    from lossscale_bench.report.summary import latest_setting
    from lossscale_bench.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    old, new = _study("0.01").trials(), _study("0.02").trials()
    exp_id, parent = tracker.study_run("ident")
    for cfg, status, value in zip(old, ("finished", "finished", "failed"), (0.10, 0.12, None)):
        _log(tracker, exp_id, parent, cfg, status, value)
    time.sleep(0.01)
    for cfg, status, value in zip(new, ("finished", "finished", "pending"), (0.04, 0.05, None)):
        _log(tracker, exp_id, parent, cfg, status, value)

    runs = load_runs(uri, "ident")
    assert runs["config_id"].nunique() == 2
    s = summarize(runs)
    assert len(s) == 2  # one cell per configuration, never one pooled cell of 6 runs
    latest, earlier = s.iloc[0], s.iloc[1]
    assert latest["setting"] == "configuration 1 of 2 (latest): schedule.lr = 0.02"
    assert earlier["setting"] == "configuration 2 of 2 (earlier): schedule.lr = 0.01"
    assert latest["cell"] == "4.50 ± 0.71 (n=2, 1/3 pending)" and latest["n_failed"] == 0
    assert earlier["cell"] == "11.00 ± 1.41 (n=2, 1/3 failed)" and earlier["n_pending"] == 0
    md = render(runs, "markdown")
    lines = md.splitlines()
    heads = [line for line in lines if line.startswith("### ")]
    assert heads == [
        "### ident: SSD-tiny batch 2 — configuration 1 of 2 (latest): schedule.lr = 0.02",
        "### ident: SSD-tiny batch 2 — configuration 2 of 2 (earlier): schedule.lr = 0.01",
    ]
    assert "Trials: 6 (4 finished, 0 diverged, 1 failed, 0 running, 1 pending)." in lines
    assert (
        "Trials of configuration 1 of 2 (latest): schedule.lr = 0.02: "
        "3 (2 finished, 0 diverged, 0 failed, 0 running, 1 pending)."
    ) in lines
    assert (
        "Trials of configuration 2 of 2 (earlier): schedule.lr = 0.01: 3 (2 finished, 0 diverged, 1 failed, 0 running)."
    ) in lines
    for fmt in ("html", "latex"):
        text = render(runs, fmt)
        assert "schedule.lr = 0.02" in text and "schedule.lr = 0.01" in text
    csv = pd.read_csv(io.StringIO(render(runs, "csv")))
    assert sorted(csv["setting"]) == sorted(s["setting"]) and csv["config_id"].nunique() == 2
    # the study plots draw the latest configuration only (curves are drawn per row label)
    assert sorted(latest_setting(runs)["trial_id"]) == sorted(c.trial_id for c in new)


def test_runs_without_the_config_tag_are_told_apart_by_their_params(tmp_path):
    """Runs logged before lsbench.config_id existed: the configuration comes from their params."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from lossscale_bench.report import load_runs, summarize

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("legacy")
    for lr, seed, value in (("0.01", 0, 0.10), ("0.01", 1, 0.12), ("0.02", 0, 0.04)):
        cfg = _study(lr, f"[{seed}]").trials()[0]
        tags = {
            "lsbench.role": "trial",
            "lsbench.study": "legacy",
            "lsbench.trial_id": cfg.trial_id,
            "lsbench.status": "finished",
            "lsbench.label": cfg.label,
            "lsbench.row": "0",
        }
        rid = client.create_run(exp, tags=tags).info.run_id
        client.log_batch(
            rid, metrics=[Metric("final_map", value, 0, 3)], params=[Param(k, v) for k, v in cfg.flat_params().items()]
        )
        client.set_terminated(rid, "FINISHED")
    s = summarize(load_runs(uri, "legacy")).set_index("setting")
    assert len(s) == 2
    (lr1,) = [k for k in s.index if k.endswith("schedule.lr = 0.01")]
    assert s.loc[lr1, "cell"] == "11.00 ± 1.41 (n=2)"


def test_a_rerun_tags_runs_logged_before_the_tag_so_their_seeds_pool_with_new_ones(tmp_path):
    """Seeds 0 and 1 logged without lsbench.config_id (older lsbench), seed 2 added later: one cell of 3."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from lossscale_bench.report import load_runs, summarize
    from lossscale_bench.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    client = MlflowClient(tracking_uri=uri)
    exp_id, parent = tracker.study_run("ident")
    trials = _study("0.01").trials()
    for cfg, value in zip(trials[:2], (0.10, 0.12)):
        tags = {
            "lsbench.role": "trial",
            "lsbench.study": "ident",
            "lsbench.trial_id": cfg.trial_id,
            "lsbench.status": "finished",
            "lsbench.label": cfg.label,
            "lsbench.row": "0",
            "mlflow.parentRunId": parent,
        }
        rid = client.create_run(exp_id, tags=tags).info.run_id
        client.log_batch(
            rid, metrics=[Metric("final_map", value, 0, 3)], params=[Param(k, v) for k, v in cfg.flat_params().items()]
        )
        client.set_terminated(rid, "FINISHED")
    # what `lsbench run` does with the runs it finds before starting the missing seed
    tracker.sync_baseline_tags(trials, tracker.trial_runs(exp_id))
    _log(tracker, exp_id, parent, trials[2], "finished", 0.14)
    runs = load_runs(uri, "ident")
    assert runs["config_id"].tolist() == [trials[0].config_id()] * 3
    (cell,) = summarize(runs)["cell"]
    assert cell == "12.00 ± 2.00 (n=3)"


def test_one_row_in_two_configurations_within_one_setting_is_two_rows(tmp_path):
    """An entry's own option changed but not its label: same table, two labelled rows."""
    from lossscale_bench.report import load_runs, render
    from lossscale_bench.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri)
    exp_id, parent = tracker.study_run("ident")
    for scale, value in (("64", 0.2), ("128", 0.3)):
        (cfg,) = load_study_text(
            TINY.replace("LR", "0.01")
            .replace("SEEDS", "[0]")
            .replace("{method: none, label: plain}", f"{{method: fixed, scale: {scale}, label: plain}}")
        ).trials()
        _log(tracker, exp_id, parent, cfg, "finished", value)
    md = render(load_runs(uri, "ident"), "markdown")
    assert len([x for x in md.splitlines() if x.startswith("### ")]) == 1
    assert "plain [scaling.scale = 128.0]" in md and "plain [scaling.scale = 64.0]" in md


def test_change_note_names_what_differs():
    old, new = _study("0.01").trials(), _study("0.02").trials()
    existing = {c.trial_id: ({"lsbench.config_id": c.config_id()}, c.flat_params()) for c in old}
    note = change_note("ident", new, existing)
    assert note == (
        "study 'ident' changed since its earlier runs: 3 trials of an earlier configuration are kept "
        "in the store and reported separately (differs in schedule.lr)"
    )
    # the same study, or one with a seed less, did not change
    assert change_note("ident", old, existing) is None
    assert change_note("ident", _study("0.01", "[0, 1]").trials(), existing) is None


# --------------------------------------------------------------------------- lsbench run, for real


def _lsbench(capsys, *args) -> tuple[int, str]:
    """``lsbench ...`` in this process (the CLI's own main; imports paid once): (exit code, stdout + stderr)."""
    from lossscale_bench.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_run_on_another_voc_folder_trains_again_and_says_the_study_changed(voc_folders, tmp_path, capsys):
    a, b, _ = voc_folders
    text = tiny_data_study(
        "{name: voc, root: ROOT, classes: [square, disc]}", name="tinyvoc", eval="{metric: voc07, max_images: 2}"
    )
    f = tmp_path / "s.yaml"
    runs = ["--runs-dir", str(tmp_path / "runs"), "--executor", "local", "--no-report"]
    f.write_text(text.replace("ROOT", str(a)))
    code, out = _lsbench(capsys, "run", str(f), *runs)
    assert code == 0, out
    f.write_text(text.replace("ROOT", str(b)))  # other data: trains, and says why the old result stays apart
    code, out = _lsbench(capsys, "run", str(f), *runs)
    assert code == 0, out
    assert "already finished" not in out  # was "1 of 1 trials already finished" and the old mAP
    assert (
        "study 'tinyvoc' changed since its earlier runs: 1 trial of an earlier configuration is kept in the "
        "store and reported separately (differs in dataset.root, fingerprint.data)"
    ) in out
    from lossscale_bench.report import load_runs, summarize

    s = summarize(load_runs(f"sqlite:///{tmp_path}/runs/mlflow.db", "tinyvoc"))
    assert len(s) == 2 and s["n_runs"].tolist() == [1, 1]
    assert s["setting"].str.contains("fingerprint.data = voc:").all()
