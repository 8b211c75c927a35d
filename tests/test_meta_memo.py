"""The meta memo (measure/meta_memo.py): an operator repeated on the same meta inputs gives what
running it again would, tensors no input shares included, and predictions are the same with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from attention_zoo.measure import predict
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.meta_memo import FRESH, IN_PLACE, MetaMemo, memo_kind
from attention_zoo.measure.tracker import StorageTracker, tensors_in

aten = torch.ops.aten


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def layout(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.storage_offset(), t.untyped_storage().nbytes()


@pytest.mark.parametrize(
    "func,kind",
    [
        (aten.add.Tensor, FRESH),
        (aten.native_layer_norm.default, FRESH),  # three tensors
        (aten.add_.Tensor, IN_PLACE),
        (aten.clamp_.default, IN_PLACE),
        (aten.view.default, None),  # a view shares its input's storage
        (aten.add.out, None),  # writes an argument other than its first
        (aten.resize_.default, None),  # in place, but changes the shape (and the storage)
        (aten.unsqueeze_.default, None),
        (aten.uniform_.default, None),  # random numbers
        (aten.bernoulli.default, None),
        (aten._local_scalar_dense.default, None),  # returns a number
        (aten.sym_size.int, None),
    ],
)
def test_only_operators_whose_result_follows_from_their_inputs_are_kept(func, kind):
    assert memo_kind(func) == kind


def test_a_repeat_gets_new_tensors_of_the_first_results_layouts():
    x = torch.empty(4, 6, 8, device="meta").transpose(0, 1)  # strided: its layout matters
    y = torch.empty(8, device="meta")
    plain = torch.ops.aten.cat.default([x * y, x], 1)  # without the memo
    with MetaMemo() as memo:
        first = torch.ops.aten.cat.default([x * y, x], 1)
        again = torch.ops.aten.cat.default([x * y, x], 1)
    assert memo.repeats == 2  # the product and the concatenation
    assert layout(again) == layout(first) == layout(plain)
    assert again.untyped_storage()._cdata != first.untyped_storage()._cdata


def test_arguments_equal_as_numbers_but_of_other_types_are_not_one_key():
    ints = torch.empty(3, dtype=torch.long, device="meta")
    with MetaMemo() as memo:
        assert (ints + 1).dtype == torch.long
        assert (ints + 1.0).dtype == torch.float32
        assert (ints + True).dtype == torch.long
        assert (ints + 1.0).dtype == torch.float32
    assert memo.repeats == 1


def test_a_factory_without_a_dtype_takes_the_default_dtype_of_each_call():
    """A case is built under its own default dtype and steps under float32."""
    with MetaMemo() as memo:
        with _default_dtype(torch.bfloat16):
            assert torch.empty(64, device="meta").dtype == torch.bfloat16
        assert torch.empty(64, device="meta").dtype == torch.float32
        assert torch.empty(64, device="meta").dtype == torch.float32
    assert memo.repeats == 1


def test_outputs_a_tensor_made_from_a_layout_would_change_are_not_kept():
    """An undefined gradient (a layer norm without weights: None beside the input's gradient), a
    zero tensor's flag, a Parameter taken as the plain tensor it is to an operator."""
    x = torch.empty(4, 8, device="meta", requires_grad=True)
    with MetaMemo():
        for _ in range(2):
            torch.nn.functional.layer_norm(x, (8,)).sum().backward()
            assert x.grad.shape == x.shape
    zeros = torch.ops.aten._efficientzerotensor.default([3], device="meta")
    with MetaMemo() as memo:
        made = [torch.ops.aten._efficientzerotensor.default([3], device="meta") for _ in range(2)]
        assert [z._is_zerotensor() for z in made] == [True, True] and zeros._is_zerotensor()
        weight = torch.nn.Parameter(torch.empty(8, device="meta"))
        assert [(weight * 2).shape for _ in range(2)] == [(8,), (8,)]
    assert memo.repeats == 1


def test_an_in_place_repeat_returns_its_input_and_counts_no_memory():
    x = torch.empty(64, 64, device="meta")
    with MetaMemo() as memo, StorageTracker() as tracker:
        for _ in range(3):
            assert x.clamp_(0, 1) is x
    assert memo.repeats == 2 and tracker.allocations == 0 and tracker.peak == 0


def test_an_operator_that_returns_its_input_s_storage_is_never_kept():
    """_unsafe_view's schema declares no alias, yet its result is a view: kept, a repeat would
    count a new allocation the real operator never makes."""
    x = torch.empty(4, 1024, device="meta")
    with MetaMemo() as memo, StorageTracker() as tracker:
        for _ in range(3):
            out = aten._unsafe_view.default(x, [1024, 4])
            assert out.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert memo.repeats == 0 and tracker.allocations == 0


def test_tensors_off_meta_pass_through():
    """Inputs on the CPU, or none (a factory): the outputs hold values, computed each time."""
    x = torch.ones(3)
    with MetaMemo() as memo:
        assert torch.equal(x + 1, torch.full((3,), 2.0)) and torch.equal(x + 1, x + 1)
        assert [torch.arange(3).tolist() for _ in range(2)] == [[0, 1, 2]] * 2
        assert [torch.arange(3, device="meta").is_meta for _ in range(2)] == [True, True]
    assert memo.repeats == 1  # the second arange on meta


def test_tensors_in_finds_what_torch_s_pytree_finds():
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    value = (a, [1, None, (b, "x")], {"k": c, "n": 2.0}, torch.Size([2, 3]))
    leaves = torch.utils._pytree.tree_leaves(value)
    assert tensors_in(value) == [t for t in leaves if isinstance(t, torch.Tensor)]
    assert tensors_in(a) == [a] and tensors_in(1, None) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,target,dtype",
    [
        *[
            (b, "attention", "float32")
            for b in ("bigbird", "nsa", "lsh", "performer", "gated-deltanet", "sdpa", "local")
        ],
        ("local", "block", "bfloat16"),  # built under bf16, stepped under float32
        ("lsh", "model", "float16"),
    ],
)
def test_predictions_are_the_same_with_the_memo(backend, target, dtype, monkeypatch):
    """Index arithmetic (bigbird), in-place updates (nsa), sorting (lsh), a lazily drawn buffer
    (performer), a chunked recurrence, SDPA's CPU kernel: byte for byte and FLOP for FLOP."""
    case = BenchCase(
        target=target, backend=backend, seq_len=256, mode="forward+backward", dtype=dtype
    )
    with_memo = predict._shapes_step(case, "cpu", flops=True)
    monkeypatch.setattr(predict, "_cpu_on_meta", predict._cpu_sdpa_on_meta)
    assert predict._shapes_step(case, "cpu", flops=True) == with_memo
