"""Read what a damaged results store still holds, without writing it.

The file is opened read-only and immutable (never written; a journal of an unfinished write is
rolled back in a copy first), with SQLite's writable_schema on so a file shorter than its header
says (a crash, a full disk) still opens. Each table is read in rowid order; where a page cannot be
read, the scan looks further on for the next readable row, so the rows on either side of the
damage come back. Reading stops at a budget of SQLite steps, and says so.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

TABLES = ("runs", "cases", "results")  # in the order they are copied: a case's run comes first
_FIRST_ROWID = 0  # rowids are positive
_MAX_SKIP_BITS = 40  # the farthest a scan looks past damage: 2**40 rowids
_MAX_RESTARTS = 10_000  # a scan gives up after this many unreadable stretches
_STEP_BUDGET = 500_000_000  # SQLite VM steps for reading a whole damaged file, then it stops


def journal_of(path: Path) -> Path:
    """SQLite's rollback journal of the store at `path` (non-empty: a write that did not finish,
    which the journal undoes)."""
    return path.with_name(path.name + "-journal")


class Budgeted(sqlite3.Connection):
    """A connection whose reading stops at _STEP_BUDGET SQLite steps; `cut_short` says it did."""

    cut_short = False


@contextmanager
def open_damaged(path: Path) -> Iterator[Budgeted]:
    """The store at `path`, read-only and immutable. With a journal beside it (a process killed
    while writing), a copy of both, the unfinished write rolled back there, is read instead:
    immutable ignores a journal, and would read what was never committed."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch, path.name)
        try:
            shutil.copyfile(journal_of(path), journal_of(copy))
            shutil.copyfile(path, copy)
        except OSError:  # no journal (or it went: its write committed), or no room for a copy
            pass
        else:
            with closing(sqlite3.connect(copy)) as rolled_back:  # a reader rolls it back
                with contextlib.suppress(sqlite3.DatabaseError):  # damaged: read as it is
                    rolled_back.execute("SELECT count(*) FROM sqlite_master").fetchone()
            path = copy
        uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
        db = sqlite3.connect(uri, uri=True, factory=Budgeted)
        try:
            db.execute("PRAGMA writable_schema = ON")  # read a file shorter than its header says
            calls = iter(range(10**18))  # a damaged tree must not keep a query going for ever

            def spent() -> bool:
                db.cut_short = db.cut_short or next(calls) > _STEP_BUDGET // 1000
                return db.cut_short

            db.set_progress_handler(spent, 1000)
            yield db
        finally:
            db.close()


def column_names(db: Budgeted, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]


_TYPES = {"TEXT": (str,), "REAL": (int, float), "INTEGER": (int,)}


def table_rows(db: Budgeted, table: str) -> Iterator[tuple]:
    """The readable rows that fit the table's declared columns: a page read past the end of a
    cut file can decode as rows of garbage, which fail these checks."""
    info = list(db.execute(f"PRAGMA table_info({table})"))  # (cid, name, type, notnull, ...)
    for row in _scan(db, table):
        if len(row) == len(info) and all(
            (v is not None or not col[3])
            and (v is None or isinstance(v, _TYPES.get(col[2].upper(), (object,))))
            for v, col in zip(row, info)
        ):
            yield row


def _scan(db: Budgeted, table: str) -> Iterator[tuple]:
    """Every row of `table` that can be read, in rowid order, going past unreadable pages."""
    after, failed_at = _FIRST_ROWID, None
    for _ in range(_MAX_RESTARTS):
        try:
            for row in db.execute(
                f"SELECT rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid", (after,)
            ):
                if row[0] <= after:  # a damaged tree can lead back to rows already read
                    continue
                after = row[0]
                yield row[1:]
            return
        except sqlite3.DatabaseError:
            if db.cut_short:  # the budget, not damage: nothing more is read
                return
            if after == failed_at:  # no row since the last failure: that row cannot be read
                after += 1
            failed_at = after
            found = _next_readable(db, table, after)
            if found is None:
                return
            after = max(after, found - 1)


def _next_readable(db: Budgeted, table: str, after: int) -> int | None:
    """The first readable rowid past `after` found by looking 1, 2, 4, ... rowids further."""
    for bits in range(_MAX_SKIP_BITS):
        try:
            row = db.execute(
                f"SELECT rowid FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT 1",
                (after + 2**bits,),
            ).fetchone()
        except sqlite3.DatabaseError:
            continue
        return None if row is None else row[0]
    return None


@dataclass(frozen=True)
class Readable:
    """Rows per table that can still be read; with `cut_short`, reading stopped at its budget of
    SQLite steps, so there may be more."""

    rows: dict[str, int]
    cut_short: bool = False


def readable_rows(path: Path) -> Readable:
    """How many rows of each table can still be read (none when not even the schema can)."""
    rows: dict[str, int] = {}
    try:
        with open_damaged(path) as db:
            try:
                present = set(table_names(db))
                for table in (t for t in TABLES if t in present):
                    rows[table] = sum(1 for _ in table_rows(db, table))
            except sqlite3.DatabaseError:
                if not db.cut_short:  # damage, not the budget
                    raise
            return Readable(rows, db.cut_short)
    except sqlite3.DatabaseError:
        return Readable({})


def table_names(db: Budgeted) -> list[str]:
    return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
