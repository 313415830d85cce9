"""Opening an MLflow store without losing or inventing anything.

Why this module exists: MLflow, handed a bad store, either prints a
SQLAlchemy traceback (a corrupt or truncated ``mlflow.db``, a read-only
folder, ``foo://bar``) or quietly creates a new, empty store (a mistyped
path in ``lsbench report``).  :func:`open_store` checks a store before
MLflow touches it and turns every fault into one :class:`StoreError` line
naming the store and the cause; :func:`~.store_faults.store_error` does the same for a
fault that appears later (a disk that fills up mid-study).  Nothing here deletes,
recreates or repairs a store: what was logged stays as it was.

Artifacts are stored relative to the store (:data:`ARTIFACT_SCHEME`): an
experiment of a SQLite store gets ``lsbench-store:/artifacts/<study>``,
resolved at read time against the folder holding ``mlflow.db``, so a copied
or moved runs folder keeps its plots.  MLflow finds the resolver through the
``mlflow.artifact_repository`` entry point (pyproject.toml), so a plain
``MlflowClient`` and ``mlflow server`` (``lsbench ui``) read them too, as
long as lossscale_bench is installed where they run.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

__all__ = [
    "StoreError",
    "StoreMissing",
    "ALLOWED_SCHEMES",
    "DATABASE_SCHEMES",
    "USABLE_STORES",
    "ARTIFACT_SCHEME",
    "open_store",
    "redact",
    "sqlite_path",
    "resolve_tracking_uri",
    "check_scheme",
    "default_tracking_uri",
    "relative_artifact_location",
    "store_relative_repository",
    "ensure_artifact_scheme",
]

#: tracking-URI schemes lsbench opens (SQLAlchemy dialects may carry a driver: ``postgresql+psycopg2``).
#: Refused before any work, though MLflow parses them: ``file:`` and plain paths (MLflow 3's
#: file store raises "maintenance mode" on first use), SQLite without a file (in memory: nothing
#: outlives the process, so a rerun trains everything again) and ``uc``/``databricks-uc``
#: (model-registry URIs: MLflow has no tracking store for them). ``databricks`` is accepted but
#: not advertised in :data:`USABLE_STORES`: lsbench has never been tried on it.
ALLOWED_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
#: the stores MLflow reaches through SQLAlchemy (a database connection in this process), not a server
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
#: what every refused URI's message ends with: the stores known to work
USABLE_STORES = (
    "use sqlite:///path/mlflow.db (a SQLite file), http://host:port or https://host (an MLflow "
    "server), or a postgresql:, mysql: or mssql: database URL"
)
#: artifact-URI scheme of locations relative to the store's folder (see the module docstring)
ARTIFACT_SCHEME = "lsbench-store"
SQLITE_MAGIC = b"SQLite format 3\x00"
#: below this much free space a study would stop at its first write: refuse before starting
MIN_FREE_BYTES = 1 << 20
HTTP_TIMEOUT_S = 5.0
#: larger SQLite stores skip the full-file PRAGMA quick_check (header and schema checks still run)
QUICK_CHECK_MAX_BYTES = 512 << 20
#: seconds a reader (``report``, ``ui``) waits for another process's write lock on a SQLite store before
#: it says so in one line (SQLite's own busy wait; MLflow's would retry for over a minute, then a traceback)
LOCK_WAIT_S = 10.0


class StoreError(RuntimeError):
    """The tracking store cannot be used (corrupt, read-only, full, unreachable, bad URI).

    The message is one line naming the store and the cause; ``lsbench`` exits 4 on it.
    ``stops_study``: a trial that meets it (through its sink) re-raises it instead of ending
    as ``failed``: the trial did nothing wrong, the study cannot record anything any more.
    """

    stops_study = True


class StoreMissing(StoreError):
    """There is no store where ``report``/``ui`` were pointed: a user error (exit 2), never created."""


# -- URIs ------------------------------------------------------------------------------------
def default_tracking_uri(runs_dir: str | Path) -> str:
    """``sqlite:///<absolute>/mlflow.db``: absolute because Ray trials run in their own directories."""
    return f"sqlite:///{Path(runs_dir).expanduser().resolve() / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None, runs_dir: str | Path) -> str:
    """The store to use: ``uri``, else ``$MLFLOW_TRACKING_URI``, else ``<runs_dir>/mlflow.db``.

    Creates nothing (``lsbench report`` must not create a store); :func:`open_store` with
    ``create=True`` makes the folder of a new SQLite store.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return default_tracking_uri(runs_dir)
    rest = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None
    if rest and not rest.startswith("/") and rest.split("?", 1)[0] != ":memory:":
        # make relative SQLite paths absolute, for the same reason (in-memory SQLite is no path:
        # left as it is for check_scheme to refuse, not turned into a file named ':memory:')
        return f"sqlite:///{Path(rest).expanduser().resolve()}"
    return uri


def _scheme(uri: str) -> str:
    if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's bare profile-less forms
        return uri
    scheme = urlparse(uri).scheme.lower()
    if len(scheme) == 1 and os.name == "nt":  # C:\path
        return ""
    return scheme.split("+", 1)[0]


def redact(uri: str) -> str:
    """The URI without a password, for messages (a database URI may carry one)."""
    p = urlparse(uri)
    if p.password:
        netloc = p.netloc.replace(f":{p.password}@", ":***@")
        return p._replace(netloc=netloc).geturl()
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores and in-memory SQLite)."""
    if _scheme(uri) != "sqlite":
        return None
    rest = uri.split("://", 1)[1] if "://" in uri else ""
    rest = rest.split("?", 1)[0]
    if not rest.startswith("/") or rest in ("/", "/:memory:"):
        return None
    return Path(unquote(rest[1:])).expanduser()  # "//abs/path" -> "/abs/path", "/rel" -> "rel"


