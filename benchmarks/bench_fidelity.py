"""approx_error of every approximate backend's core against the dense reference, per input family
(seeded inputs: deterministic, so the gate compares it within the catalogue's tolerance).

The core alone, causal, float32, 4 heads of 64, CPU, at the suite's lengths; exact backends are n/a.
"""

from __future__ import annotations

from .common import LENGTHS, backend_names, case_for, tracks, use
from .common import setup as setup  # asv runs a module-level setup before every benchmark


class Fidelity:
    """Relative Frobenius error of the output against full (or shared-qk) attention."""

    params = (backend_names(), LENGTHS)
    param_names = ("backend", "seq_len")
    timeout = 300

    def setup(self, backend: str, seq_len: int) -> None:
        use("cpu")
        try:
            from attention_zoo.measure.fidelity import is_approximate, measure_fidelity
        except ImportError as exc:  # a commit from before approx_error (e.g. the gate's base)
            raise NotImplementedError(f"no approx_error at this commit ({exc})") from None
        case = case_for(device="cpu", target="attention", backend=backend, seq_len=seq_len)
        if not is_approximate(case):
            raise NotImplementedError(f"{backend!r} is exact: approx_error is for approximations")
        result = measure_fidelity(case)
        if result.note:
            raise NotImplementedError(result.note)
        self.errors = {r.metric: r.value for r in result.rows}

    @tracks("approx_error_random")
    def track_approx_error_random(self, *_: object) -> float:
        return self.errors["approx_error_random"]

    @tracks("approx_error_peaked")
    def track_approx_error_peaked(self, *_: object) -> float:
        return self.errors["approx_error_peaked"]
