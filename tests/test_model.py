"""ReformerModel / ReformerLM: exact reversible gradients, checkpoint = standard, causality."""

from __future__ import annotations

import re
import time

import pytest
import torch

from attention_zoo import (
    ConfigError,
    OptionError,
    ReformerConfig,
    ReformerLM,
    ReformerModel,
    ShapeError,
)
from attention_zoo.attention.spec import get_backend

from .reformer_cases import MIXES, RESIDUAL_NAMES, need, tiny_config

GRAD_MIXES = [("full", "shared-qk"), ("local", "lsh")]


def _loss_and_grads(model: ReformerLM, ids: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # same dropout masks and LSH rotations in both runs
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "mix",
    [GRAD_MIXES[0], pytest.param(GRAD_MIXES[1], marks=pytest.mark.slow)],  # local+lsh: ~2.5 s
    ids="+".join,
)
def test_reversible_gradients_equal_plain_autograd(mix: tuple[str, ...]) -> None:
    """float64, dropout 0.1, causal: recomputation in backward gives autograd's gradients."""
    cfg = tiny_config(
        attn_layers=mix, residual="reversible", hidden_dropout_prob=0.1, num_hidden_layers=4
    )
    model = ReformerLM(cfg).double().train()
    ids = torch.randint(0, cfg.vocab_size, (2, 23))
    loss_rev, grads_rev = _loss_and_grads(model, ids, seed=3)
    model.reformer.encoder.recompute = False  # same network, activations kept, plain autograd
    loss_ref, grads_ref = _loss_and_grads(model, ids, seed=3)
    torch.testing.assert_close(loss_rev, loss_ref, atol=1e-5, rtol=0)
    assert grads_rev.keys() == grads_ref.keys()
    for name in grads_ref:
        torch.testing.assert_close(grads_rev[name], grads_ref[name], atol=1e-5, rtol=0, msg=name)
    # dropout was really on: another seed changes the loss
    assert not torch.allclose(_loss_and_grads(model, ids, seed=4)[0], loss_ref)


@pytest.mark.parametrize("mix", GRAD_MIXES, ids="+".join)
def test_checkpoint_gradients_equal_standard(mix: tuple[str, ...]) -> None:
    ids = torch.randint(0, 13, (2, 19))
    results = {}
    for residual in ("standard", "checkpoint"):
        torch.manual_seed(0)
        model = ReformerLM(
            tiny_config(attn_layers=mix, residual=residual, hidden_dropout_prob=0.1)
        ).double()
        results[residual] = _loss_and_grads(model, ids, seed=5)
    (loss_s, grads_s), (loss_c, grads_c) = results["standard"], results["checkpoint"]
    torch.testing.assert_close(loss_c, loss_s, atol=1e-10, rtol=0)
    for name in grads_s:
        torch.testing.assert_close(grads_c[name], grads_s[name], atol=1e-10, rtol=0, msg=name)


@pytest.mark.parametrize("residual", RESIDUAL_NAMES)
@pytest.mark.parametrize("mix", MIXES, ids="+".join)
def test_causal_lm_never_sees_the_future(mix: tuple[str, ...], residual: str) -> None:
    """Changing every token from position t on leaves the logits before t unchanged.

    Train mode with grad on, so the reversible autograd Function runs; dropout off; each forward
    gets the same seed, so unseeded LSH draws the same rotations.
    """
    model = (
        ReformerLM(tiny_config(attn_layers=mix, residual=residual, num_hidden_layers=2))
        .double()
        .train()
    )
    n = 21  # not a multiple of the chunk length 4: padding inside local/lsh is exercised
    base = torch.randint(0, 13, (1, n))

    def logits(ids: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(11)
        return model(ids).logits

    reference = logits(base)
    for t in (1, 6, 13, 20):
        changed = base.clone()
        changed[:, t:] = (base[:, t:] + torch.randint(1, 13, (1, n - t))) % 13
        out = logits(changed)
        torch.testing.assert_close(out[:, :t], reference[:, :t], atol=1e-9, rtol=0, msg=f"t={t}")
        assert not torch.allclose(out[:, t:], reference[:, t:])  # the change is seen where allowed


@pytest.mark.parametrize("n", [1, 5, 32])
def test_any_length_up_to_the_limit(n: int) -> None:
    model = ReformerLM(tiny_config())
    ids = torch.randint(0, 13, (2, n))
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, n, 13) and out.hidden_states.shape == (2, n, 32)
    assert torch.isfinite(out.logits).all()


