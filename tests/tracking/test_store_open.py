"""A new SQLite store made from the kept empty store equals one MLflow's migrations make.

Why: making MLflow's tables and running its migrations cost about 2 s of every new study folder's
start; a new store is now a copy of the empty store this MLflow made once (tracking/store_open.py).
Checked with the real MLflow: the copy's schema and rows are the migrated store's (its default
experiment made by MLflow on the first open, with this process's paths; only the creation times differ),
an existing store is never replaced, and a template cut short is not used but made again.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from lossscale_bench.tracking import store_open
from lossscale_bench.tracking.store_open import new_sqlite_store, store_template

#: the columns of MLflow's rows that hold the time they were written
TIMES = ("creation_time", "last_update_time")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _open(db, name="study") -> None:
    """What ``lsbench run`` does first: a Tracker on the store and the study's experiment, in a process of its own."""
    code = "import sys; from lossscale_bench.tracking.tracker import Tracker; Tracker(sys.argv[1]).experiment_id(sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{db}", name], check=True, timeout=300)


def _contents(db) -> tuple[list, dict]:
    con = sqlite3.connect(db)
    try:
        # a table's clauses as a set: MLflow's own migrations write a table's constraints in an order that
        # differs from one migrated store to the next (measured: runs' CHECK clauses)
        schema = sorted(
            ((kind, name, frozenset(ln.strip().rstrip(",") for ln in (sql or "").splitlines())) for kind, name, sql in
             con.execute("SELECT type, name, sql FROM sqlite_master")),
            key=str,
        )  # fmt: skip
        rows = {}
        for kind, table, _ in schema:
            if kind != "table":
                continue
            cur = con.execute(f"SELECT * FROM {table}")
            cols = [d[0] for d in cur.description]
            rows[table] = sorted(tuple(v for c, v in zip(cols, r) if c not in TIMES) for r in cur.fetchall())
        return schema, rows
    finally:
        con.close()


def test_a_store_from_the_template_is_the_store_mlflows_migrations_make(tmp_path, cache):
    assert not store_template().exists()
    _open(tmp_path / "first" / "mlflow.db")  # migrated by MLflow; kept as the template
    assert store_open.is_empty_store(store_template())
    (tmp_path / "second").mkdir()
    assert new_sqlite_store(tmp_path / "second" / "mlflow.db")
    _open(tmp_path / "second" / "mlflow.db")
    first, second = _contents(tmp_path / "first" / "mlflow.db"), _contents(tmp_path / "second" / "mlflow.db")
    assert first[0] == second[0]  # tables, indexes, triggers: the same SQL
    assert first[1] == second[1]  # every row, the default experiment's path included, but the times
    assert ("0", "Default") in {(str(r[0]), r[1]) for r in second[1]["experiments"]}


def test_an_existing_store_is_never_replaced(tmp_path, cache):
    _open(tmp_path / "a" / "mlflow.db", name="kept")
    before = (tmp_path / "a" / "mlflow.db").read_bytes()
    assert not new_sqlite_store(tmp_path / "a" / "mlflow.db")
    assert (tmp_path / "a" / "mlflow.db").read_bytes() == before


def test_a_template_cut_short_is_not_used_and_is_made_again(tmp_path, cache):
    _open(tmp_path / "a" / "mlflow.db")
    template = store_template()
    whole = template.read_bytes()
    template.write_bytes(whole[: len(whole) // 3])
    (tmp_path / "b").mkdir()
    assert not new_sqlite_store(tmp_path / "b" / "mlflow.db")
    _open(tmp_path / "b" / "mlflow.db")  # made by MLflow's migrations instead, and kept
    assert store_open.is_empty_store(template)
    assert _contents(tmp_path / "b" / "mlflow.db")[0] == _contents(tmp_path / "a" / "mlflow.db")[0]
