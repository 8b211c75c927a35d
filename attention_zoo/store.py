"""The results store: one SQLite file, one row per measured metric, committed case by case.

API (everything a writer needs; benchmarks and tasks share it):

    from attention_zoo.store import open_store
    with open_store("results/zoo.sqlite", write=True) as store:    # checked, created if missing
        run_id = store.start_run(kind="task", device="cpu")        # environment captured here
        store.add_rows(run_id, case_key, case_config,              # case_key: any str, or
                       [("accuracy", 0.97, "fraction"),            #   case_key(case_config)
                        ("steps_to_target", 420, "steps")],
                       status="ok")                                # ok | oom | error | skipped
        store.completed_cases(run_id)                              # -> {case_key, ...}
        store.finish_run(run_id)                                   # or mark_interrupted(run_id)
        store.rows(run_id=..., metric=...)                         # -> list of dicts
        store.to_dataframe(); store.export_csv("out.csv")

Every row carries run id, git commit, torch version, device name, thread count, host and the full
case config as JSON; `environment` holds the whole environment of the process that measured the
case, attention-zoo's version beside the commit (a Ray worker on another machine records its own,
see measure/env.py); `facts` what the case ran as (each backend's capabilities when it was
measured, so a report needs no plugin to rank it; any other keys a writer adds); every run the
machine's load (cores busy) when it started and finished (and the core count), so timings taken on
a busy machine can be told apart. A case written again in the same run replaces its earlier rows
(no duplicates).

A file that is not a store of this schema raises StoreError saying what it is; nothing is changed.
A store of ours that SQLite cannot read is called damaged, and the rows it still holds are offered
to `zoo results --recover` (recover.py). Reading never changes a store: it is opened read-only,
and one of an older schema version is read through an upgraded copy in memory. Writing to an older
store upgrades it in place (MIGRATIONS: additions only, no row is lost) after copying the file
beside it, and says so in one line; a store of a newer version is refused, naming it. Creating and
upgrading are safe with several processes opening one store at once: each takes the write lock
first and looks again under it, so one creates (or upgrades) and the others find it done.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import IO, Any

from .errors import UsageError, ZooError
from .measure.cases import case_key
from .measure.env import Environment, capture
from .measure.labels import facts_of
from .measure.load import Load, cpu_count, machine_load
from .measure.status import OK, STATUSES
from .paths import require_folder, require_writable
from .salvage import journal_of, readable_rows
from .version import __version__

log = logging.getLogger(__name__)

DEFAULT_STORE = "results/zoo.sqlite"  # every command's --store default
SCHEMA_VERSION = 4
APPLICATION_ID = 0x5A4F4F31  # "ZOO1" in the SQLite header: marks a file as an attention-zoo store
BUSY_TIMEOUT_S = 30  # how long an opener waits for another process's write lock
EXPORT_COLUMNS = (
    "run_id",
    "case_key",
    "status",
    "metric",
    "value",
    "unit",
    "git_commit",
    "torch_version",
    "device_name",
    "threads",
    "config",
    "error",
    "created_at",
    "host",
    "environment",
    "facts",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,              -- bench, task, ...
    fingerprint TEXT,                -- identity of a sweep's case list (resume finds runs by it)
    started_at REAL NOT NULL,
    finished_at REAL,
    git_commit TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    device_name TEXT NOT NULL,
    threads INTEGER NOT NULL,
    meta TEXT NOT NULL,              -- JSON: command line, settings, python, host
    load_start REAL,                 -- cores busy when the run started (measure.load) (v2)
    load_end REAL,                   -- ... when it finished (v2)
    cpu_count INTEGER                -- cores the run could use (v2)
);
CREATE TABLE IF NOT EXISTS cases (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    case_key TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    config TEXT NOT NULL,            -- JSON
    created_at REAL NOT NULL,
    environment TEXT,                -- JSON: where it was measured (NULL: the run's environment)
    facts TEXT,                      -- JSON: what it ran as (backends' capabilities, ...) (v4)
    PRIMARY KEY (run_id, case_key)
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    case_key TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    unit TEXT NOT NULL,
    git_commit TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    device_name TEXT NOT NULL,
    threads INTEGER NOT NULL,
    config TEXT NOT NULL,            -- JSON, the full case config
    created_at REAL NOT NULL,
    FOREIGN KEY (run_id, case_key) REFERENCES cases(run_id, case_key)
);
CREATE INDEX IF NOT EXISTS results_case ON results(run_id, case_key);
CREATE INDEX IF NOT EXISTS results_metric ON results(metric);
"""


