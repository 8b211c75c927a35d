"""Peak memory of the chunked backends' fused paths, in units of one (batch, length, hidden) tensor.

These bounds are what make `local` and `lsh` cheaper than the Hugging Face implementations (the
targets: a half and a third of HF's peak at 16k); memory is deterministic, so they are exact
regression tests, measured with the profiler like every CPU memory number here.
"""

from __future__ import annotations

import pytest
import torch

from attention_zoo import SelfAttention
from attention_zoo.measure.memory import profiled_peak

pytestmark = pytest.mark.slow  # profiled blocks at 4096-8192 tokens: 3-8 s each
HIDDEN = 256


def _peaks(backend: str, length: int, **options) -> tuple[float, float]:
    """(forward+backward, forward-only) peak of a causal SelfAttention block, in units."""
    torch.manual_seed(0)
    block = SelfAttention(HIDDEN, 4, backend, causal=True, chunk_length=64, **options)
    x = torch.randn(1, length, HIDDEN)

    def train_step() -> None:
        block(x).sum().backward()

    def forward() -> None:
        with torch.no_grad():
            block(x)

    train_step()  # parameter gradients exist from here on, as in training
    unit = length * HIDDEN * x.element_size()
    return (
        profiled_peak(train_step)[1].peak_bytes / unit,
        profiled_peak(forward)[1].peak_bytes / unit,
    )


def test_local_backward_holds_inputs_gradients_and_a_bounded_scratch():
    """q, k, v + incoming gradient + dq, dk, dv = 7 units; the output is not kept for backward
    and the segment scratch is at most 6 MiB (1 unit = 8 MiB here)."""
    train_step, forward = _peaks("local", 8192)
    assert train_step <= 7 + 6 / 8 + 0.1, train_step
    assert forward <= 7, forward


def test_lsh_backward_works_one_hash_round_at_a_time():
    """The backward's working set is one round's, so with 4 or 8 hashes the forward (all rounds
    in one fused pass) is the peak; the forward costs about 5.5 units per round."""
    for hashes in (4, 8):
        train_step, forward = _peaks("lsh", 4096, num_hashes=hashes, num_buckets=128, seed=0)
        assert train_step <= forward * 1.001, (hashes, train_step, forward)
        assert forward <= 5.5 * hashes + 2, (hashes, forward)
    one_round, _ = _peaks("lsh", 4096, num_hashes=1, num_buckets=128, seed=0)
    assert one_round <= 17, one_round
