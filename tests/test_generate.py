"""ReformerLM.generate: with the cache equal to without it, and token for token what transformers'
generate gives for a model loaded with from_hf (greedy and sampled, cache on and off)."""

from __future__ import annotations

import warnings

import pytest
import torch

from attention_zoo import ConfigError, ReformerConfig, ReformerLM
from attention_zoo.errors import InputError
from attention_zoo.hf_reformer import HFConversionWarning

from .hf_parity import BASE, CASES, ParityCase

OPTIONS = {
    "lsh": {"num_buckets": 4, "chunk_length": 4, "num_hashes": 2, "seed": 3},
    "local": {"chunk_length": 4},
    "sliding-window": {"window": 5, "global_tokens": 2},
    "bigbird": {"block_size": 4, "num_random_blocks": 1, "num_global_blocks": 1},
    "performer": {"nb_features": 16, "seed": 1},
    "full": {"kv_heads": 1},  # one key/value head shared by the layer's two query heads
    "retention": {"chunk_length": 4},
    "gla": {"chunk_length": 4},
    "gated-deltanet": {"chunk_length": 4, "negative_eigenvalues": True},
    "deltanet": {"chunk_length": 4},
    "moba": {"block_size": 4, "top_k": 2},
    "nsa": {"block_size": 4, "num_selected": 3, "window": 8},
}
MIXES = [
    ("sdpa", "local", "lsh", "linear"),
    ("sliding-window", "bigbird", "performer", "shared-qk"),
    ("full", "retention", "gla", "gated-deltanet"),
    ("deltanet", "sigmoid", "moba", "nsa"),
]


def _lm(layers: tuple[str, ...], residual: str, **fields) -> ReformerLM:
    config = ReformerConfig.from_dict(
        {
            "vocab_size": 13,
            "hidden_size": 16,
            "num_attention_heads": 2,
            "attention_head_size": 8,
            "feed_forward_size": 24,
            "is_decoder": True,
            "attn_layers": list(layers),
            "num_hidden_layers": 4,
            "residual": residual,
            "attn_options": {k: v for k, v in OPTIONS.items() if k in layers},
            "axial_pos_embds": False,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            **fields,
        }
    )
    torch.manual_seed(0)
    return ReformerLM(config).double().eval()


