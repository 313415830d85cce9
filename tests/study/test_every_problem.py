"""``lsbench validate`` names every problem in a file, one line each, not only the first."""

from __future__ import annotations

from helpers import lsbench, study_yaml


def _lines(r) -> list[str]:
    assert r.returncode == 2 and not r.stdout, (r.returncode, r.stdout, r.stderr)
    return r.stderr.strip().splitlines()


def test_two_bad_scaling_entries_are_both_named(tmp_path):
    (tmp_path / "s.yaml").write_text(
        study_yaml(
            precision="fp16-emulated",
            scaling=["{method: fixed, scale: -1}", "{method: dynamic, interval: 0}", "{method: fixed, scael: 3}"],
        )
    )
    lines = _lines(lsbench("validate", "s.yaml", cwd=tmp_path))
    assert [ln.split(": ")[3] for ln in lines] == ["scaling[0].scale", "scaling[1].interval", "scaling[2].scael"], lines
    assert "unknown key (did you mean 'scale'?)" in lines[2]
    assert not any("required key missing" in ln for ln in lines)  # the typo explains the missing scale


def test_problems_between_fields_are_all_named(tmp_path):
    (tmp_path / "s.yaml").write_text(
        study_yaml(
            precision="fp16-emulated",
            schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 4},
            scaling=["{method: fixed, scale: 8, baseline: true}", "{method: fixed, scale: 16, baseline: true}"],
        )
    )
    lines = _lines(lsbench("validate", "s.yaml", cwd=tmp_path))
    assert len(lines) == 2 and "schedule.warmup_iterations" in lines[0] and "scaling[1].baseline" in lines[1], lines
