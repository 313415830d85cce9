"""Values YAML reads as something else, and names a command line reads as options:
one line through the real ``lsbench validate``, with the fix in it."""

from __future__ import annotations

from helpers import lsbench

STUDY = """name: {name}
dataset: {{name: synthetic, train_images: 8, val_images: 4, image_size: 64, seed: 0}}
model: [ssd_tiny]
batch_size: [2]
precision: fp8-e4m3-emulated
scaling:
  - {{method: fixed, scale: 128, grad_overflow: {overflow}}}
seeds: [0]
schedule: {{iterations: 2, lr: 0.01}}
eval: {{every: 2, metric: coco}}
"""


def _validate(tmp_path, **values):
    f = tmp_path / "s.yaml"
    f.write_text(STUDY.format(**values))
    return lsbench("validate", f)


def test_a_choice_yaml_reads_as_a_number_gets_the_quoting_advice(tmp_path):
    p = _validate(tmp_path, name="s", overflow=".nan")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "scaling[0].grad_overflow" in lines[0] and 'write it in quotes (grad_overflow: "nan")' in lines[0]
    assert _validate(tmp_path, name="s", overflow='"nan"').returncode == 0


def test_a_study_name_that_reads_as_an_option_is_refused(tmp_path):
    p = _validate(tmp_path, name="-x", overflow="saturate")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "name: '-x' starts with '-'" in lines[0]
    assert _validate(tmp_path, name="x-", overflow="saturate").returncode == 0
