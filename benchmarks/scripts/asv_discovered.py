"""`python -m asv` with the suite's discovery read from a file that an earlier `asv run` saved
(its results folder's benchmarks.json), not rediscovered: `asv run` imports the whole suite in
the environment to discover it on every call, seconds each, and the gate's later rounds of one
side run the same code and suite as its first.

Usage: python asv_discovered.py DISCOVERY_JSON ASV_ARGUMENTS...
"""

from __future__ import annotations

import sys
from typing import Any

from asv import util
from asv.benchmarks import Benchmarks
from asv.main import main


def read_from(path: str) -> None:
    """Make asv's discovery return the benchmarks saved at `path`, selected as asv selects."""

    def discover(cls: type[Benchmarks], conf: Any, *_: Any, regex: Any = None, **__: Any):
        saved = util.load_json(path, api_version=cls.api_version)
        return cls(conf, saved.values(), regex=regex)

    Benchmarks.discover = classmethod(discover)


if __name__ == "__main__":
    read_from(sys.argv[1])
    sys.argv = ["asv", *sys.argv[2:]]
    main()
