"""What is known before a case runs: a named kernel that cannot compute it, a metric its
implementation cannot be measured with; and error text without raw object reprs."""

from __future__ import annotations

import pytest

from attention_zoo.errors import UsageError
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.metrics import MEASURE_GROUPS
from attention_zoo.measure.preflight import check_cases, refusal
from attention_zoo.measure.runner import describe_error


def _case(backend: str, **options: object) -> BenchCase:
    return BenchCase(target="block", backend=backend, seq_len=64, options=options)


def test_auto_and_runnable_named_kernels_pass():
    for case in (_case("linear"), _case("sdpa", kernel="math"), _case("local", kernel="math")):
        assert refusal(case, MEASURE_GROUPS) is None, case.name()


def test_a_named_kernel_that_cannot_run_is_refused_with_autos_pick():
    reason = refusal(_case("linear", kernel="fla"), MEASURE_GROUPS)
    assert reason is not None and "runs on cuda, not cpu" in reason
    assert reason.endswith("use kernel='auto' (picks scan)")


def test_flex_on_cpu_is_refused_only_with_the_metrics_it_cannot_be_measured_with():
    case = _case("local", kernel="flex")
    reason = refusal(case, ("time", "crosscheck"))
    assert reason is not None and "metrics crosscheck" in reason and "flex_attention" in reason
    assert "--metrics time," in reason and "picks cpu-fused" in reason
    assert refusal(case, ("time", "memory", "fidelity")) is None


def test_check_cases_names_one_case_and_counts_the_rest():
    cases = [_case("linear", kernel="fla").replace(seq_len=n) for n in (64, 128, 256)]
    with pytest.raises(UsageError, match=r"L=64 .* \(and 2 more cases\); nothing was run"):
        check_cases([_case("sdpa"), *cases], MEASURE_GROUPS)


def test_error_text_names_an_objects_class_not_its_address():
    class StorageTracker:
        pass

    text = describe_error(NotImplementedError(f"no rule for mode {StorageTracker()}."))
    assert text == "NotImplementedError: no rule for mode StorageTracker."
