"""Copy the rows a damaged results store still holds into a new store (`zoo results --recover`);
reading them is salvage.py's job."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .salvage import TABLES, column_names, open_damaged, table_names, table_rows
from .store import StoreError, is_ours, open_store


@dataclass(frozen=True)
class Recovered:
    """What came back: rows per table, and result rows whose case row was lost (kept in the new
    store, but `zoo results` and the report show only rows of a stored case)."""

    rows: dict[str, int]
    without_case: int
    cut_short: bool = False  # reading stopped at its budget of SQLite steps


def recover(path: str | Path, dest: str | Path) -> Recovered:
    """Write the readable rows of the store at `path` into a new store at `dest`.

    `path` is only read. StoreError when it is not one of ours, when `dest` exists, or when no
    row can be read (then nothing is written)."""
    path, dest = Path(path), Path(dest)
    if not path.is_file():
        raise StoreError(f"no results store at {path}")
    if not is_ours(path):
        raise StoreError(
            f"{path} is not an attention-zoo results store (its header does not say so); "
            "--recover reads only stores of ours"
        )
    if dest.exists():
        raise StoreError(f"{dest} exists; give --recover a new file name")
    try:
        with open_damaged(path) as db:
            present = set(table_names(db))
            tables = {
                t: (column_names(db, t), list(table_rows(db, t))) for t in TABLES if t in present
            }
            cut_short = db.cut_short
    except sqlite3.DatabaseError as err:
        raise StoreError(
            f"no row of {path} can be read (SQLite says: {err}); nothing was written"
        ) from None
    counts = {t: len(rows) for t, (_, rows) in tables.items()}
    if not sum(counts.values()):
        raise StoreError(f"no row of {path} can be read; nothing was written")
    with open_store(dest, write=True, flag="--recover") as store:
        store.import_rows(tables)
        cases = {(r["run_id"], r["case_key"]) for r in store.cases()}
    columns, rows = tables.get("results", ([], []))
    run, key = columns.index("run_id") if rows else 0, columns.index("case_key") if rows else 0
    lost = sum((row[run], row[key]) not in cases for row in rows)
    return Recovered(rows=counts, without_case=lost, cut_short=cut_short)