def _file_store_path(uri: str) -> Path:
    """The folder a ``file:`` URI or a plain path names (MLflow's file store, refused)."""
    if _scheme(uri) == "file":
        return Path(unquote(urlparse(uri).path))
    return Path(uri).expanduser()


# -- opening ---------------------------------------------------------------------------------
def open_store(uri: str, *, create: bool, missing_ok: bool = False) -> str:
    """Check the store at ``uri`` before MLflow opens it; return ``uri``.

    ``create=True`` (``lsbench run``): the store will be written, and may be created.
    ``create=False`` (``report``): it must exist already; nothing is created.
    ``missing_ok`` (``ui``): a store that is not there is left to the caller; one that is
    there is checked all the same.
    Raises :class:`StoreError` (:class:`StoreMissing` for a store that is not there).
    """
    try:
        return _open_store(uri, create)
    except StoreMissing:
        if missing_ok:
            return uri
        raise


def check_scheme(uri: str) -> str:
    """Raise :class:`StoreError` for a tracking URI lsbench cannot keep results in; return its scheme.

    Writes nothing (``lsbench run`` calls it before it creates the runs folder and its lock,
    ``report`` and ``ui`` through :func:`open_store`): an unknown scheme, a folder store
    (``file:``, a plain path, or a string that is no URI at all and would be taken for one),
    SQLite without a file, a model-registry URI.
    """
    scheme = _scheme(uri)
    if scheme in ("", "file"):
        raise StoreError(_folder_store(uri))
    if scheme == "sqlite" and sqlite_path(uri) is None:
        raise StoreError(
            f"tracking URI {redact(uri)!r} is SQLite without a file (in memory): nothing it records "
            f"would outlive this process, and a rerun would train everything again; {USABLE_STORES}"
        )
    if scheme in ("uc", "databricks-uc"):
        raise StoreError(
            f"tracking URI {redact(uri)!r} is a model-registry URI (MLflow has no tracking store for "
            f"{scheme!r}); {USABLE_STORES}"
        )
    if scheme not in ALLOWED_SCHEMES:
        raise StoreError(f"tracking URI {redact(uri)!r}: unknown scheme {scheme!r}; {USABLE_STORES}")
    return scheme


def _folder_store(uri: str) -> str:
    """Why a ``file:`` URI or a plain path is refused, and the URI to pass instead when it is plain."""
    folder = _file_store_path(uri)
    try:  # the hints are a courtesy: a path that cannot even be looked at gets the plain refusal
        if folder.is_file() and _is_sqlite_file(folder):
            return f"tracking URI {uri!r} is a SQLite file, not a folder: pass sqlite:///{folder.resolve()}"
        if (folder / "mlflow.db").is_file():
            return (
                f"tracking URI {uri!r} is a folder; its store is the mlflow.db in it: "
                f"pass sqlite:///{(folder / 'mlflow.db').resolve()}"
            )
    except (OSError, ValueError):  # EACCES, a name too long, an embedded NUL
        pass
    what = "names a folder" if _scheme(uri) == "file" else "has no scheme, so it names a folder"
    return (
        f"tracking URI {uri!r} {what}: MLflow's file store, which MLflow 3 no longer opens "
        f'("maintenance mode"); {USABLE_STORES}'
    )


