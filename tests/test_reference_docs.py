"""The reference pages (docs/reference/*.md) are the generator's output for today's code.

``tools/gen_reference.py`` writes them from the parsers, the schema, the registry and the tables in
the package. Checked here: regenerated in a temporary folder, every page equals the committed one
(an option, a key, a method or a variable added without regenerating fails); ``--check`` says which
page is stale; the pages name what the code has (every subcommand and option of the real parser,
every method, precision, exit code, environment variable and study key), so an empty or truncated
generator cannot pass; and the tables of names are complete: every metric and tag a real trial
logs has an entry in ``lossscale_bench.logged_names``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import study_yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("cli.md", "study-file.md", "names.md", "exit-codes.md", "environment.md", "metrics.md")
COMMITTED = ROOT / "docs" / "reference"


def _generate(*args: str) -> subprocess.CompletedProcess:
    """The generator in a fresh interpreter (it clears LSBENCH_* variables: never in this process)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_reference.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    done = _generate("--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_every_committed_page_is_the_generators_output(generated):
    assert sorted(p.name for p in generated.iterdir()) == sorted(PAGES)
    stale = [
        name
        for name in PAGES
        if not (COMMITTED / name).is_file()
        or (COMMITTED / name).read_text(encoding="utf-8") != (generated / name).read_text(encoding="utf-8")
    ]
    assert not stale, f"out of date: {stale}; run: python tools/gen_reference.py"


def test_check_names_a_stale_page(generated, tmp_path):
    copy = tmp_path / "reference"
    shutil.copytree(generated, copy)
    assert _generate("--check", "--out", str(copy)).returncode == 0
    page = copy / "names.md"
    page.write_text(page.read_text(encoding="utf-8").replace("### `adaptive`", "### `adaptiv`"), encoding="utf-8")
    done = _generate("--check", "--out", str(copy))
    assert done.returncode == 1
    assert "names.md" in done.stderr and "cli.md" not in done.stderr


def _commands(parser: argparse.ArgumentParser, path: str):
    """(``lsbench sub ...``, its parser) for every subcommand of the real parser, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{path} {name}", child
                yield from _commands(child, f"{path} {name}")


def test_the_cli_page_has_every_subcommand_and_option(generated):
    from lossscale_bench.cli import build_parser

    text = (generated / "cli.md").read_text(encoding="utf-8")
    commands = list(_commands(build_parser(), "lsbench"))
    assert {
        "lsbench run",
        "lsbench validate",
        "lsbench report",
        "lsbench ui",
        "lsbench data",
        "lsbench weights convert",
    } <= {c for c, _ in commands}
    for command, parser in commands:
        assert f"`{command}`" in text, command
        for action in parser._actions:
            if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                for option in action.option_strings:
                    assert f"`{option}`" in text, (command, option)
    assert "`--root`" in text and "`--mirror`" in text  # lsbench data's own parser, not the placeholder


def test_the_names_page_has_every_method_and_precision_with_options(generated):
    from lossscale_bench.study.plugins import names

    MODEL_NAMES, PRECISIONS, SCALING_METHODS = (names(k, entry_points=False) for k in ("model", "precision", "method"))
    from lossscale_bench.study.methods import ENTRIES
    from lossscale_bench.study.precisions import PRECISION_OPTIONS

    text = (generated / "names.md").read_text(encoding="utf-8")
    for method in SCALING_METHODS:
        section = text.split(f"### `{method}`\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        for option in ENTRIES[method].option_names():
            assert f"| `{option}` |" in section, (method, option)
    for name in (*PRECISIONS, *PRECISION_OPTIONS, *MODEL_NAMES):
        assert f"`{name}`" in text, name
    assert "ADAPTIVE.md" not in text and "issue" not in text.lower()


def test_the_study_page_has_every_key(generated):
    from lossscale_bench.study import Study

    text = (generated / "study-file.md").read_text(encoding="utf-8")
    for key in Study.model_fields:
        if key not in ("source", "seed_plan"):  # set by the loader, not keys of the file
            assert f"| `{key}` |" in text, key
    for key in (
        "seeds.start",
        "seeds.max",
        "schedule.iterations",
        "schedule.lr",
        "eval.metric",
        "resources.backend",
        "dataset.root",
        "dataset.train_max_side",
        "scaling[].label",
        "seed_streams.val",
        "report.equivalence_margin",
    ):
        assert f"| `{key}` |" in text, key
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert rows and not [r for r in rows if r.endswith("| — |")], "keys without a description"


def test_exit_codes_and_environment_pages(generated):
    from lossscale_bench.core import exit_codes

    text = (generated / "exit-codes.md").read_text(encoding="utf-8")
    for name in dir(exit_codes):
        if name.startswith("EXIT_"):
            assert f"| {getattr(exit_codes, name)} | `{name}` |" in text, name
    env = (generated / "environment.md").read_text(encoding="utf-8")
    read = set()
    for path in (ROOT / "lossscale_bench").rglob("*.py"):
        read |= set(re.findall(r"\bLSBENCH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    assert {"LSBENCH_DATA", "LSBENCH_NO_NATIVE", "LSBENCH_MALLOC"} <= read
    for var in read:
        assert f"| `{var}` |" in env, var


def test_the_pages_are_plain_markdown_without_machine_paths(generated):
    for name in PAGES:
        text = (generated / name).read_text(encoding="utf-8")
        note = text.splitlines()[2]
        assert "tools/gen_reference.py" in note and "do not edit" in note, name
        assert str(ROOT) not in text and "/home/" not in text and "/tmp/" not in text, name
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), name  # no dates


def test_the_generator_refuses_an_undescribed_variable(tmp_path):
    """A variable the package reads with no description stops the generator (checked on a copy of the
    package with one more variable read)."""
    copy = tmp_path / "repo"
    shutil.copytree(
        ROOT / "lossscale_bench", copy / "lossscale_bench", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    shutil.copytree(ROOT / "tools", copy / "tools")
    with (copy / "lossscale_bench" / "sink.py").open("a", encoding="utf-8") as f:
        f.write('\nimport os\n_UNDESCRIBED = os.environ.get("LSBENCH_NOT_DESCRIBED")\n')
    done = subprocess.run(
        [sys.executable, str(copy / "tools" / "gen_reference.py"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=copy,
        timeout=600,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(copy)},
    )
    assert done.returncode != 0
    assert "LSBENCH_NOT_DESCRIBED" in done.stderr and "env_vars.py" in done.stderr


#: one trial per kind of scaler, so that every family of metric names is logged once
METRIC_STUDY = study_yaml(
    name="names",
    precision="fp16-emulated",
    scaling=[
        "{method: adaptive}",
        "{method: amax, recipe: current}",
        "{method: layerwise_dynamic}",
        "{method: dynamic, style: deepspeed}",
        "{method: saturation}",
    ],
)


def test_every_metric_and_tag_a_trial_logs_has_an_entry(tmp_path):
    from lossscale_bench.core.logged_names import METRICS, TAGS, entry_for
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import run_trial

    metrics, tags = set(), set()
    for k, cfg in enumerate(load_study_text(METRIC_STUDY).trials()):
        sink = MemorySink()
        outcome = run_trial(cfg, sink=sink, trial_dir=tmp_path / str(k), threads=1)
        assert outcome.status in ("finished", "diverged"), outcome.error  # a divergence logs its tags too
        metrics |= {name for name, _, _ in sink.items}
        tags |= set(sink.tag_values)
    assert {
        "loss",
        "final_map",
        "ada_scale_log2_median",
        "amax_point_scale_log2_median",
        "lw_points_backed_off",
        "dyn_hysteresis_left",
        "saturated_share",
    } <= metrics
    assert [m for m in sorted(metrics) if entry_for(m, METRICS) is None] == []
    assert [t for t in sorted(tags) if entry_for(t, TAGS) is None] == []
