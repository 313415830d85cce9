"""lsbench run with ``seeds: {start, step, max, until: decided}``: rounds of seeds, the looks recorded on the
study's parent run, a rerun that trains nothing, and the report's section on the looks.

Real trials on the local executor (tiny synthetic study). Which verdicts come out depends on the training,
so the test holds the invariants: every row has exactly the seeds its pairs' looks asked for (a decided
pair's rows stop at its look, an open pair's go on to max), and the recorded verdicts are the ones the
store gives when looked at again.
"""

from __future__ import annotations

import pytest

from helpers import lsbench, study_yaml

PLAN = {"start": 2, "step": 1, "max": 4, "until": "decided"}
ROUNDS = study_yaml(
    name="rounds",
    dataset={"name": "synthetic", "train_images": 16, "val_images": 8, "image_size": 64, "seed": 0},
    precision="fp16-emulated",
    batch_size=4,
    scaling=["{method: none, precision: fp32, label: fp32, baseline: true}", "{method: fixed, scale: 128}"],
    schedule={"iterations": 12, "lr": 0.01, "warmup_iterations": 4},
    eval={"every": 6, "metric": "coco"},
    log_every=4,
    seeds=PLAN,
)


def _trial_runs(client, exp):
    return client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")


@pytest.mark.slow
def test_seeds_in_rounds_until_decided_then_a_rerun_trains_nothing(tmp_path):
    from mlflow import MlflowClient

    from lossscale_bench.seed_rounds import TAG_PREFIX, look_at_store
    from lossscale_bench.study import load_study

    path = tmp_path / "rounds.yaml"
    path.write_text(ROUNDS)
    runs = tmp_path / "runs"
    r = lsbench(
        "run", path, "--runs-dir", runs, "--executor", "local", "--no-report", "--quiet", cwd=tmp_path, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "seeds round 1: 4 trials so far" in r.stdout and "seeds added until decided" in r.stdout

    uri = f"sqlite:///{runs / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rounds")
    parent = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")[0]
    tags = parent.data.tags
    assert tags[f"{TAG_PREFIX}plan"] == "start=2 step=1 max=4 until=decided pairs=baseline spending=obf"
    assert "Lan-DeMets" in tags[f"{TAG_PREFIX}method"]
    pair_tags = {k: v for k, v in tags.items() if k.startswith(f"{TAG_PREFIX}pair.")}
    assert len(pair_tags) == 1

    study = load_study(path)
    decisions, done = look_at_store(uri, study)
    (d,) = decisions.itertuples()
    assert d.outcome in ("better", "worse", "equivalent", "undecided")  # every pair decided or at max
    assert pair_tags.popitem()[1] == f"{d.label_a} vs {d.label_b}: {d.verdict}"
    seeds = {key[3]: sorted(s) for key, s in done.items()}
    # both rows trained exactly the seeds of the pair's last look: none after a decision, max when undecided
    want = list(range(4 if d.outcome == "undecided" else d.n))
    assert seeds == {0: want, 1: want}, (seeds, d)
    before = len(_trial_runs(client, exp))
    assert before == 2 * len(want)

    # the same command again: nothing to train, the same verdict
    again = lsbench(
        "run", path, "--runs-dir", runs, "--executor", "local", "--no-report", "--quiet", cwd=tmp_path, timeout=600
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"0 finished, 0 diverged, 0 failed, {before} already done" in again.stdout
    assert len(_trial_runs(client, exp)) == before
    assert d.verdict in again.stdout

    # the report of the file reads every seed the plan trained, and says how the looks were judged
    rep = lsbench("report", path, "--runs-dir", runs, "--out", "-", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert f"(n={len(want)})" in rep.stdout and "## Seeds added until decided" in rep.stdout
    assert d.verdict in rep.stdout.split("## Seeds added until decided", 1)[1]

    # the section is in the HTML and LaTeX reports and in --compare's too
    for args, marker in (
        (("--format", "html"), "<h2>Seeds added until decided</h2>"),
        (("--format", "latex"), "% Seeds added until decided"),
        (("--compare",), "## Seeds added until decided"),
    ):
        out = lsbench("report", path, "--runs-dir", runs, *args, "--no-plots", "--out", "-", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert marker in out.stdout and d.verdict in out.stdout.split(marker, 1)[1], args


@pytest.mark.slow
def test_raising_max_trains_nothing_for_a_decided_pair_and_keeps_its_verdict(tmp_path):
    # On this study the pair is equivalent at its second look (n=3) under max 4: the TOST bound of that
    # look, |Δ| + c·se with c the max-4 boundary, lies inside ±0.9 mAP. With max 6 the boundary of the same
    # look is about twice as large (O'Brien-Fleming spends less there), and replaying the looks with it
    # reopened the pair and trained two more seeds of both rows.
    from mlflow import MlflowClient

    from lossscale_bench.seed_rounds import TAG_PREFIX

    path = tmp_path / "rounds.yaml"
    path.write_text(ROUNDS + "report: {equivalence_margin: 0.9}\n")
    runs = tmp_path / "runs"
    cmd = ("run", path, "--runs-dir", runs, "--executor", "local", "--no-report", "--quiet")
    first = lsbench(*cmd, cwd=tmp_path, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rounds")
    pair = next(v for k, v in _parent_tags(client, exp).items() if k.startswith(f"{TAG_PREFIX}pair."))
    assert any(f": {w} (" in pair for w in ("better", "worse", "equivalent")), pair  # decided under max 4
    before = len(_trial_runs(client, exp))
    assert before < 8  # decided before max

    path.write_text(path.read_text().replace("max: 4", "max: 6"))
    again = lsbench(*cmd, cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_trial_runs(client, exp)) == before, again.stdout[-2000:]
    tags = _parent_tags(client, exp)
    assert next(v for k, v in tags.items() if k.startswith(f"{TAG_PREFIX}pair.")) == pair
    assert tags[f"{TAG_PREFIX}maxes"] == "4,6"
    rep = lsbench("report", path, "--runs-dir", runs, "--out", "-", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    section = rep.stdout.split("## Seeds added until decided", 1)[1]
    assert "max was changed after looks had been taken (max 4 then 6)" in section
    assert "outside the plan's stated error rates" in section and pair.split(": ", 1)[1] in section


def _parent_tags(client, exp) -> dict:
    return client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")[0].data.tags
