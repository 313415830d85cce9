"""The study file's seeds (study/seed_plan.py).

seeds in plan form, ``{start, step, max, until: decided}``: the first round's seeds, the plan, and the
one-line errors of a bad plan; the list form is unchanged.

seed_streams: the initial weights, the batch order and the validation set, each on its own seed
(to tell where the seed-to-seed spread comes from).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from helpers import lsbench, study_yaml, write_study
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import StudyError, load_study_text


def test_a_plan_trains_its_first_seeds_with_the_list_forms_ids():
    planned = load_study_text(study_yaml(seeds={"start": 3, "step": 3, "max": 18, "until": "decided"}))
    listed = load_study_text(study_yaml(seeds=[0, 1, 2]))
    assert planned.seeds == [0, 1, 2] and listed.seed_plan is None
    assert planned.seed_plan.looks() == [3, 6, 9, 12, 15, 18]
    assert [t.trial_id for t in planned.trials()] == [t.trial_id for t in listed.trials()]
    # until may be left out; a step that does not land on max still ends there
    plan = load_study_text(study_yaml(seeds={"start": 2, "step": 5, "max": 9})).seed_plan
    assert plan.until == "decided" and plan.looks() == [2, 7, 9] and plan.pairs == "baseline"
    every = load_study_text(study_yaml(seeds={"start": 3, "step": 3, "max": 9, "pairs": "all"})).seed_plan
    assert every.pairs == "all" and every.spending == "obf"
    pocock = load_study_text(study_yaml(seeds={"start": 3, "step": 3, "max": 9, "spending": "pocock"}))
    assert pocock.seed_plan.spending == "pocock"


@pytest.mark.parametrize(
    "seeds, path, words",
    [
        ({"start": 1, "step": 3, "max": 18}, "seeds.start", "integers 2 <= x"),
        ({"start": 3, "step": 0, "max": 18}, "seeds.step", "integers 1 <= x"),
        ({"start": 6, "step": 3, "max": 4}, "seeds.max", "below seeds.start"),
        ({"start": 3, "step": 3, "max": 101}, "seeds.max", "integers 2 <= x <= 100"),
        ({"start": 3, "step": 3}, "seeds.max", "missing"),
        ({"start": 3, "step": 3, "max": 9, "until": "forever"}, "seeds.until", "decided"),
        ({"start": 3, "step": 3, "max": 9, "every": 2}, "seeds.every", "unknown key"),
        ({"start": 3, "step": 3, "max": 9, "pairs": "some"}, "seeds.pairs", "baseline, all"),
        ({"start": 3, "step": 3, "max": 9, "spending": "linear"}, "seeds.spending", "obf, pocock"),
        ({"start": "three", "step": 3, "max": 9}, "seeds.start", "expected an integer"),
    ],
)
def test_a_bad_plan_is_one_line_naming_the_key(seeds, path, words):
    with pytest.raises(StudyError) as e:
        load_study_text(study_yaml(seeds=seeds), source="s.yaml")
    assert e.value.path == path and words in str(e.value) and "\n" not in str(e.value)


def test_seed_plan_is_not_a_key_of_the_file():
    with pytest.raises(StudyError) as e:
        load_study_text(study_yaml(seed_plan={"start": 3, "step": 3, "max": 9}), source="s.yaml")
    assert e.value.path == "seed_plan"


def test_validate_says_a_plan_study_is_a_plan_and_its_most_trials(tmp_path):
    # the trial table of a plan is its first round: validate said "4 trials" and nothing about the plan
    from helpers import lsbench

    path = tmp_path / "plan.yaml"
    path.write_text(study_yaml(seeds={"start": 2, "step": 2, "max": 6}))
    r = lsbench("validate", "--schema-only", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = load_study_text(path.read_text())
    rows = len(first.trials()) // 2
    assert f"a seed plan (seeds added until decided): the {2 * rows} trials above are the first round" in r.stdout
    assert f"up to 6: at most {6 * rows} trials" in r.stdout


# --------------------------------------------------------------------------- seed_streams


def _trials(streams=None, seeds=(0, 1), dataset=None):
    extra = {"seed_streams": streams} if streams is not None else {}
    if dataset is not None:
        extra["dataset"] = dataset
    return load_study_text(study_yaml(seeds=list(seeds), **extra)).trials()


def test_default_streams_change_no_id_and_follow_the_seed():
    plain, given = _trials(), _trials({"init": "trial", "data": "trial"})
    assert [t.trial_id for t in plain] == [t.trial_id for t in given]
    assert all(t.seed_streams == {} for t in plain)
    t = plain[1]
    assert (t.stream_seed("init"), t.stream_seed("data"), t.stream_seed("val")) == (1, 1, None)


@pytest.mark.parametrize(
    "streams, want",
    [
        ({"init": 0}, (0, 7, None)),
        ({"data": 3}, (7, 3, None)),
        ({"val": "trial"}, (7, 7, 7)),
        ({"val": 2, "init": 0}, (0, 7, 2)),
    ],
)
def test_a_stream_set_otherwise_has_its_own_ids_and_one_configuration(streams, want):
    plain, trials = _trials(seeds=(7, 8)), _trials(streams, seeds=(7, 8))
    assert not {t.trial_id for t in trials} & {t.trial_id for t in plain}
    assert trials[0].config_id() == trials[1].config_id()  # the seeds of a row still pool in the report
    t = trials[0]
    assert (t.stream_seed("init"), t.stream_seed("data"), t.stream_seed("val")) == want


@pytest.mark.parametrize(
    "streams, field",
    [
        ({"init": -1}, "seed_streams.init"),
        ({"data": "x"}, "seed_streams.data"),
        ({"weights": 0}, "seed_streams"),
        ({"val": 1.5}, "seed_streams.val"),
    ],
)
def test_bad_streams_are_one_line_naming_the_field(tmp_path, streams, field):
    path = write_study(tmp_path, seed_streams=streams)
    out = lsbench("validate", path)
    assert out.returncode == 2 and field in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_val_stream_needs_the_synthetic_dataset(tmp_path):
    voc = {"name": "voc", "root": str(tmp_path), "classes": ["kangaroo"]}
    with pytest.raises(StudyError, match="seed_streams.val: a validation set from a seed needs the synthetic"):
        load_study_text(study_yaml(dataset=voc, seed_streams={"val": "trial"}))


def _start(cfg):
    """Initial weights, the first batch and the validation images of a trial, as its setup builds them."""
    from lossscale_bench.data.dali import make_batches
    from lossscale_bench.trial.setup import build_parts

    parts = build_parts(cfg, MemorySink(), Path(tempfile.mkdtemp()), 1)
    weights = torch.cat([p.detach().flatten() for p in parts.model.parameters()])
    _, images, _ = next(iter(make_batches(cfg, parts.train_ds, 0)))
    val = torch.stack([parts.val_ds[i][0] for i in range(len(parts.val_ds))])
    return weights, torch.stack(images), val


def test_each_stream_moves_only_what_it_seeds():
    before = torch.get_num_threads()
    try:
        base, init_fixed, data_fixed, val_free = (
            _trials(s, seeds=(0, 1)) for s in (None, {"init": 0}, {"data": 0}, {"val": "trial"})
        )
        s = {
            name: [_start(t) for t in trials]
            for name, trials in (("base", base), ("init", init_fixed), ("data", data_fixed), ("val", val_free))
        }
    finally:
        torch.set_num_threads(before)
    same = lambda a, b: torch.equal(a, b)  # noqa: E731
    (w0, b0, v0), (w1, b1, v1) = s["base"]
    assert not same(w0, w1) and not same(b0, b1) and same(v0, v1)  # a seed: weights and batches
    (w0, b0, v0), (w1, b1, v1) = s["init"]
    assert same(w0, w1) and not same(b0, b1) and same(v0, v1)  # weights fixed, batches follow
    (w0, b0, v0), (w1, b1, v1) = s["data"]
    assert not same(w0, w1) and same(b0, b1) and same(v0, v1)  # batches fixed, weights follow
    (w0, b0, v0), (w1, b1, v1) = s["val"]
    assert not same(w0, w1) and not same(b0, b1) and not same(v0, v1)  # and the validation set too
    assert same(s["val"][0][2], s["base"][0][2])  # seed 0's own validation set is the dataset's (seed 0)