def test_too_long_names_the_limit() -> None:
    model = ReformerLM(tiny_config())
    with pytest.raises(
        ShapeError, match=re.escape("sequence length 33 is outside 1..max_position_embeddings=32")
    ):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_without_position_embeddings_only_the_tokens_tell_positions_apart() -> None:
    """position_embeddings=False: no position parameters, and bidirectional full attention, which
    sees no order of its own, is then permutation-equivariant (with positions it is not)."""
    ids, perm = torch.randint(0, 13, (2, 12)), torch.randperm(12)
    none = ReformerModel(tiny_config(is_decoder=False, position_embeddings=False)).eval()
    learned = ReformerModel(tiny_config(is_decoder=False)).eval()
    assert not list(none.positions.parameters()) and list(learned.positions.parameters())
    assert sum(p.numel() for p in learned.parameters()) - sum(
        p.numel() for p in none.parameters()
    ) == sum(p.numel() for p in learned.positions.parameters())
    for model, equivariant in ((none, True), (learned, False)):
        out = model(ids).last_hidden_state
        permuted = model(ids[:, perm]).last_hidden_state
        assert torch.allclose(permuted, out[:, perm], atol=1e-5) == equivariant


def test_without_position_embeddings_the_axial_fields_are_not_read_nor_exported() -> None:
    cfg = tiny_config(position_embeddings=False, axial_pos_embds_dim=(6, 11))  # sums to 17, not 16
    assert ReformerLM(cfg)(torch.zeros(1, 32, dtype=torch.long)).logits.shape == (1, 32, 13)
    with pytest.raises(ConfigError, match="position_embeddings must be true or false"):
        tiny_config(position_embeddings="none")
    with pytest.raises(ConfigError, match=r"always adds position embeddings.*position_embeddings"):
        tiny_config(
            attn_layers=["local"], residual="reversible", position_embeddings=False
        ).hf_fields()
    assert ReformerConfig.from_json(cfg.to_json()).position_embeddings is False


def test_loss_is_next_token_cross_entropy_with_ignore_index() -> None:
    model = ReformerLM(tiny_config())
    ids = torch.randint(0, 13, (2, 9))
    labels = ids.clone()
    labels[:, :4] = -100
    out = model(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, 3:-1].reshape(-1, 13), ids[:, 4:].reshape(-1)
    )
    torch.testing.assert_close(out.loss, expected)
    assert model(ids).loss is None