def _open_store(uri: str, create: bool) -> str:
    scheme = check_scheme(uri)
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(db, create)
    elif scheme in ("http", "https"):
        from .server_probe import server_problem

        problem = server_problem(uri, HTTP_TIMEOUT_S, redact(uri))
        if problem:
            raise StoreError(problem)
    elif scheme in ("postgresql", "mysql", "mssql"):
        _check_driver(uri)
    return uri


def _is_sqlite_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _check_sqlite(db: Path, create: bool) -> None:
    if not db.exists():
        if not create:
            raise StoreMissing(f"no MLflow store at {db} (run a study first or pass --tracking-uri)")
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the MLflow store {db}: {_os_cause(e)}") from None
        _check_writable(db)
        return
    if db.is_dir():
        raise StoreError(f"MLflow store {db} is a folder, not a SQLite file")
    try:
        with db.open("rb") as f:
            head = f.read(100)
    except OSError as e:
        raise StoreError(f"cannot read the MLflow store {db}: {_os_cause(e)}") from None
    if not head:
        if not create:
            raise StoreMissing(f"no MLflow store at {db} (the file is empty; run a study first)")
    elif not head.startswith(SQLITE_MAGIC):
        raise StoreError(
            f"MLflow store {db} is not a SQLite database (corrupt or another kind of file; it was left as it is)"
        )
    else:
        _check_integrity(db, create, head)
    if create:
        _check_writable(db)


def _truncated(db: Path, head: bytes) -> str | None:
    """The header's page count against the file's size: a cut-off copy, found without reading it all."""
    if len(head) < 100 or Path(f"{db}-wal").exists():  # a WAL file holds pages the main file lacks
        return None
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if head[24:28] != head[92:96] or not pages:  # the in-header size is only valid when these agree
        return None
    size = db.stat().st_size
    return f"{size} bytes where its header says {pages * page}" if size < pages * page else None


