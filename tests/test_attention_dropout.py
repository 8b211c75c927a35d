"""Attention-probability dropout (`dropout` option): active only in training mode, masks drawn from
the global RNG (so a replayed RNG state, as reversible and checkpointed layers replay it, draws
the same masks), and gradients equal to finite differences of the loss with the masks fixed."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from .contract import build, make_qkv, variants

DROPPING = [
    v for v in variants() if "dropout" in v.defaults() and v.unsupported_reason_cpu() is None
]


def _call(variant, attn, q, k, v):
    return attn(q, q if variant.caps.shared_qk else k, v)


@pytest.mark.parametrize("variant", DROPPING, ids=[v.id for v in DROPPING])
def test_dropout_is_active_only_in_training_and_follows_the_rng(variant):
    q, k, v = make_qkv(variant, b=1, h=2, n=37, dtype=torch.float64)
    attn = build(variant, causal=False, dropout=0.4)
    plain = build(variant, causal=False)
    plain.load_state_dict(attn.state_dict())  # a core with parameters (linformer): the same ones
    torch.testing.assert_close(_call(variant, attn.eval(), q, k, v), _call(variant, plain, q, k, v))
    attn.train()
    torch.manual_seed(1)
    first = _call(variant, attn, q, k, v)
    torch.manual_seed(1)
    torch.testing.assert_close(_call(variant, attn, q, k, v), first, atol=0, rtol=0)
    again = _call(variant, attn, q, k, v)  # the RNG moved on: other masks
    assert not torch.allclose(again, first)
    assert not torch.allclose(first, _call(variant, plain, q, k, v))


@pytest.mark.slow
@pytest.mark.parametrize("variant", DROPPING, ids=[v.id for v in DROPPING])
def test_dropout_gradients_equal_finite_differences_with_masks_fixed(variant):
    """float64: the masks are fixed by seeding the RNG before every evaluation."""
    q, k, v = make_qkv(variant, b=1, h=1, n=11, d=3, dtype=torch.float64)
    causal = variant.caps.causal  # causal where it runs so (the masks then reach fewer keys)
    attn = build(variant, causal=causal, dropout=0.3).train()
    inputs = (q, v) if variant.caps.shared_qk else (q, k, v)

    def loss(*args):
        torch.manual_seed(11)
        return attn(args[0], args[0], args[1]) if variant.caps.shared_qk else attn(*args)

    leaves = tuple(t.clone().requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(loss, leaves, eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("variant", DROPPING, ids=[v.id for v in DROPPING])
def test_checkpointed_recomputation_replays_the_masks(variant):
    """A checkpoint recomputes the forward in backward under the recorded RNG state: the same
    masks, so the same gradients as without it."""
    q, k, v = make_qkv(variant, b=1, h=2, n=37, dtype=torch.float64)
    attn = build(variant, causal=False, dropout=0.4).train()
    grads = []
    for wrapped in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def run(q, k, v):
            return _call(variant, attn, q, k, v)

        torch.manual_seed(3)
        out = checkpoint(run, *leaves, use_reentrant=False) if wrapped else run(*leaves)
        torch.randn(100)  # the RNG moves on before backward, as it does in training
        out.square().sum().backward()
        grads.append([t.grad for t in leaves if t.grad is not None])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_the_config_passes_attention_dropout_to_every_built_in_backend():
    from attention_zoo import ReformerConfig

    cfg = ReformerConfig(attention_probs_dropout_prob=0.1, attn_layers=("full", "local", "lsh"))
    for backend in ("full", "sdpa", "shared-qk", "local", "lsh"):
        assert cfg.attention_options(backend)["dropout"] == 0.1
