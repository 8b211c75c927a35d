"""kernels/exp.py: exp and log-sum-exp through exp2 agree with torch's own on the values attention
scores take (masked, far below their row's maximum, -inf rows), outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from attention_zoo.attention.kernels.exp import exp, exp_, logsumexp
from attention_zoo.attention.kernels.masks import mask_value


def _scores(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g, dtype=dtype) * 30  # spans far below each row's max
    x[0, :, 8:] = mask_value(dtype)  # masked keys
    x[1, 2] = mask_value(dtype)  # a query that sees no key
    x[2, 3] = float("-inf")  # a row of -inf
    x[2, 4, :4] = float("-inf")
    return x


# rtol: one float32 product's rounding (|x| log2 e ulps) in float32, under float64's; 16-bit
# dtypes take the product in float32, so their results round once, as torch.exp's
RTOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


@pytest.mark.parametrize("dtype", list(RTOL))
def test_exp_matches_torch_exp_with_exact_zeros_where_it_underflows(dtype: torch.dtype) -> None:
    x = _scores(torch.float64)
    top = x.amax(-1, keepdim=True)
    x = (x - torch.where(torch.isfinite(top), top, 0)).to(dtype)  # <= 0, as in a softmax
    want = torch.exp(x.double())
    tiny = torch.finfo(dtype).tiny
    for got in (exp(x), exp_(x.clone())):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=RTOL[dtype], atol=tiny)
        assert (got[x < -1e3] == 0).all()  # masked scores give exactly 0


def test_logsumexp_matches_torch_with_its_gradient_and_keepdim() -> None:
    x = _scores().requires_grad_()
    want = torch.logsumexp(x, dim=-1)
    got = logsumexp(x, dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)  # -inf rows stay -inf
    assert logsumexp(x, dim=1, keepdim=True).shape == (3, 1, 16)
    finite = torch.isfinite(want)
    (g_want,) = torch.autograd.grad(want[finite].sum(), x)
    (g_got,) = torch.autograd.grad(got[finite].sum(), x)
    rows = finite[..., None].expand_as(x)  # torch's gradient is NaN on a row of -inf; ours 0
    # atol: torch's own gradient on a row at the mask value (-1e9) is off by its 1e-9 rounding
    torch.testing.assert_close(g_got[rows], g_want[rows], rtol=1e-12, atol=1e-8)
    assert torch.equal(g_got[~rows], torch.zeros_like(g_got[~rows]))


def test_logsumexp_keeps_a_nan_a_nan() -> None:
    x = torch.tensor([[0.0, float("nan")], [0.0, mask_value(torch.float32)]])
    got = logsumexp(x)
    assert got[0].isnan() and got[1] == 0
