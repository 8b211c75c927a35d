"""pytest-benchmark switches itself off under xdist, which the project's addopts turn on: the
micro-benchmarks run in one process, timed one at a time."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.option.numprocesses = 0
    config.option.dist = "no"
