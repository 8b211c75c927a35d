"""Measure one case in a fresh process, optionally under an address-space limit (RLIMIT_AS).

The parent (`run_isolated`) sends the case and settings as JSON on stdin and reads one result line
back. A fresh process per case keeps allocator caches and fragmentation of one case out of the next,
and a limit lets an oversized CPU case fail with an allocation error (status oom) instead of taking
the machine down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
from typing import Any

import torch

from ..plugins import child_environment, load_plugins
from .cases import BenchCase
from .limits import capped, vm_size_bytes
from .metrics import Metric
from .predict import Prediction
from .runner import DEFAULT_SETTINGS, CaseResult, MeasureSettings, measure_case
from .status import ERROR, OOM, TIMEOUT

MARKER = "@@zoo-result@@"
# Headroom over the limit for what a fresh interpreter maps lazily (thread stacks, malloc arenas).
RLIMIT_SLACK_BYTES = 512 * 2**20


def limit_address_space(limit_bytes: int) -> int:
    """Cap this process's address space at its current size + limit (+ slack), never above the
    limits it inherited (a process can lower them only); returns the cap."""
    cap = capped(vm_size_bytes() + limit_bytes + RLIMIT_SLACK_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return cap


def _settings_to_dict(settings: MeasureSettings) -> dict[str, Any]:
    d = dataclasses.asdict(settings)
    d["metrics"] = list(d["metrics"])
    return d


def _settings_from_dict(d: dict[str, Any]) -> MeasureSettings:
    return MeasureSettings(**{**d, "metrics": tuple(d["metrics"])})


def result_to_dict(r: CaseResult) -> dict[str, Any]:
    return {
        "status": r.status,
        "rows": [list(m) for m in r.rows],
        "error": r.error,
        "seconds": r.seconds,
        "facts": r.facts,
    }


def run_isolated(
    case: BenchCase,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    *,
    rlimit_bytes: int | None = None,
    timeout_s: float | None = None,
    predicted: Prediction | None = None,
) -> CaseResult:
    """Measure `case` in a subprocess; a crash, kill or timeout is a result, never an exception.

    The address-space limit guards host memory: a CPU case's worker sees no GPU (CUDA's start-up
    maps far more address space than any limit allows), and a CUDA case runs without the limit.
    predicted: the case's prediction made before the run, not made again."""
    on_cuda = torch.device(case.device).type == "cuda"
    payload = {
        "case": case.to_dict(),
        "settings": _settings_to_dict(settings),
        "rlimit_bytes": None if on_cuda else rlimit_bytes,
        "predicted": dataclasses.asdict(predicted) if predicted else None,
    }
    env = child_environment()
    if not on_cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "attention_zoo.measure.worker"],
            input=json.dumps(payload),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return CaseResult(
            case=case, status=TIMEOUT, error=f"killed after {timeout_s:g} s (--timeout)"
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            d = json.loads(line[len(MARKER) :])
            rows = [Metric(*r) for r in d["rows"]]
            return CaseResult(
                case=case,
                status=d["status"],
                rows=rows,
                error=d["error"],
                seconds=d["seconds"],
                facts=d.get("facts") or {},
            )
    tail = (proc.stderr or "").strip().splitlines()[-3:]
    if proc.returncode == -signal.SIGKILL:
        return CaseResult(
            case=case,
            status=OOM,
            error="worker killed by SIGKILL (most likely the kernel's out-of-memory killer)",
        )
    return CaseResult(
        case=case,
        status=ERROR,
        error=(
            f"worker exited with code {proc.returncode} and no result: "
            f"{' | '.join(tail) or '(no stderr)'}"
        ),
    )


def main() -> int:
    load_plugins()  # the parent's plugins, named in ZOO_IMPORT by child_environment()
    payload = json.loads(sys.stdin.read())
    if payload.get("rlimit_bytes"):
        limit_address_space(int(payload["rlimit_bytes"]))
    case = BenchCase.from_dict(payload["case"])
    known = payload.get("predicted")
    predicted = {case.key(): Prediction(**known)} if known else None
    result = measure_case(case, _settings_from_dict(payload["settings"]), predicted)
    sys.stdout.write(MARKER + json.dumps(result_to_dict(result)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    raise SystemExit(main())