# version -> SQL taking a store of the version before it there; additions only, no row is lost
MIGRATIONS = {
    2: """
        ALTER TABLE runs ADD COLUMN load_start REAL;
        ALTER TABLE runs ADD COLUMN load_end REAL;
        ALTER TABLE runs ADD COLUMN cpu_count INTEGER;
    """,
    3: """
        ALTER TABLE cases ADD COLUMN environment TEXT;
    """,
    4: """
        ALTER TABLE cases ADD COLUMN facts TEXT;
    """,
}


class StoreError(ZooError):
    """A file that is not a results store of this version, or a store used wrongly."""


Row = tuple[str, float, str]  # (metric, value, unit); measure.runner.Metric is one


SQLITE_MAGIC = b"SQLite format 3\x00"


def is_ours(path: Path) -> bool:
    """True when the file's SQLite header carries our application id (readable or not)."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError:
        return False
    return header.startswith(SQLITE_MAGIC) and header[68:72] == APPLICATION_ID.to_bytes(4, "big")


def _has_journal(path: Path) -> bool:
    """A rollback journal beside the store: a write under way, or one a killed process left."""
    try:
        return journal_of(path).stat().st_size > 0
    except OSError:  # none, or a writer's just committed
        return False


def _roll_back_unfinished_write(path: Path) -> None:
    """A journal a killed writer left keeps a read-only connection from reading the store:
    SQLite undoes that write in the first connection that may write (never a live writer's), so
    one is opened for a moment, as any writing command would, where the store can be written."""
    if not (_has_journal(path) and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return
    try:
        with closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        pass  # damaged, or busy: the read-only open says which


def _unfinished_write(path: Path) -> StoreError:
    journal = journal_of(path).name
    return StoreError(
        f"{path} holds an unfinished write of a process that was stopped ({journal} beside it "
        "undoes it, but only where the store can be written): make the store and its folder "
        f"writable and run the command again; do not delete {journal}"
    )


def damaged(path: Path, err: sqlite3.Error) -> StoreError:
    """The error for a store of ours that SQLite cannot read, saying what can still be saved."""
    readable = readable_rows(path)
    found = sum(readable.rows.values())
    counts = ", ".join(f"{t} {n}" for t, n in readable.rows.items())
    cut = " before reading stopped at its budget of SQLite steps" if readable.cut_short else ""
    if found:
        advice = (
            f"{'at least ' if cut else ''}{found} rows can still be read ({counts}{cut}): "
            f"'zoo results --store {path} --recover' copies them into a new store, or restore "
            "the file from a copy"
        )
    else:
        none = f"no row of it was read{cut}" if cut else "no row of it can be read"
        advice = f"{none}: restore it from a copy, or pass another --store path"
    return StoreError(
        f"{path} is an attention-zoo results store, but it is damaged (SQLite says: {err}); "
        f"nothing was changed; {advice}"
    )


def _now() -> float:
    return time.time()


def _apply_migrations(db: sqlite3.Connection, version: int) -> None:
    """Run MIGRATIONS from `version` up to SCHEMA_VERSION on `db` (the caller's transaction)."""
    for v in range(version + 1, SCHEMA_VERSION + 1):
        for statement in filter(str.strip, MIGRATIONS[v].split(";")):
            db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _copy_to(path: Path, dest: Path) -> None:
    """Copy the store at `path` into a new file through a second SQLite connection, which may
    read while this process holds the write lock (a backup through the locking connection waits
    on itself; opening the file outside SQLite and closing it would drop SQLite's POSIX locks)."""
    part = dest.with_name(f".{dest.name}.part")  # a copy cut short never looks like a backup
    source = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        with closing(sqlite3.connect(part)) as copy:
            source.backup(copy)
        os.replace(part, dest)
    finally:
        source.close()
        part.unlink(missing_ok=True)


def backup_path(path: Path, version: int) -> Path:
    """Where a store of schema `version` is copied before it is upgraded: beside it, named by
    the version (zoo.sqlite -> zoo.v3-backup.sqlite), never over an existing file."""
    for n in range(1, 10_000):
        tag = f"v{version}-backup" + (f"-{n}" if n > 1 else "")
        candidate = path.with_name(f"{path.stem}.{tag}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise StoreError(f"too many backups of {path} beside it; move some away")


class ResultStore:
    """An SQLite results store at `path` (created with its folder if missing).

    write=False opens it for reading only: nothing of the file is ever changed (SQLite opens it
    read-only), and a store of an older schema version is read through an upgraded copy in
    memory. write=True upgrades an older store in place, copying the file beside it first
    (`upgraded`: the notice saying so, None when nothing was upgraded)."""

    def __init__(self, path: str | Path, *, create: bool = True, write: bool = True) -> None:
        self.path = Path(path)
        self.write = write
        self.upgraded: str | None = None
        create = create and write
        if self.path.is_dir():
            raise _folder_given(self.path, "--store")
        exists = self.path.exists() and self.path.stat().st_size > 0
        if not exists and not create:
            empty = " (the file is empty)" if self.path.exists() else ""
            raise StoreError(
                f"no results store at {self.path}{empty}; run 'zoo bench' first "
                "or pass --store PATH"
            )
        if not exists:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise StoreError(
                    f"cannot create the results store's folder {self.path.parent} "
                    f"({err.strerror or err}); run where you can write, or pass --store PATH "
                    "in a folder you can write"
                ) from None
        if not write and exists:
            _roll_back_unfinished_write(self.path)
        try:
            self._db = (
                sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
                if write
                else sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S
                )
            )
        except sqlite3.Error as err:
            raise StoreError(f"cannot open the results store {self.path} ({err})") from None
        self._db.row_factory = sqlite3.Row
        try:
            self._open()
        except sqlite3.OperationalError as err:
            self._db.close()
            if not write and "readonly" in str(err) and _has_journal(self.path):
                raise _unfinished_write(self.path) from None
            what = "create" if create and not exists else "read"
            raise StoreError(f"cannot {what} the results store {self.path} ({err})") from None
        except sqlite3.DatabaseError as err:
            self._db.close()
            if is_ours(self.path):
                raise damaged(self.path, err) from None
            raise StoreError(
                f"{self.path} is not an attention-zoo results store (SQLite says: {err}); "
                f"pass another --store path, or move this file away"
            ) from None
        except StoreError:
            self._db.close()
            raise

    def _open(self) -> None:
        if self.write and self._is_empty():
            self._create()
        self._check()

    def _is_empty(self) -> bool:
        """A new file (or one another process is creating): no header mark, no table."""
        app = self._db.execute("PRAGMA application_id").fetchone()[0]
        tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return app == 0 and tables == 0

    def _create(self) -> None:
        """The schema, in one transaction under the write lock: of several processes creating
        one store at once, the first creates it and the others find it made."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._is_empty():
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        finally:
            if self._db.in_transaction:
                self._db.rollback()

    def _check(self) -> None:
        app = self._db.execute("PRAGMA application_id").fetchone()[0]
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if app != APPLICATION_ID:
            tables = [
                r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            raise StoreError(
                f"{self.path} is an SQLite database but not an attention-zoo results store "
                f"(application_id {app:#x}, tables: {', '.join(tables) or 'none'}); "
                f"pass another --store path"
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has store schema version {version}, written by a newer "
                f"attention-zoo; this one ({__version__}) reads store schemas up to version "
                f"{SCHEMA_VERSION}: upgrade attention-zoo to read it"
            )
        if version < SCHEMA_VERSION and not all(
            v in MIGRATIONS for v in range(version + 1, 1 + SCHEMA_VERSION)
        ):
            raise StoreError(
                f"{self.path} has store schema version {version}, which this attention-zoo "
                f"({__version__}) cannot read; export it with the version that wrote it "
                "('zoo results --format csv') or start a new store"
            )
        try:  # a damaged file with an intact header fails here
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            self._db.execute("SELECT count(*) FROM results").fetchone()
        except sqlite3.DatabaseError as err:
            raise damaged(self.path, err) from None
        if version < SCHEMA_VERSION:
            if self.write:
                self._upgrade(version)
            else:
                self._db = self._upgraded_copy(version)

    def _upgraded_copy(self, version: int) -> sqlite3.Connection:
        """An in-memory copy of this older store brought up to this schema: what a reader reads,
        so the file itself is never changed."""
        copy = sqlite3.connect(":memory:")
        self._db.backup(copy)
        self._db.close()
        copy.row_factory = sqlite3.Row
        with copy:
            _apply_migrations(copy, version)
        return copy

    def _upgrade(self, version: int) -> None:
        """Bring this store of an older schema `version` up to this one, in one transaction,
        after copying the file beside it (`backup_path`); sets `upgraded` to the notice saying so.

        The write lock is taken first and the version read again under it, so a concurrent
        opener that upgraded it meanwhile leaves nothing to do (and no second copy)."""
        backup = None
        try:
            self._db.execute("BEGIN IMMEDIATE")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                backup = backup_path(self.path, version)
                _copy_to(self.path, backup)  # no writer can change it under this lock
                _apply_migrations(self._db, version)
            self._db.execute("COMMIT")
        except (sqlite3.OperationalError, OSError) as err:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if backup is not None:
                backup.unlink(missing_ok=True)
            reason = f"SQLite says: {err}" if isinstance(err, sqlite3.Error) else err.strerror
            raise StoreError(
                f"{self.path} has store schema version {version} and could not be upgraded to "
                f"{SCHEMA_VERSION} for writing ({reason}); nothing was changed. Make the file "
                "and its folder writable, or pass another --store path (reading needs neither)"
            ) from None
        if backup is not None:
            self.upgraded = (
                f"note: upgraded the results store {self.path} from schema version {version} to "
                f"{SCHEMA_VERSION} to write to it; the version-{version} file is kept as {backup} "
                "(attention-zoo versions that read only that schema can open it)"
            )
            log.warning("%s", self.upgraded)

    # ---- context manager -------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing -----------------------------------------------------------------------------

    def start_run(
        self,
        *,
        kind: str = "bench",
        run_id: str | None = None,
        fingerprint: str | None = None,
        environment: Environment | None = None,
        device: str = "cpu",
        meta: dict[str, Any] | None = None,
        load: Load | None = None,
    ) -> str:
        """Register a run; returns its id. The environment (git commit, torch, device, threads) is
        captured now for `device` unless given, and so is the machine's load (a caller that
        already sampled it, to warn, passes its sample); an existing run_id is reused (resume):
        an unfinished one's start load is raised to this one's if higher (busy if any of its
        sessions started so), a finished one is left as it is."""
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        run = self.run(run_id)
        if run is not None and run["finished_at"] is not None:
            return run_id
        load = load if load is not None else machine_load()
        if run is not None:
            starts = [x for x in (run["load_start"], load.cores_busy) if x is not None]
            with self._db:
                self._db.execute(
                    "UPDATE runs SET load_start = ? WHERE run_id = ?",
                    (max(starts) if starts else None, run_id),
                )
            return run_id
        env = environment or capture(device)
        meta = {
            "python": env.python,
            "host": env.host,
            "zoo_version": env.zoo_version,
            "load": load.kind,
            **(meta or {}),
        }
        with self._db:
            self._db.execute(
                "INSERT INTO runs (run_id, kind, fingerprint, started_at, finished_at, git_commit, "
                "torch_version, device_name, threads, meta, load_start, cpu_count) "
                "VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    kind,
                    fingerprint,
                    _now(),
                    env.git_commit,
                    env.torch_version,
                    env.device_name,
                    env.threads,
                    json.dumps(meta, default=str),
                    load.cores_busy,
                    cpu_count(),
                ),
            )
        return run_id

    def check_writable(self) -> None:
        """StoreError unless this process can write here (a read-only file or folder, a locked
        store): checked before a command measures or trains anything."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            # touches page 1, so the rollback journal must be created next to the file
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.OperationalError as err:
            raise StoreError(
                f"cannot write to the results store {self.path} ({err}); make it writable or "
                "pass another --store path"
            ) from None
        finally:
            if self._db.in_transaction:
                self._db.rollback()

    def finish_run(self, run_id: str) -> Load:
        """Mark the run finished, with the machine's load now and how it was measured (meta's
        "load": the report's end-of-run rule depends on it); returns that load."""
        load = machine_load()
        run = self.run(run_id)
        meta = {**(run["meta"] if run else {}), "load": load.kind}
        with self._db:
            self._db.execute(
                "UPDATE runs SET finished_at = ?, load_end = ?, meta = ? WHERE run_id = ?",
                (_now(), load.cores_busy, json.dumps(meta, default=str), run_id),
            )
        return load

    def mark_interrupted(self, run_id: str) -> None:
        """Record that `run_id` stopped on Ctrl-C: what it stored stays, it is not finished."""
        run = self.run(run_id)
        if run is None:
            return
        meta = {**run["meta"], "interrupted_at": _now()}
        with self._db:
            self._db.execute(
                "UPDATE runs SET meta = ? WHERE run_id = ?", (json.dumps(meta, default=str), run_id)
            )

    def add_rows(
        self,
        run_id: str,
        key: str | None,
        case_config: dict[str, Any],
        rows: Iterable[Row],
        *,
        status: str = OK,
        error: str | None = None,
        environment: Environment | None = None,
        replace: bool = True,
        facts: dict[str, Any] | None = None,
    ) -> str:
        """Write one case's metric rows in one transaction; returns the case key.

        key None: case_key(case_config). environment None: the run's. replace=False appends
        to the case's earlier rows instead of replacing them (status/error are updated either way).
        facts: what the case ran as (any JSON keys, e.g. "capabilities" by backend), read back
        as each row's `facts`.
        """
        if status not in STATUSES:
            raise StoreError(f"status {status!r} is not one of: {', '.join(STATUSES)}")
        run = self.run(run_id)
        if run is None:
            raise StoreError(f"no run {run_id!r} in {self.path}; call start_run() first")
        key = key or case_key(case_config)
        config = json.dumps(case_config, sort_keys=True, default=str)
        env = (
            (
                environment.git_commit,
                environment.torch_version,
                environment.device_name,
                environment.threads,
            )
            if environment
            else (run["git_commit"], run["torch_version"], run["device_name"], run["threads"])
        )
        env_json = json.dumps(environment.to_dict()) if environment else None
        facts_json = json.dumps(facts, sort_keys=True, default=str) if facts else None
        now = _now()
        values = []
        for row in rows:
            metric, value, unit = row
            values.append(
                (
                    run_id,
                    key,
                    str(metric),
                    None if value is None else float(value),
                    str(unit),
                    *env,
                    config,
                    now,
                )
            )
        with self._db:  # one transaction: a case is stored whole or not at all
            if replace:
                self._db.execute(
                    "DELETE FROM results WHERE run_id = ? AND case_key = ?", (run_id, key)
                )
            self._db.execute(
                "INSERT OR REPLACE INTO cases (run_id, case_key, status, error, config, "
                "created_at, environment, facts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, key, status, error, config, now, env_json, facts_json),
            )
            self._db.executemany(
                "INSERT INTO results (run_id, case_key, metric, value, unit, git_commit, "
                "torch_version, device_name, threads, config, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        return key

    def import_rows(self, tables: dict[str, tuple[list[str], list[tuple]]]) -> None:
        """Insert rows as they are, table by table ({table: (columns, rows)}), in one transaction
        (a recovered store: recover.py); columns this schema lacks are dropped."""
        with self._db:
            for table, (columns, rows) in tables.items():
                ours = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                keep = [i for i, c in enumerate(columns) if c in ours]
                self._db.executemany(
                    f"INSERT OR IGNORE INTO {table} ({', '.join(columns[i] for i in keep)}) "
                    f"VALUES ({', '.join('?' * len(keep))})",
                    ([row[i] for i in keep] for row in rows),
                )

    # ---- reading -----------------------------------------------------------------------------

    def run(self, run_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return _run_dict(row) if row else None

    def runs(
        self, *, kind: str | None = None, fingerprint: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs, oldest first, each with its number of stored cases."""
        sql = (
            "SELECT runs.*, "
            "(SELECT count(*) FROM cases WHERE cases.run_id = runs.run_id) AS n_cases "
            "FROM runs WHERE (? IS NULL OR kind = ?) AND (? IS NULL OR fingerprint = ?) "
            "ORDER BY started_at, rowid"
        )
        return [_run_dict(r) for r in self._db.execute(sql, (kind, kind, fingerprint, fingerprint))]

    def metric_names(self, run_id: str | None = None) -> list[str]:
        """The metrics stored (in `run_id`, or anywhere), sorted."""
        rows = self._db.execute(
            "SELECT DISTINCT metric FROM results WHERE (? IS NULL OR run_id = ?) ORDER BY metric",
            (run_id, run_id),
        )
        return [r[0] for r in rows]

    def latest_run(self, **filters: Any) -> str | None:
        runs = self.runs(**filters)
        return runs[-1]["run_id"] if runs else None

    def completed_cases(self, run_id: str) -> set[str]:
        """Keys of the cases stored for `run_id` (any status)."""
        return {
            r[0] for r in self._db.execute("SELECT case_key FROM cases WHERE run_id = ?", (run_id,))
        }

    def held_cases(
        self, *, statuses: Iterable[str], run_id: str | None = None, kind: str | None = None
    ) -> set[str]:
        """Keys of the cases stored with one of `statuses`, in `run_id` and/or in any run of
        `kind` (both None: anywhere): what the run engine does not run again."""
        wanted = sorted(statuses)
        sql = (
            "SELECT DISTINCT c.case_key FROM cases c JOIN runs u ON u.run_id = c.run_id "
            f"WHERE c.status IN ({', '.join('?' * len(wanted))}) "
            "AND (? IS NULL OR c.run_id = ?) AND (? IS NULL OR u.kind = ?)"
        )
        return {r[0] for r in self._db.execute(sql, (*wanted, run_id, run_id, kind, kind))}

    def cases(self, run_id: str | None = None) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT * FROM cases WHERE (? IS NULL OR run_id = ?) ORDER BY created_at, rowid",
            (run_id, run_id),
        )
        return [{**dict(r), "config": json.loads(r["config"])} for r in rows]

    def rows(
        self, run_id: str | None = None, *, metric: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        """One dict per metric row (EXPORT_COLUMNS; config and environment as JSON text, facts a
        dict: {} for a case stored without them). A case with no metric rows (oom, error,
        skipped) appears once with metric None, so tables can show it."""
        sql = """
            SELECT c.run_id, c.case_key, c.status, r.metric, r.value, r.unit,
                   COALESCE(r.git_commit, u.git_commit) AS git_commit,
                   COALESCE(r.torch_version, u.torch_version) AS torch_version,
                   COALESCE(r.device_name, u.device_name) AS device_name,
                   COALESCE(r.threads, u.threads) AS threads,
                   c.config, c.error, COALESCE(r.created_at, c.created_at) AS created_at,
                   c.environment, c.facts, u.meta
            FROM cases c JOIN runs u ON u.run_id = c.run_id
            LEFT JOIN results r ON r.run_id = c.run_id AND r.case_key = c.case_key
            WHERE (? IS NULL OR c.run_id = ?) AND (? IS NULL OR r.metric = ?)
              AND (? IS NULL OR c.status = ?)
            ORDER BY c.created_at, c.rowid, r.id
        """
        params = (run_id, run_id, metric, metric, status, status)
        return [_with_environment(r) for r in self._db.execute(sql, params)]

    def to_dataframe(self, run_id: str | None = None, *, expand_config: bool = True) -> Any:
        """The rows as a pandas DataFrame; expand_config adds a column per config field (cfg.*)."""
        import pandas as pd

        df = pd.DataFrame(self.rows(run_id), columns=list(EXPORT_COLUMNS))
        if expand_config and len(df):
            cfg = pd.json_normalize([json.loads(c) for c in df["config"]]).add_prefix("cfg.")
            df = pd.concat([df.reset_index(drop=True), cfg], axis=1)
        return df

    def export_csv(self, dest: str | Path | IO[str], run_id: str | None = None) -> int:
        """Write the rows as CSV (EXPORT_COLUMNS); returns the number of rows written."""
        rows = self.rows(run_id)
        if isinstance(dest, (str, Path)):
            with open(dest, "w", newline="") as f:
                return write_csv(f, rows)
        return write_csv(dest, rows)

    def to_csv_text(self, run_id: str | None = None) -> str:
        buf = io.StringIO()
        self.export_csv(buf, run_id)
        return buf.getvalue()


def write_csv(dest: IO[str], rows: Iterable[dict[str, Any]]) -> int:
    """ResultStore.rows() as CSV (EXPORT_COLUMNS; facts as JSON text); returns the rows written."""
    writer = csv.DictWriter(dest, fieldnames=list(EXPORT_COLUMNS))
    writer.writeheader()
    count = 0
    for row in rows:
        writer.writerow({**row, "facts": json.dumps(row.get("facts") or {}, sort_keys=True)})
        count += 1
    return count


_ROW_ENVIRONMENT = ("git_commit", "torch_version", "device_name", "threads")


def _with_environment(r: sqlite3.Row) -> dict[str, Any]:
    """An export row; a case stored without its own environment (older stores, writers that
    give none) gets the run's, so every row names its host and device."""
    row = {k: r[k] for k in EXPORT_COLUMNS if k not in ("host", "environment", "facts")}
    row["facts"] = facts_of(r["facts"])
    env = json.loads(r["environment"]) if r["environment"] else None
    if env is None:
        meta = json.loads(r["meta"])
        env = {
            **{k: row[k] for k in _ROW_ENVIRONMENT},
            "python": meta.get("python", ""),
            "host": meta.get("host", ""),
        }
        if "zoo_version" in meta:  # runs stored before versions were recorded have none
            env["zoo_version"] = meta["zoo_version"]
    else:  # a case without metric rows (error, oom) still names the worker that tried it
        row.update({k: env[k] for k in _ROW_ENVIRONMENT if k in env})
    row["host"] = env.get("host", "")
    row["environment"] = json.dumps(env, sort_keys=True)
    return {k: row[k] for k in EXPORT_COLUMNS}


def _run_dict(row: sqlite3.Row) -> dict[str, Any]:
    d = dict(row)
    d["meta"] = json.loads(d["meta"])
    return d


def _folder_given(path: Path, flag: str) -> StoreError:
    return StoreError(f"{flag} {path} is a folder; give a file such as {path / 'zoo.sqlite'}")


def check_store_path(path: str | Path | None, *, write: bool, flag: str = "--store") -> Path:
    """The store's path, refused at once where no store can be (a folder, or a new file to write
    in a folder that does not exist or takes no new files), leaving nothing behind: a command
    checks it before its slow planning."""
    where = Path(DEFAULT_STORE if path is None else path)
    if where.is_dir():
        raise _folder_given(where, flag)
    if write and path is not None:
        require_folder(where.parent, f"{flag} {path}")
        if not where.exists():  # an existing store's writability is open_store's check
            require_writable(where.parent, f"{flag} {path}")
    return where


def open_store(
    path: str | Path | None, *, write: bool, flag: str = "--store", resume: bool = False
) -> ResultStore:
    """The results store a command reads or writes, with every check and message in one place:
    None is DEFAULT_STORE (its folder created when writing); a given path to write must be in
    an existing folder (a mistyped folder is an error, not a new folder) and writable, checked
    before anything is measured or trained; a store to read, or one --resume continues (resume),
    must exist. flag: the option that gave the path, as messages name it."""
    where = check_store_path(path, write=write, flag=flag)
    if resume and not Path(where).exists():
        raise UsageError(
            f"--resume: {where} does not exist, so it holds no run to continue; drop --resume "
            "to start a new run"
        )
    store = ResultStore(where, create=write, write=write)
    if write:
        try:
            store.check_writable()
        except StoreError:
            store.close()
            raise
    return store


def preview_store(path: str | Path | None) -> ResultStore:
    """The store a dry run reads: the file at `path` (None: DEFAULT_STORE) read-only where it
    holds a store, else an empty store in memory named as that file (what messages call it);
    nothing is created or written either way. A path a run could not write to is refused as the
    run refuses it."""
    where = check_store_path(path, write=True)  # a folder, or a missing one, refused here
    if where.exists() and where.stat().st_size > 0:
        return open_store(where, write=False)  # a foreign file: the run's error too
    store = ResultStore(":memory:")
    store.path = where
    return store


def run_status(run: dict[str, Any]) -> str:
    """'finished', 'interrupted' (Ctrl-C; resumable) or 'unfinished' (running, or killed)."""
    if run["finished_at"]:
        return "finished"
    return "interrupted" if run["meta"].get("interrupted_at") else "unfinished"


__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "ResultStore",
    "Row",
    "StoreError",
    "case_key",
    "check_store_path",
    "facts_of",
    "open_store",
    "preview_store",
    "run_status",
    "write_csv",
]