@pytest.mark.parametrize("mix", [("full", "shared-qk"), ("sdpa",), ("local",)], ids="+".join)
def test_padding_does_not_change_real_positions(mix: tuple[str, ...]) -> None:
    """A bidirectional model: right padding, masked, leaves the real positions' states alone."""
    model = ReformerModel(tiny_config(attn_layers=mix, is_decoder=False)).eval()
    ids = torch.randint(0, 13, (1, 10))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    mask = torch.arange(17)[None] < 10
    short = model(ids).last_hidden_state
    long = model(padded, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(long[:, :10], short, atol=1e-5, rtol=0)


def test_lm_needs_a_decoder() -> None:
    with pytest.raises(ConfigError, match="set is_decoder=True"):
        ReformerLM(tiny_config(is_decoder=False))


def test_crime_and_punishment_model_size_on_meta() -> None:
    """HF's google/reformer-crime-and-punishment ReformerModel (no LM head): 2,584,064 parameters
    with axial positions, 136,572,416 with a standard table (HF blog), LayerNorm over both streams
    included. full/shared-qk have the projection shapes of local/lsh, so they stand in here."""
    common = {
        "vocab_size": 320,
        "hidden_size": 256,
        "num_attention_heads": 2,
        "attention_head_size": 64,
        "num_hidden_layers": 6,
        "attn_layers": ("full", "shared-qk"),
        "feed_forward_size": 512,
        "is_decoder": True,
        "axial_pos_shape": (512, 1024),
        "axial_pos_embds_dim": (64, 192),
        "max_position_embeddings": 524_288,
    }
    counts = {}
    for axial in (True, False):
        with torch.device("meta"):
            model = ReformerModel(tiny_config(**common, axial_pos_embds=axial), device="meta")
        counts[axial] = sum(p.numel() for p in model.parameters())
    assert counts[True] == 2_584_064
    assert counts[False] == 136_572_416
    assert counts[False] - counts[True] == 134_217_728 - 229_376


def test_weights_move_between_residual_variants() -> None:
    ids = torch.randint(0, 13, (2, 11))
    models = [ReformerLM(tiny_config(residual=residual)).eval() for residual in RESIDUAL_NAMES]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    outs = [model(ids).logits for model in models]
    torch.testing.assert_close(outs[1], outs[0])  # checkpoint computes what standard computes
    assert not torch.allclose(
        outs[2], outs[0]
    )  # reversible is a different network on the same weights


# ---- evaluation-time attention changes -----------------------------------------------------------


def test_replace_attention_keeps_weights() -> None:
    model = ReformerLM(tiny_config(attn_layers=("full", "shared-qk"))).eval()
    ids = torch.randint(0, 13, (2, 12))
    before = model(ids).logits
    weight = model.reformer.layers[0].attention.in_proj.weight
    config = model.replace_attention("full", "sdpa")  # exact full attention either way
    assert model.config is config and config.layer_backends() == ["sdpa", "shared-qk", "sdpa"]
    assert model.reformer.layers[0].attention.in_proj.weight is weight
    torch.testing.assert_close(model(ids).logits, before, atol=1e-5, rtol=0)
    config = model.replace_attention([2], "full")
    assert config.attn_layers == ("sdpa", "shared-qk", "full")
    with pytest.raises(
        OptionError,
        match=r"projections \[q 16, v 16\]; 'full' with these options needs \[q 16, k 16, v 16\]"
        r".*shared-qk, lsh",
    ):
        model.replace_attention(1, "full")
    with pytest.raises(ConfigError, match="no layer uses backend 'lsh'"):
        model.replace_attention("lsh", "shared-qk")


def test_set_attention_options_rebuilds_cores_and_config() -> None:
    model = ReformerLM(tiny_config(attn_layers=("sdpa", "full")))
    config = model.set_attention_options("sdpa", kernel="math")
    assert config.attn_options == {"sdpa": {"kernel": "math"}}
    assert [layer.attention.core.cfg.kernel for layer in model.reformer.layers[::2]] == [
        "math",
        "math",
    ]
    with pytest.raises(OptionError, match="it takes: kernel"):
        model.set_attention_options("sdpa", kernal="math")


def test_set_attention_options_that_change_the_inputs_update_or_refuse() -> None:
    """Options that change the block's inputs: other projections (fewer KV heads) are refused,
    nothing changed; the same projections under another squash (step sizes in (0, 2)) take
    effect; a core's learned parameters stay when only its options change."""
    ids = torch.randint(0, 13, (1, 10))
    model = ReformerLM(tiny_config(attn_layers=("full",))).eval()
    with pytest.raises(OptionError, match=r"'full' with these options needs \[q 16, k 8, v 8\]"):
        model.set_attention_options("full", kv_heads=1)
    assert model.config.attn_options == {} and model(ids).logits.isfinite().all()
    model = ReformerLM(tiny_config(attn_layers=("gated-deltanet",), is_decoder=True)).eval()
    before = model(ids).logits
    model.set_attention_options("gated-deltanet", negative_eigenvalues=True)
    again = ReformerLM(model.config).eval()
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(ids).logits, again(ids).logits)  # as if built so
    assert not torch.allclose(model(ids).logits, before)
    model = ReformerLM(tiny_config(attn_layers=("differential",), is_decoder=True)).eval()
    core = model.reformer.layers[0].attention.core
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.5)
    learned = {k: v.clone() for k, v in core.state_dict().items()}
    model.set_attention_options("differential", kernel="math")
    kept = model.reformer.layers[0].attention.core.state_dict()
    assert kept.keys() == learned.keys() and all(torch.equal(kept[k], learned[k]) for k in kept)


def test_lsh_layers_switch_hashes_and_to_full_shared_qk() -> None:
    need("lsh")
    model = ReformerLM(tiny_config(attn_layers=("lsh",), num_hidden_layers=1)).eval()
    ids = torch.randint(0, 13, (2, 16))
    model.set_attention_options("lsh", num_hashes=8)
    assert model.reformer.layers[0].attention.core.cfg.num_hashes == 8
    model.replace_attention("lsh", "shared-qk")
    assert model.config.attn_layers == ("shared-qk",)
    assert torch.isfinite(model(ids).logits).all()


# ---- it learns ---------------------------------------------------------------------------------


