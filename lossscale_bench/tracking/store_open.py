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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from .client import store_client
from .store import check_scheme
from .store_faults import store_error

__all__ = ["SCHEMA_RACE_ATTEMPTS", "open_client", "schema_lock", "schema_race"]

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


def open_client(uri: str):
    """A :func:`.client.store_client` on ``uri`` whose store's tables exist (made now if new), under
    :func:`schema_lock`; a lost race is tried again, a store fault is one :class:`.store.StoreError`."""
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
