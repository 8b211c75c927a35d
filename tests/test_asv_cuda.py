"""The asv suite touches CUDA only inside a benchmark's own setup. asv's forkserver imports the
suite once and forks a process per benchmark; a process forked after its parent initialised CUDA,
or asked the CUDA driver for its devices (`torch.cuda.is_available()`), cannot use CUDA. Here,
on CPU, CUDA is faked as present and every call that would initialise it is recorded while the
suite is imported and discovered as asv does it, then in one CUDA benchmark's setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: an import-time call is only seen on the first import.
PROBE = r"""
import itertools, json, sys, traceback

import torch

phase, calls = "import and discovery", []


def recorded(name, result):
    def call(*args, **kwargs):
        stack = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]]
        calls.append({"phase": phase, "call": name, "stack": stack[-8:]})
        if isinstance(result, BaseException):
            raise result
        return result

    return call


# is_available asks the driver for its devices (cudaGetDeviceCount): forks after it cannot use
# CUDA. _lazy_init is where torch initialises CUDA, from Python and from C++ (a CUDA tensor).
torch.cuda.is_available = recorded("torch.cuda.is_available", True)
torch.cuda.device_count = recorded("torch.cuda.device_count", 1)
torch.cuda.init = recorded("torch.cuda.init", RuntimeError("fake CUDA: initialised"))
torch.cuda._lazy_init = recorded("torch.cuda._lazy_init", RuntimeError("fake CUDA: initialised"))

from asv_runner._aux import update_sys_path
from asv_runner.discovery import disc_benchmarks

root, name, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
update_sys_path(root)
# What asv's discovery and its forkserver's "preimport" run before any fork.
benchmarks = {b.name: b for b in disc_benchmarks(root)}
phase = "setup"
bench = benchmarks[name]
combos = [list(c) for c in itertools.product(*bench.params)]
bench.set_param_idx(combos.index(wanted))
try:
    bench.do_setup()  # module-level setup, then the class's setup, as asv's forked child runs them
    outcome = "ran"
except RuntimeError as exc:
    outcome = str(exc)
print(json.dumps({"benchmarks": sorted(benchmarks), "calls": calls, "setup": outcome}))
"""

CUDA_CASE = (
    "bench_attention.Time.time_step",
    ["'cuda'", "1", "'attention'", "'full'", "1024", "'forward'"],
)


def probe() -> dict:
    name, params = CUDA_CASE
    # the suite's import-time warm-up included, whatever a test set in this process
    env = {k: v for k, v in os.environ.items() if k != "ZOO_ASV_NO_WARMUP"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "benchmarks"), name, json.dumps(params)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_suite_touches_cuda_only_in_a_benchmarks_own_setup() -> None:
    found = probe()
    assert CUDA_CASE[0] in found["benchmarks"] and len(found["benchmarks"]) > 10
    early = [c for c in found["calls"] if c["phase"] != "setup"]
    assert not early, "CUDA touched while asv imports the suite, before it forks:\n" + "\n".join(
        f"{c['call']} from\n    " + "\n    ".join(c["stack"]) for c in early[:3]
    )
    # The fake sees CUDA where it is used: the CUDA benchmark's setup asks and initialises it.
    touched = {c["call"] for c in found["calls"] if c["phase"] == "setup"}
    assert "torch.cuda.is_available" in touched and "torch.cuda._lazy_init" in touched
    assert found["setup"] == "fake CUDA: initialised"
