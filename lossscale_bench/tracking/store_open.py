"""Opening a store for writing when other drivers may be opening the same new database at that moment.

MLflow creates its tables on a database's first use, and on PostgreSQL two processes doing it at once
collide: the loser gets ``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``
(two ``CREATE TABLE experiments``) or a duplicate ``alembic_version`` row, and its driver exits after
training nothing. Measured: three trackers opened together on a fresh PostgreSQL 15 database, six
databases in a row, lost one of the eighteen opens. A SQLite store is created under the runs folder's
lock; a database server needs a lock of its own, so :func:`open_client` takes the server's advisory lock
(PostgreSQL ``pg_advisory_lock``, MySQL ``GET_LOCK``) while the tables are made, and where it cannot
(another database, or an ``mlflow server`` that is creating them without the lock) waits and opens the
tables the winner made.

A new SQLite store starts as a copy of an empty one (:func:`new_sqlite_store`): MLflow's tables and
migrations cost about 2 s of every new study folder's start (measured: 2.1 of a 20 s two-trial study),
and the copy is what those migrations make, made once per MLflow, SQLAlchemy and SQLite version and kept
in the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``lossscale_bench/stores``), without its
default experiment, which MLflow adds on the store's first open with this machine's paths and times.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from .client import store_client
from .store import check_scheme, sqlite_path
from .store_faults import store_error

__all__ = [
    "SCHEMA_RACE_ATTEMPTS",
    "is_empty_store",
    "new_sqlite_store",
    "open_client",
    "schema_lock",
    "schema_race",
    "store_template",
]

#: how often opening a new database store is tried while another process creates its tables
SCHEMA_RACE_ATTEMPTS = 6
#: the advisory lock's key on PostgreSQL (any 64-bit number others do not use: "lsbench" in ASCII)
PG_LOCK_KEY = 0x6C7362656E6368
#: the named lock on MySQL, and how long a driver waits for it (s)
MYSQL_LOCK, LOCK_WAIT_S = "lsbench_schema", 600


def schema_race(exc: BaseException) -> bool:
    """Whether ``exc`` is a loss of the race to create a new database's MLflow tables."""
    text = str(exc).lower()
    if "pg_type_typname_nsp_index" in text or "alembic_version" in text:
        return "duplicate key" in text or "already exists" in text
    return "already exists" in text and ("create table" in text or "create index" in text)


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[bool]:
    """Hold the database server's lock for making MLflow's tables while the body runs; yields whether it
    is held (False on SQLite, an MLflow server, a database without such locks, or a server that cannot be
    reached now: the body's own open then says what is wrong)."""
    scheme = check_scheme(uri)
    if scheme not in ("postgresql", "mysql"):
        yield False
        return
    try:
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
        conn = engine.connect()
    except Exception:  # noqa: BLE001  (no lock to take: the store's own open reports the fault)
        yield False
        return
    take, give = (
        ("SELECT pg_advisory_lock(:key)", "SELECT pg_advisory_unlock(:key)")
        if scheme == "postgresql"
        else ("SELECT GET_LOCK(:name, :wait)", "SELECT RELEASE_LOCK(:name)")
    )
    args = {"key": PG_LOCK_KEY, "name": MYSQL_LOCK, "wait": LOCK_WAIT_S}
    try:
        conn.execute(sqlalchemy.text(take), args)
        conn.commit()
        held = True
    except Exception:  # noqa: BLE001
        held = False
    try:
        yield held
    finally:
        with contextlib.suppress(Exception):
            if held:
                conn.execute(sqlalchemy.text(give), args)
                conn.commit()
        conn.close()
        engine.dispose()


def store_template() -> Path:
    """Where the empty store of this MLflow, SQLAlchemy and SQLite is kept (it may not exist yet)."""
    import mlflow
    import sqlalchemy

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lossscale_bench" / "stores"
    return base / f"mlflow-{mlflow.__version__}-sqlalchemy-{sqlalchemy.__version__}-sqlite-{sqlite3.sqlite_version}.db"


def is_empty_store(db: Path) -> bool:
    """Whether ``db`` is a whole SQLite file of MLflow's tables holding no experiment and no run."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            ok = con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            counts = [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("experiments", "runs")]
            version = con.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            con.close()
    except (sqlite3.Error, OSError, TypeError):
        return False
    return ok and counts == [0, 0] and version is not None


def new_sqlite_store(db: Path) -> bool:
    """Make the missing (or empty) store file ``db`` a copy of :func:`store_template`; False (nothing done)
    where there is no usable template or ``db`` already holds something."""
    template = store_template()
    if (db.exists() and db.stat().st_size) or not is_empty_store(template):
        return False
    tmp = db.with_name(f".{db.name}.{os.getpid()}.new")
    try:
        shutil.copyfile(template, tmp)
        if db.exists():  # an empty file: replaced
            os.replace(tmp, db)
        else:  # made only where no other process made it meanwhile
            os.link(tmp, db)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _keep_template(db: Path) -> None:
    """Keep the store MLflow just made at ``db`` as the template, without its default experiment."""
    template = store_template()
    if is_empty_store(template):  # kept already (one that is not whole is replaced)
        return
    tmp = template.with_name(f".{template.name}.{os.getpid()}.new")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(db)
        try:
            out = sqlite3.connect(tmp)
            with out:
                con.backup(out)
                out.execute("DELETE FROM experiment_tags")
                out.execute("DELETE FROM experiments")
            out.close()
        finally:
            con.close()
        if is_empty_store(tmp):
            os.replace(tmp, template)
    except (OSError, sqlite3.Error):
        pass
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def open_client(uri: str):
    """A :func:`.client.store_client` on ``uri`` whose store's tables exist (made now if new: a new SQLite
    store from :func:`new_sqlite_store`), under :func:`schema_lock`; a lost race is tried again, a store
    fault is one :class:`.store.StoreError`."""
    db = sqlite_path(uri)
    made = db is not None and not (db.exists() and db.stat().st_size) and not new_sqlite_store(db)
    client = _open_client(uri)
    if made:
        _keep_template(db)
    return client


def _open_client(uri: str):
    with schema_lock(uri):
        for attempt in range(SCHEMA_RACE_ATTEMPTS):
            try:
                client = store_client(uri)
                client.search_experiments(max_results=1)  # creates/migrates a new store's tables now
                return client
            except Exception as exc:  # noqa: BLE001
                if schema_race(exc) and attempt < SCHEMA_RACE_ATTEMPTS - 1:
                    time.sleep(1.0 + attempt)  # another process is creating the tables: use them once made
                    continue
                fault = store_error(exc, uri)
                if fault is not None:
                    raise fault from exc
                raise
    raise AssertionError("unreachable")  # pragma: no cover