@pytest.mark.slow
def test_generating_with_the_cache_equals_recomputing_greedily():
    lm = _lm(MIXES[0], "reversible")
    ids = torch.randint(1, 13, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(lm.generate(ids, 8), lm.generate(ids, 8, use_cache=False))


@pytest.mark.slow  # about 15 s: each uncached token runs the forward again
@pytest.mark.parametrize("residual", ["standard", "reversible"])
@pytest.mark.parametrize("layers", MIXES, ids="+".join)
def test_generating_with_the_cache_equals_recomputing(layers, residual):
    """Every causal backend's decoding state, in both residual stacks: the same tokens as running
    the forward over the whole sequence for each one, greedy and sampled, a left-padded prompt
    too (float64)."""
    lm = _lm(layers, residual)
    ids = torch.randint(1, 13, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, :3] = False
    for kw in ({}, {"do_sample": True, "top_k": 5, "seed": 5}, {"attention_mask": mask}):
        cached = lm.generate(ids, 20, **kw)
        assert cached.shape == (2, 31)
        assert torch.equal(cached, lm.generate(ids, 20, use_cache=False, **kw)), kw


@pytest.mark.slow
@pytest.mark.parametrize("layers", MIXES, ids="+".join)
def test_generating_under_autocast_keeps_states_in_its_dtype(layers):
    """Under CPU autocast every layer's decoding state is bfloat16 (the dtype its steps compute
    in), and cached generation picks the tokens that recomputing the forward picks."""
    lm = _lm(layers, "standard").float()
    ids = torch.randint(1, 13, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        states = [layer.attention.init_state(2, 9) for layer in lm.reformer.layers]
        cached = lm.generate(ids, 12)
        recomputed = lm.generate(ids, 12, use_cache=False)
    assert {s.shape.dtype for s in states} == {torch.bfloat16}
    assert torch.equal(cached, recomputed)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [MIXES[0], MIXES[2]], ids="+".join)
def test_previous_token_embeddings_decode_as_the_forward(layers):
    """Each new token's previous-token embedding comes from the last token fed (the prompt's last
    included); a left-padded prompt's first real token has none, with the cache or without."""
    lm = _lm(layers, "standard", previous_token_embeddings=True)
    ids = torch.randint(1, 13, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :2] = False
    for kw in ({}, {"do_sample": True, "top_k": 5, "seed": 3}, {"attention_mask": mask}):
        assert torch.equal(lm.generate(ids, 9, **kw), lm.generate(ids, 9, use_cache=False, **kw))


def _hf_pair(case: ParityCase, **fields) -> tuple[torch.nn.Module, ReformerLM]:
    """HF's model of `case` (no eos) and ours from it. num_buckets=None becomes 4: HF sizes it
    from the first sequence it hashes (and cannot generate from a prompt within one chunk, the
    count unset), ours from max_position_embeddings."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = {**BASE, **case.hf, "eos_token_id": None, **fields}
    config["num_buckets"] = config.get("num_buckets") or 4
    torch.manual_seed(0)
    hf = transformers.ReformerModelWithLMHead(transformers.ReformerConfig(**config))
    hf = hf.double().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        return hf, ReformerLM.from_hf(hf).eval()


def _same_as_hf(hf, ours, ids, new: int, *, seed: int = 7, **kw) -> None:
    """HF's generate and ours from the same global RNG state: the same tokens."""
    for cache in (True, False):
        torch.manual_seed(seed)
        want = hf.generate(ids, max_new_tokens=new, use_cache=cache, pad_token_id=0, **kw)
        torch.manual_seed(seed)
        got = ours.generate(ids, new, use_cache=cache, **kw)
        assert torch.equal(got, want), f"use_cache={cache} {kw}: {got.tolist()} != {want.tolist()}"


@pytest.mark.slow
def test_generating_equals_transformers_for_local_attention():
    """A batch of two (HF's cached local attention keeps rows apart), greedy and sampled: with the
    draws seeded by `seed` as by torch.manual_seed before HF's."""
    hf, ours = _hf_pair(CASES[0])
    ids = torch.randint(1, BASE["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(3))
    _same_as_hf(hf, ours, ids, 10)
    torch.manual_seed(7)
    want = hf.generate(ids, max_new_tokens=10, do_sample=True, top_k=4, pad_token_id=0)
    assert torch.equal(ours.generate(ids, 10, do_sample=True, top_k=4, seed=7), want)


@pytest.mark.slow  # 8 generations of 20-30 tokens per case, HF's and ours
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("length", [3, 5, 13], ids=lambda n: f"prompt{n}")
def test_generating_equals_transformers(case, length):
    """Prompts shorter than a chunk, of one chunk and a bit, and several chunks (HF pads those to
    whole chunks, then forgets the padding): greedy and sampled (top-k, top-p, temperature), the
    cache on and off. HF's LSH rotations here come from the global RNG (hash_seed None), which
    both sides also sample from, so the draws interleave alike. One sequence per batch: with more,
    transformers' cached LSH step reads the first row's hidden states for every row (its
    `_get_relevant_hid_states_and_buckets` adds no batch offset), which we do not copy."""
    hf, ours = _hf_pair(case, hash_seed=None, max_position_embeddings=32)
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(1, BASE["vocab_size"], (1, length), generator=gen)
    new = 32 - length
    _same_as_hf(hf, ours, ids, new)
    _same_as_hf(hf, ours, ids, new, do_sample=True, top_k=6, top_p=0.8, temperature=0.7)


@pytest.mark.slow
def test_generation_stops_at_eos_as_transformers_does():
    """A sequence that produced eos_token_id goes on with padding; all done, generation stops."""
    hf, ours = _hf_pair(CASES[0])
    ids = torch.randint(1, BASE["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(3))
    free = ours.generate(ids, 20)
    eos = int(free[0, 7])  # a token the first row produces early
    want = hf.generate(ids, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    got = ours.generate(ids, 20, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, want) and (got[0, 8:] == 0).all()


def test_a_list_of_eos_ids_stops_as_transformers_does():
    """eos_token_id as a list stops a sequence at any of them."""
    hf, ours = _hf_pair(CASES[0])
    ids = torch.randint(1, BASE["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(3))
    free = ours.generate(ids, 20)
    eos = [int(free[0, 7]), int(free[1, 9])]  # tokens each row produces early
    want = hf.generate(ids, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    got = ours.generate(ids, 20, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, want), f"{got.tolist()} != {want.tolist()}"
    assert got.shape[1] < 25


def test_without_a_pad_id_finished_sequences_go_on_with_the_first_eos():
    """No pad_token_id given nor in the config: transformers pads a finished sequence with the
    first eos_token_id (HF's Reformer itself needs a pad id to pad a prompt, so ours alone)."""
    lm = _lm(("sdpa",), "standard", pad_token_id=None).eval()
    ids = torch.randint(1, 13, (2, 5), generator=torch.Generator().manual_seed(3))
    free = lm.generate(ids, 12, eos_token_id=None)
    eos = [int(free[0, 6]), 99]  # the first row's second new token; 99 never comes
    got = lm.generate(ids, 12, eos_token_id=eos)
    assert (got[0, 6:] == eos[0]).all() and torch.equal(got[:, :7], free[:, :7])


def test_generation_stops_at_the_checkpoints_own_eos_as_transformers_does():
    """An HF checkpoint's eos_token_id (HF's default is 2) ends generation here too, unasked;
    eos_token_id=None generates on."""
    probe, _ = _hf_pair(CASES[0])
    ids = torch.randint(1, BASE["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(3))
    eos = int(probe.generate(ids, max_new_tokens=20, pad_token_id=0)[0, 7])
    hf, ours = _hf_pair(CASES[0], eos_token_id=eos)
    want = hf.generate(ids, max_new_tokens=20, pad_token_id=0)
    got = ours.generate(ids, 20, pad_token_id=0)
    assert torch.equal(got, want) and (got[0, 8:] == 0).all()
    assert (ours.generate(ids, 20, eos_token_id=None)[0, 8:] != 0).any()


def test_a_generation_past_the_axial_grid_is_refused_before_the_first_token():
    """Axial position embeddings cover their grid's product (an HF checkpoint's may be smaller
    than max_position_embeddings): a generation past it is refused before it starts."""
    lm = _lm(("sdpa",), "standard", axial_pos_embds=True, axial_pos_shape=(4, 8),
             axial_pos_embds_dim=(8, 8), max_position_embeddings=64)  # fmt: skip
    with pytest.raises(InputError, match=r"the 32 positions of axial_pos_shape \(4, 8\)"):
        lm.generate(torch.randint(1, 13, (1, 30)), 10)
    assert lm.generate(torch.randint(1, 13, (1, 30)), 3).shape == (1, 33)


def test_generation_refuses_what_it_cannot_do():
    lm = _lm(("sdpa",), "standard")
    ids = torch.randint(1, 13, (1, 4))
    with pytest.raises(InputError, match="max_new_tokens"):
        lm.generate(ids, -1)
    with pytest.raises(ConfigError, match="top_p"):
        lm.generate(ids, 2, do_sample=True, top_p=0.0)
    with pytest.raises(ConfigError, match=r"model.eval\(\)"):
        lm.train().generate(ids, 2)
    assert lm.eval().generate(ids, 0).shape == (1, 4)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_generation_past_the_models_length_is_refused_before_the_first_token(use_cache):
    """A prompt and new tokens that need more positions than max_position_embeddings (64 here):
    refused with the most new tokens that fit, before the model has run once; at that most, the
    generation runs."""
    lm = _lm(("sdpa", "local"), "standard")
    ran = []
    lm.reformer.tokens.register_forward_hook(lambda *_: ran.append(1))
    ids = torch.randint(1, 13, (1, 60))
    with pytest.raises(
        InputError,
        match=r"60 tokens and 8 new tokens need 67 positions, more "
        r"than max_position_embeddings=64: generate at most 5 new tokens",
    ):
        lm.generate(ids, 8, use_cache=use_cache)
    assert not ran
    assert lm.generate(ids, 5, use_cache=use_cache).shape == (1, 65)


def _hf_padded_lm(*layers: str) -> ReformerLM:
    """A model whose first layer runs HF's local semantics: its prompts are padded to chunks."""
    lm = _lm(("local", *layers), "standard")
    lm.set_attention_options("local", semantics="hf")
    return lm


def test_a_prompt_padded_to_whole_chunks_is_forgotten_after_the_prefill():
    """HF pads a prompt to whole chunks: the states keep only its real positions (the KV caches,
    the sums and the LSH rings drop the padding), so the cache still equals recomputing."""
    ids = torch.randint(1, 13, (2, 10), generator=torch.Generator().manual_seed(2))  # 10 -> 12
    for layers in (("sdpa", "linear", "lsh"), ("retention", "gla", "gated-deltanet")):
        lm = _hf_padded_lm(*layers)  # the recurrences: padding left their states as they were
        assert torch.equal(lm.generate(ids, 6), lm.generate(ids, 6, use_cache=False)), layers


def test_a_window_that_cannot_forget_padding_says_so():
    lm = _hf_padded_lm("sliding-window")
    ids = torch.randint(1, 13, (1, 10))
    with pytest.raises(InputError, match="prefill without trailing padding"):
        lm.generate(ids, 3)