def _copy_batch(batch: int, half: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences 0 w 0 w (the paper's duplication task); loss only on the second copy of w."""
    w = torch.randint(1, vocab, (batch, half - 1))
    zero = torch.zeros(batch, 1, dtype=torch.long)
    ids = torch.cat([zero, w, zero, w], dim=1)
    labels = ids.clone()
    labels[:, : half + 1] = -100
    return ids, labels


@pytest.mark.slow  # 300 Adam steps: ~5 s with full attention
@pytest.mark.long
@pytest.mark.parametrize("mix", [("full",), ("local", "lsh")], ids="+".join)
def test_learns_a_tiny_copy_task(mix: tuple[str, ...]) -> None:
    cfg = tiny_config(
        attn_layers=mix,
        hidden_size=32,
        axial_pos_embds_dim=(16, 16),
        num_attention_heads=2,
        num_hidden_layers=2,
        feed_forward_size=64,
        vocab_size=8,
        residual="reversible",
        local_attn_chunk_length=8,
        lsh_attn_chunk_length=8,
        num_hashes=2,
        num_buckets=4,
    )
    model = ReformerLM(cfg)
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead, and much more on a busy box
    try:
        start, end, seconds = _train(model, optim, cfg.vocab_size)
    finally:
        torch.set_num_threads(threads)
    assert seconds < 60
    assert end < 0.5 * start, (start, end)  # chance level is log(7) = 1.95


def _train(
    model: ReformerLM, optim: torch.optim.Optimizer, vocab: int
) -> tuple[float, float, float]:
    """Loss on a fixed batch before and after 300 Adam steps, and the CPU seconds they took (at one
    thread: what other processes on the machine cannot inflate)."""
    eval_ids, eval_labels = _copy_batch(64, 8, vocab)
    with torch.no_grad():
        start = model(eval_ids, labels=eval_labels).loss.item()
    began = time.process_time()
    for _ in range(300):
        ids, labels = _copy_batch(16, 8, vocab)
        loss = model(ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.eval()
    with torch.no_grad():
        end = model(eval_ids, labels=eval_labels).loss.item()
    return start, end, time.process_time() - began


# ---- padding and attention dropout -------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_padding_never_changes_real_outputs_with_automatic_buckets(causal: bool) -> None:
    """num_buckets=None is sized from max_position_embeddings, never from the padded batch: the
    same real tokens give the same outputs whatever the batch is padded to, whoever shares it."""
    need("lsh")
    cfg = tiny_config(
        attn_layers=("lsh",), num_buckets=None, is_decoder=causal, hash_seed=1, num_hidden_layers=2
    )
    model = ReformerModel(cfg).eval()
    ids = torch.randint(1, 13, (1, 13))
    alone = model(ids).last_hidden_state
    for total in (16, 29):  # chunk-padded 16 and 32: 8 and 16 buckets under a per-batch rule
        padded = torch.nn.functional.pad(ids, (0, total - 13))
        mask = (torch.arange(total) < 13)[None]
        out = model(padded, attention_mask=mask).last_hidden_state[:, :13]
        torch.testing.assert_close(out, alone, atol=1e-5, rtol=0, msg=f"padded to {total}")
    # next to a left-padded sequence in one batch
    neighbour_mask = torch.ones(1, 13, dtype=torch.long)
    neighbour_mask[:, :5] = 0
    batch = torch.cat([ids, torch.randint(1, 13, (1, 13))])
    mask = torch.cat([torch.ones(1, 13, dtype=torch.long), neighbour_mask])
    torch.testing.assert_close(
        model(batch, attention_mask=mask).last_hidden_state[:1], alone, atol=1e-5, rtol=0
    )


def _need_attention_dropout(*backends: str) -> None:
    need(*[b for b in backends if b in ("local", "lsh")])
    missing = [b for b in backends if "dropout" not in get_backend(b).defaults()]
    if missing:
        pytest.skip(f"the {', '.join(missing)} core(s) have no 'dropout' option yet")


@pytest.mark.parametrize("mix", GRAD_MIXES, ids="+".join)
def test_attention_dropout_replays_in_the_reversible_backward(mix: tuple[str, ...]) -> None:
    """float64, attention dropout 0.2 and hidden dropout 0.1: the reversible backward recomputes
    every layer with the forward's masks, so its gradients are plain autograd's."""
    _need_attention_dropout(*mix)
    cfg = tiny_config(
        attn_layers=mix,
        residual="reversible",
        attention_probs_dropout_prob=0.2,
        hidden_dropout_prob=0.1,
        num_hidden_layers=4,
        hash_seed=2,  # fixed rotations: only dropout draws from the RNG
    )
    model = ReformerLM(cfg).double().train()
    ids = torch.randint(0, cfg.vocab_size, (2, 23))
    loss_rev, grads_rev = _loss_and_grads(model, ids, seed=3)
    model.reformer.encoder.recompute = False
    loss_ref, grads_ref = _loss_and_grads(model, ids, seed=3)
    torch.testing.assert_close(loss_rev, loss_ref, atol=1e-10, rtol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads_rev[name], grads_ref[name], atol=1e-9, rtol=0, msg=name)
    # attention dropout alone changes the loss from one seed to the next
    model = ReformerLM(cfg.replace(hidden_dropout_prob=0.0)).double().train()
    assert not torch.allclose(
        _loss_and_grads(model, ids, seed=4)[0], _loss_and_grads(model, ids, seed=5)[0]
    )
    with torch.no_grad():
        model.eval()
        torch.manual_seed(4)
        first = model(ids, labels=ids).loss
        torch.manual_seed(5)
        torch.testing.assert_close(model(ids, labels=ids).loss, first)  # no dropout in eval


@pytest.mark.parametrize("residual", ["reversible", "checkpoint"])
def test_dropout_gradients_are_finite_differences_with_masks_fixed(residual: str) -> None:
    """d loss / d theta along random directions, float64, every dropout mask fixed by the seed."""
    mix = ("local", "lsh")
    _need_attention_dropout(*mix)
    cfg = tiny_config(
        attn_layers=mix,
        residual=residual,
        attention_probs_dropout_prob=0.2,
        hidden_dropout_prob=0.1,
        num_hidden_layers=2,
        hash_seed=2,
    )
    torch.manual_seed(0)
    model = ReformerLM(cfg).double().train()
    ids = torch.randint(0, cfg.vocab_size, (2, 19))
    params = [p for p in model.parameters() if p.requires_grad]

    def loss() -> torch.Tensor:
        torch.manual_seed(9)  # the same dropout masks in every evaluation
        return model(ids, labels=ids).loss

    model.zero_grad()
    loss().backward()
    grads = [p.grad.clone() for p in params]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
        analytic = sum((g * v).sum() for g, v in zip(grads, direction)).item()
        eps = 1e-6
        with torch.no_grad():
            for p, v in zip(params, direction):
                p.add_(v, alpha=eps)
            up = loss().item()
            for p, v in zip(params, direction):
                p.add_(v, alpha=-2 * eps)
            down = loss().item()
            for p, v in zip(params, direction):
                p.add_(v, alpha=eps)
        numeric = (up - down) / (2 * eps)
        assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-8)


def test_previous_token_embeddings_add_the_token_before_each_real_one() -> None:
    """Position j gets tokens[ids[j]] + previous_tokens[ids[j - 1]] + positions[j]; the first
    position, and one after padding, get no previous token; the option adds one table."""
    cfg = tiny_config(previous_token_embeddings=True, hidden_dropout_prob=0.0)
    model = ReformerModel(cfg).eval()
    assert ReformerModel(cfg.replace(previous_token_embeddings=False)).previous_tokens is None
    ids = torch.tensor([[3, 5, 7, 9]])
    mask = torch.tensor([[False, True, True, True]])
    got = model.embed(ids, mask)
    tokens, previous = model.tokens.weight, model.previous_tokens.weight
    positions = model.positions(4)[0]
    want = tokens[ids[0]] + positions
    want[2:] += previous[ids[0, 1:3]]
    torch.testing.assert_close(got[0], want)
    before = (torch.tensor([11]), torch.tensor([True]))
    torch.testing.assert_close(model.embed(ids[:, 1:], start=1, before=before)[0, 0],
                               tokens[5] + previous[11] + positions[1])  # fmt: skip
    padding = (torch.tensor([11]), torch.tensor([False]))  # the token before was padding
    torch.testing.assert_close(model.embed(ids[:, 1:], mask[:, 1:], start=1, before=padding)[0],
                               want[1:])  # fmt: skip
    real = (torch.tensor([11]), None)  # None: real
    torch.testing.assert_close(model.embed(ids[:, 1:], mask[:, 1:], start=1, before=real)[0, 0],
                               tokens[5] + previous[11] + positions[1])  # fmt: skip
