"""seeds in plan form, ``{start, step, max, until: decided}``: the first round's seeds, the plan, and the
one-line errors of a bad plan; the list form is unchanged."""

from __future__ import annotations

import pytest

from helpers import study_yaml
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
