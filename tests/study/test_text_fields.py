"""Names and labels are text as written: YAML's implicit numbers are refused or kept verbatim,
labels that print alike are one label, and a name too long for a folder is refused at validation."""

from __future__ import annotations

import pytest

from helpers import study_yaml
from lossscale_bench.study import StudyError, load_study_text


def _load(**overrides):
    return load_study_text(study_yaml(**overrides), "s.yaml")


@pytest.mark.parametrize(
    "written, parsed",
    [("1.10", "float 1.1"), ("010", "int 8"), ("1:30", "int 90"), ("true", "bool true"), ("1e3", None)],
)
def test_a_name_yaml_would_read_as_a_number_is_refused_with_the_quotes_that_fix_it(written, parsed):
    if parsed is None:  # PyYAML reads 1e3 as the text '1e3' (no dot): a fine name
        assert _load(name=written).name == written
        return
    with pytest.raises(StudyError) as err:
        _load(name=written)
    msg = str(err.value)
    assert msg.startswith("s.yaml: name: ") and parsed in msg and f'name: "{written}"' in msg
    if ":" not in written:  # quoted: the text (a ':' is then refused as unsafe for file names)
        assert _load(name=f'"{written}"').name == written


def test_a_name_longer_than_a_folder_can_hold_is_refused_at_validation():
    assert _load(name="n" * 100).name == "n" * 100
    with pytest.raises(StudyError, match=r"name: 300 characters is too long.*at most 100"):
        _load(name="n" * 300)


def test_numeric_labels_keep_their_text():
    s = _load(
        precision="fp16-emulated",
        scaling=[
            "{method: fixed, scale: 8, label: 1.10}",
            "{method: fixed, scale: 16, label: 1.1}",
            "{method: fixed, scale: 32, label: 010}",
        ],
    )
    assert [t.label for t in s.trials()] == ["1.10", "1.1", "010"]


@pytest.mark.parametrize("a, b", [('"a\\nb"', '"a b"'), ('"x"', '"x "'), ('"x  y"', '"x\\ty"')])
def test_labels_that_print_alike_are_one_label_and_refused_as_duplicates(a, b):
    with pytest.raises(StudyError, match=r"scaling\[1\]\.label: its label .* is also scaling\[0\]'s"):
        _load(
            precision="fp16-emulated",
            scaling=[f"{{method: fixed, scale: 8, label: {a}}}", f"{{method: fixed, scale: 16, label: {b}}}"],
        )


def test_a_label_is_stored_as_the_report_prints_it():
    s = _load(precision="fp16-emulated", scaling=['{method: fixed, scale: 8, label: "  two\\nlines  "}'])
    assert s.trials()[0].label == "two lines"