def _check_integrity(db: Path, create: bool, head: bytes = b"") -> None:
    """``PRAGMA quick_check`` on a read-only connection: a truncated or damaged file is named as such.

    quick_check reads every page (seconds per GB): stores over :data:`QUICK_CHECK_MAX_BYTES`
    get the header checks only, and MLflow's own "malformed" errors are mapped by :func:`~.store_faults.store_error`.
    """
    short = _truncated(db, head)
    if short:
        raise StoreError(f"MLflow store {db} is truncated ({short}); it was left as it is")
    try:
        conn = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open the MLflow store {db}: {e}") from None
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        big = db.stat().st_size > QUICK_CHECK_MAX_BYTES
        problems = ["ok"] if big else [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
    except sqlite3.OperationalError as e:
        if "locked" in str(e).lower() and not create:  # a reader would wait on MLflow's retries for minutes
            raise StoreError(
                f"MLflow store {db} is locked: another process held its write lock for more than {LOCK_WAIT_S:g} s; "
                "nothing was read: run again when it has finished writing"
            ) from None
        if "locked" in str(e).lower() or "readonly" in str(e).lower():
            return  # a writer holds it (a study running); MLflow waits for it, and would see real damage
        raise StoreError(f"MLflow store {db} is corrupt or truncated ({e}); it was left as it is") from None
    except sqlite3.DatabaseError as e:
        raise StoreError(f"MLflow store {db} is corrupt or truncated ({e}); it was left as it is") from None
    finally:
        conn.close()
    if problems != ["ok"]:
        found = " ".join("; ".join(problems).replace("*** in database main ***", "").split())
        raise StoreError(
            f"MLflow store {db} is corrupt or truncated (integrity check: {found[:200]}); it was left as it is"
        )
    half = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if half:
        raise StoreError(half_migrated(db, half))
    if tables and "experiments" not in tables:
        raise StoreError(
            f"{db} is a SQLite database but not an MLflow store (tables: "
            f"{', '.join(sorted(tables)[:5])}); pass another --tracking-uri or --runs-dir"
        )
    if not tables and not create:
        raise StoreMissing(f"no MLflow store at {db} (an empty SQLite file; run a study first)")


def half_migrated(db: Path, leftovers: list[str]) -> str:
    """What to say of a store an interrupted MLflow schema migration left behind (two runs racing, kill -9).

    Measured: with the leftover ``_alembic_tmp_*`` tables dropped, ``mlflow db upgrade``
    completes the migration; with them, it fails. Whether dropping them is safe depends on
    whether each original table is still there, so the message says how to check, and
    lsbench repairs nothing itself.
    """
    return (
        f"MLflow store {db} was left half-migrated by an interrupted schema upgrade (leftover tables: "
        f"{', '.join(leftovers)}); it was left as it is. To repair: back it up; if each table without the "
        f"_alembic_tmp_ prefix exists too, drop the leftovers and run `mlflow db upgrade sqlite:///{db}`; "
        "a store with no results worth keeping can simply be deleted"
    )


def _os_cause(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "disk full"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"read-only ({e.strerror})"
    return e.strerror or str(e)


def _check_writable(db: Path) -> None:
    """Try it: SQLite writes the file and a journal beside it. Root ignores mode bits, so no ``os.access``."""
    folder = db.parent
    try:
        if db.exists():
            with db.open("r+b"):
                pass
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".lsbench-write-check-"):
            pass
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise StoreError(
                f"MLflow store {db} is read-only ({e.strerror}: {e.filename or folder}); "
                "a study needs to write it: make it writable or pass another --runs-dir"
            ) from None
        raise StoreError(f"MLflow store {db} cannot be written: {_os_cause(e)}") from None
    try:
        import shutil

        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < MIN_FREE_BYTES:
        raise StoreError(f"MLflow store {db}: disk full ({free} bytes free in {folder})")


def _check_driver(uri: str) -> None:
    """SQLAlchemy imports the database driver when it builds an engine (it connects only later)."""
    import sqlalchemy

    try:
        sqlalchemy.create_engine(uri).dispose()
    except ImportError as e:
        raise StoreError(f"tracking URI {redact(uri)}: its database driver is not installed ({e})") from None
    except Exception as e:  # noqa: BLE001 - sqlalchemy.exc.ArgumentError and kin: a malformed URL
        raise StoreError(
            f"tracking URI {redact(uri)} is not a valid database URL ({' '.join(str(e).split())[:150]})"
        ) from None


# -- artifacts relative to the store ---------------------------------------------------------
def relative_artifact_location(study_name: str) -> str:
    """``lsbench-store:/artifacts/<study>``: resolved against the store's folder when read."""
    return f"{ARTIFACT_SCHEME}:/artifacts/{quote(study_name, safe='')}"


def _store_folder(tracking_uri: str | None) -> Path:
    uri = tracking_uri or os.environ.get("_MLFLOW_SERVER_FILE_STORE") or os.environ.get("MLFLOW_TRACKING_URI")
    db = sqlite_path(uri) if uri else None
    if db is None:
        # `mlflow server` hands its repositories no tracking URI; it exports its store instead
        server = os.environ.get("_MLFLOW_SERVER_FILE_STORE")
        db = sqlite_path(server) if server else None
    if db is None:
        from mlflow.exceptions import MlflowException

        raise MlflowException(
            f"{ARTIFACT_SCHEME}: artifact locations are relative to a SQLite store's folder; "
            f"the tracking URI is {uri!r}"
        )
    return db.expanduser().resolve().parent


def store_relative_repository(artifact_uri: str, tracking_uri: str | None = None, registry_uri: str | None = None):
    """MLflow artifact repository for ``lsbench-store:/<path>``: a local one at ``<store folder>/<path>``."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    rel = unquote(urlparse(artifact_uri).path).lstrip("/")
    if any(part == ".." for part in Path(rel).parts):
        from mlflow.exceptions import MlflowException

        raise MlflowException(f"{artifact_uri}: '..' is not allowed in a store-relative artifact location")
    target = _store_folder(tracking_uri) / rel
    return LocalArtifactRepository(target.as_uri(), tracking_uri=tracking_uri, registry_uri=registry_uri)


def ensure_artifact_scheme() -> None:
    """Register :data:`ARTIFACT_SCHEME` when the entry point is not installed (an old editable install)."""
    from mlflow.store.artifact import artifact_repository_registry as reg

    if ARTIFACT_SCHEME not in reg.get_registered_artifact_repositories():
        reg._artifact_repository_registry.register(ARTIFACT_SCHEME, store_relative_repository)
