"""benchmarks/harness.py, the module every benchmark script shares: the order settings run in, the rounds
it records, repeats on the command line, the markdown and JSON it writes (no timings are checked)."""

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("harness", BENCH / "harness.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


def test_rotate_abba_and_fixed_orders():
    names = ["a", "b", "c"]
    assert [harness.order(names, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert [harness.order(names, r, "abba") for r in range(3)] == [names, ["c", "b", "a"], names]
    assert harness.order(names, 5, "fixed") == names
    with pytest.raises(ValueError, match="rotate"):
        harness.order(names, 0, "random")


def test_interleave_runs_every_setting_once_a_round_and_drops_the_warmup_rounds():
    calls = []

    def run(name):
        def f(rnd):
            calls.append((rnd, name))
            return float(10 * rnd + len(name))

        return f

    out = harness.interleave({"x": run("x"), "yy": run("yy")}, rounds=2, warmup=1, how="abba")
    assert calls == [(0, "x"), (0, "yy"), (1, "yy"), (1, "x"), (2, "x"), (2, "yy")]
    assert out == {"x": [11.0, 21.0], "yy": [12.0, 22.0]}


def test_time_calls_counts_warmup_and_repeats_and_divides_by_calls_per_timing():
    n = []
    ticks = iter(range(100))
    times = harness.time_calls(lambda: n.append(1), 3, warmup=2, per_call=4, clock=lambda: float(next(ticks)))
    assert len(n) == 2 + 3 * 4 and times == [0.25, 0.25, 0.25]


def test_percentile_and_summary():
    xs = [float(v) for v in range(20, 0, -1)]
    assert harness.percentile(xs, 0.1) == 3.0 and harness.percentile(xs, 1.0) == 20.0
    s = harness.summary([0.001, 0.003, 0.002], scale=1e3)
    assert s == pytest.approx({"median": 2.0, "min": 1.0, "max": 3.0, "mean": 2.0, "n": 3})


def test_markdown_table_cells():
    text = harness.markdown_table(["a", "b", "c", "d"], [["x", 1.23456, None, True], [2, 0.5, "–", False]])
    assert text.splitlines() == [
        "| a | b | c | d |",
        "|---|---|---|---|",
        "| x | 1.235 | – | yes |",
        "| 2 | 0.500 | – | no |",
    ]


def test_the_common_command_line_and_a_scripts_own_spelling_of_repeats(tmp_path):
    ap = harness.parser("First paragraph.\n\nMore.", repeats=3, repeats_flags=("--rounds",))
    assert ap.description == "First paragraph."
    assert ap.parse_args([]).repeats == 3 and ap.parse_args([]).format == "markdown"
    assert ap.parse_args(["--rounds", "5"]).repeats == 5 and ap.parse_args(["--repeats", "6"]).repeats == 6
    args = ap.parse_args(["--format", "json", "--out", str(tmp_path / "o.json")])
    assert args.format == "json" and args.out == tmp_path / "o.json"
    with pytest.raises(SystemExit):
        ap.parse_args(["--format", "csv"])
    assert not hasattr(harness.parser(None, out=False).parse_args([]), "out")


def test_a_report_prints_markdown_and_writes_json(tmp_path, capsys):
    rep = harness.Report("markdown", tmp_path / "r.md")
    rep.note("a note\n")
    rep.table(["k", "v"], [["a", 1]], name="t")
    rep.finish()
    shown = capsys.readouterr().out
    assert shown == "a note\n\n| k | v |\n|---|---|\n| a | 1 |\n"
    assert (tmp_path / "r.md").read_text() == shown
    rep = harness.Report("json", tmp_path / "r.json")
    rep.note("n")
    rep.table(["k"], [[1.5]], name="t", raw_rows=[[1.5]])
    rep.data["extra"] = 7
    rep.finish()
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"notes": ["n"], "tables": [{"name": "t", "header": ["k"], "rows": [[1.5]]}], "extra": 7}
    assert json.loads((tmp_path / "r.json").read_text()) == doc


def test_child_json_reads_the_last_json_line_and_exits_with_the_childs_error():
    code = "import json; print('noise'); print(json.dumps({'a': 1})); print(json.dumps({'a': 2}))"
    assert harness.child_json(["-c", code]) == {"a": 2}
    with pytest.raises(SystemExit, match=r"(?s)probe failed:.*boom"):
        harness.child_json(["-c", "raise RuntimeError('boom')"], what="probe")


def test_the_ratio_interval_is_paired_by_round():
    assert harness.ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == (2.0, 2.0, 2.0)


def test_no_script_parses_its_command_line_or_draws_a_table_on_its_own():
    """Every script's command line starts from harness.parser and its tables from markdown_table."""
    own = []
    for path in sorted([*BENCH.glob("*.py"), *BENCH.glob("gpu_sections/*.py")]):
        if path.name == "harness.py":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr == "ArgumentParser":
                own.append(f"{path.name}: ArgumentParser")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("|---"):
                own.append(f"{path.name}: a table separator")
    assert own == []


def test_harness_imports_only_the_standard_library():
    """gpu_check.py runs it with a GPU machine's system Python."""
    tree = ast.parse((BENCH / "harness.py").read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}
