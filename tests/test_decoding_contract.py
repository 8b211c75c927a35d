"""Decoding conformance: every causal backend that decodes, a plugin's too, is run token by token
against its own causal forward (attention/decode.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from attention_zoo import (
    AttentionCore,
    Capabilities,
    RunTarget,
    SelfAttention,
    build_attention,
    get_backend,
    register_attention,
)
from attention_zoo.attention import decode
from attention_zoo.attention.spec import BACKENDS
from attention_zoo.errors import InputError, OptionError, ShapeError

from .contract import (
    build,
    make_inputs,
    make_qkv,
    projected_in_bfloat16,
    small_options,
    variants,
)

SPECS = variants()
IDS = [s.id for s in SPECS]
# Where each chunk of the sequence goes: a prefill of 19 positions, a step of 3, then one token
# at a time to an odd length (37): windows, chunks and buckets are crossed mid-step.
CUTS = (0, 19, 22, *range(23, 38))


def _kind(spec) -> str:
    """How a Variant (or a BackendSpec: its defaults) decodes."""
    return decode.decoding_of(getattr(spec, "spec", spec), **getattr(spec, "options", {}))


def _decoders(kinds: tuple[str, ...]) -> list:
    return [s for s in SPECS if _kind(s) in kinds]


def _runs(spec, device: str = "cpu", dtype: str = "float64") -> None:
    if reason := spec.unsupported(RunTarget(device=device, dtype=dtype, causal=True)):
        pytest.skip(reason)


def _padding(b: int, n: int) -> torch.Tensor:
    """Left padding in one row (its first queries see no real key), a padded gap in another."""
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, :3] = False
    mask[0, 20:22] = False
    return mask


def decode_all(core, q, k, v, mask=None, *, recompute=False, extra=2, extras=None):
    """Outputs of the whole sequence decoded in CUTS' pieces, and the final state."""
    shape = decode.StateShape.of(q, k, v, q.shape[2] + extra)
    state = decode.init_state(core, shape, recompute=recompute)
    outs = []
    for s, e in itertools.pairwise(CUTS):
        part = None if mask is None else mask[:, s:e]
        more = {name: t[:, :, s:e] for name, t in (extras or {}).items()}
        out, state = decode.step(
            core, q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], state, part, **more
        )
        outs.append(out)
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_decoding_is_known_without_building(spec):
    """Every backend says how it decodes from its class and options alone; a cached one
    implements the contract, a bidirectional one decodes not at all."""
    kind = _kind(spec)
    assert kind in decode.DECODINGS
    cls = getattr(spec, "spec", spec).cls
    if not spec.caps.causal:
        assert kind == decode.NONE
    elif kind in (decode.CACHED, decode.CACHED_HF):
        assert callable(getattr(cls, "init_state", None)) and callable(getattr(cls, "step", None))
    else:
        assert kind == decode.RECOMPUTE and getattr(cls, "init_state", None) is None


EQUAL = _decoders((decode.CACHED, decode.RECOMPUTE))


@pytest.mark.parametrize("spec", EQUAL, ids=[s.id for s in EQUAL])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_prefill_and_steps_equal_the_causal_forward(spec, padded):
    """Prefill, a few tokens at once, then one at a time: every position's output equals the causal
    forward over the whole sequence (float64, same rotations and features), padding included;
    rows whose every visible key is padding have no defined output and are left out."""
    _runs(spec)
    core = build(spec, causal=True)
    x = make_inputs(spec, n=CUTS[-1], dtype=torch.float64)
    mask = _padding(2, CUTS[-1]) if padded else None
    out, state = decode_all(core, x.q, x.k, x.v, mask, extras=x.extras)
    ref = core(x.q, x.k, x.v, key_padding_mask=mask, **x.extras)
    torch.testing.assert_close(out[:, :, 3:], ref[:, :, 3:], atol=1e-10, rtol=1e-10)
    assert state.length == CUTS[-1]


@pytest.mark.parametrize("spec", EQUAL, ids=[s.id for s in EQUAL])
def test_a_sequence_shorter_than_a_block_decodes_with_default_options(spec):
    """The defaults' blocks, chunks and windows reach before position 0 when the whole sequence
    is shorter than one of them: steps still equal the causal forward."""
    _runs(spec)
    layout = get_backend(spec.name).layout(**spec.options)
    x = layout.sample(2, 3, 11, 16, dtype=torch.float64)
    seeded = {"seed": 0} if "seed" in spec.defaults() else {}
    core = build_attention(spec.name, causal=True, device="cpu", **seeded, **spec.options)
    shape = decode.StateShape.of(x.q, x.k, x.v, 11)
    state, outs = decode.init_state(core, shape), []
    for s, e in itertools.pairwise((0, 6, 7, 8, 9, 10, 11)):
        more = {name: t[:, :, s:e] for name, t in x.extras.items()}
        out, state = decode.step(
            core, x.q[:, :, s:e], x.k[:, :, s:e], x.v[:, :, s:e], state, None, **more
        )
        outs.append(out)
    ref = core(x.q, x.k, x.v, **x.extras)
    torch.testing.assert_close(torch.cat(outs, dim=2), ref, atol=1e-10, rtol=1e-10)


DECODERS = _decoders((decode.CACHED, decode.CACHED_HF, decode.RECOMPUTE))


@pytest.mark.parametrize("spec", DECODERS, ids=[s.id for s in DECODERS])
def test_a_block_decodes_under_autocast_as_in_its_dtype(spec):
    """Under autocast a block's state takes autocast's dtype and each step computes in it with
    autocast off: prefill and steps are those of the block with bfloat16 projections."""
    _runs(spec, dtype="bfloat16")
    torch.manual_seed(0)
    block = SelfAttention(32, 4, spec.name, causal=True, **small_options(spec))
    half = projected_in_bfloat16(block)
    x = torch.randn(2, CUTS[-1], 32)
    mask = _padding(2, CUTS[-1])
    outs: dict[str, list[torch.Tensor]] = {"autocast": [], "bfloat16": []}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state = block.init_state(2, CUTS[-1])
    assert state.shape.dtype == torch.bfloat16
    states = {"autocast": state, "bfloat16": half.init_state(2, CUTS[-1])}
    for s, e in itertools.pairwise(CUTS):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, states["autocast"] = block.step(x[:, s:e], states["autocast"], mask[:, s:e])
        outs["autocast"].append(out)
        out, states["bfloat16"] = half.step(x[:, s:e].bfloat16(), states["bfloat16"], mask[:, s:e])
        outs["bfloat16"].append(out)
    got, want = (torch.cat(o, dim=1) for o in outs.values())
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_a_step_computes_in_its_states_dtype():
    """A float32 state stepped under autocast computes in float32; a bfloat16 state (made under
    autocast) stepped outside it is refused in one line that says which state would do."""
    torch.manual_seed(0)
    block = SelfAttention(32, 4, "local", causal=True, chunk_length=8)
    x = torch.randn(2, 5, 32)
    want, _ = block.step(x, block.init_state(2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, state = block.step(x, block.init_state(2, 8, dtype=torch.float32))
        half = block.init_state(2, 8)
    assert state.shape.dtype == torch.float32 and got.dtype == torch.bfloat16  # out_proj's
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    refused = r"against a state made for torch\.bfloat16.*dtype=torch\.float32"
    with pytest.raises(ShapeError, match=refused):
        block.step(x, half)


HF = _decoders((decode.CACHED_HF,))


@pytest.mark.parametrize("spec", HF, ids=[s.id for s in HF])
def test_hf_decoding_runs_finite_and_keeps_the_prefill(spec):
    """Transformers' cached generation reads other windows than its forward (its parity is
    tests/test_generate.py); here: the prefill is the forward, and the steps are finite."""
    _runs(spec)
    core = build(spec, causal=True)
    q, k, v = make_qkv(spec, n=CUTS[-1], dtype=torch.float64)
    out, _ = decode_all(core, q, k, v)
    prefill = core(q[:, :, : CUTS[1]], k[:, :, : CUTS[1]], v[:, :, : CUTS[1]])
    torch.testing.assert_close(out[:, :, : CUTS[1]], prefill, atol=1e-12, rtol=1e-12)
    assert torch.isfinite(out).all()


STATEFUL = [s for s in _decoders((decode.CACHED, decode.CACHED_HF))]


@pytest.mark.slow
@pytest.mark.parametrize("spec", STATEFUL, ids=[s.id for s in STATEFUL])
def test_state_bytes_match_the_formula_and_the_meta_device(spec):
    """The state's bytes equal its backend's formula after prefill and steps, and the meta device
    (shapes only, any length) gives the same number."""
    _runs(spec, dtype="float32")
    _runs(spec, device="meta", dtype="float32")
    counted = []
    for device, n in (("cpu", 45), ("meta", 45), ("meta", 4099)):
        core = build(spec, causal=True, device=device)
        x = make_inputs(spec, b=1, h=2, n=n, d=16, device=device)
        shape = decode.StateShape.of(x.q, x.k, x.v, n + 2)
        out, state = (
            decode_all(core, x.q, x.k, x.v, extras=x.extras)
            if n == 45
            else decode.step(core, x.q, x.k, x.v, decode.init_state(core, shape), **x.extras)
        )
        assert out.device.type == device and out.shape[:2] == (1, 2)
        formula = core.state_bytes(shape)
        assert state.nbytes() == formula, f"{spec.id} on {device}, n={n}"
        counted.append(state.nbytes())
    assert counted[0] == counted[1]


BOUNDED = ("linear", "performer", "local", "sliding-window", "retention", "gla", "deltanet")


@pytest.mark.parametrize("name", BOUNDED)
def test_bounded_states_do_not_grow_with_the_context(name):
    """Running sums and windows: the same bytes at 100 and at 100 000 positions."""
    core = build(BACKENDS.get(name), causal=True)
    sizes = {core.state_bytes(decode.StateShape(1, 4, 64, n)) for n in (100, 100_000)}
    assert len(sizes) == 1


def test_a_plugin_core_recomputes_the_prefix_and_says_so():
    """A registered core without init_state decodes by its forward over the whole prefix."""

    @dataclass(frozen=True, kw_only=True)
    class _NoOptions:
        """No options."""

    @register_attention("decode-probe", config=_NoOptions, caps=Capabilities())
    class ProbeAttention(AttentionCore):
        """Causal full attention written out."""

        def attend(self, q, k, v, key_padding_mask):
            scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            n = q.shape[-2]
            future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, -1e9)
            if key_padding_mask is not None:
                scores = scores.masked_fill(~key_padding_mask[:, None, None, :], -1e9)
            return scores.softmax(-1) @ v

    try:
        spec = BACKENDS.get("decode-probe")
        assert decode.decoding_of(spec) == decode.RECOMPUTE
        test_prefill_and_steps_equal_the_causal_forward(spec, True)
        # the contract's own-state half is declared on AttentionCore and refuses, not missing
        with pytest.raises(NotImplementedError, match="keeps no decoding state of its own"):
            ProbeAttention(_NoOptions(), causal=True).state_bytes(decode.StateShape(1, 2, 8, 10))
    finally:
        BACKENDS.remove("decode-probe")


def variants_of(name: str):
    return next(s for s in variants() if s.id == name)


def test_recomputing_equals_a_backends_own_state():
    spec = variants_of("sdpa")
    core = build(spec, causal=True)
    q, k, v = make_qkv(spec, n=CUTS[-1], dtype=torch.float64)
    own, state = decode_all(core, q, k, v)
    again, kept = decode_all(core, q, k, v, recompute=True)
    torch.testing.assert_close(own, again, atol=1e-12, rtol=1e-12)
    assert type(kept).__name__ == "RecomputeState" and kept.nbytes() > state.nbytes()


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_bidirectional_backends_refuse_in_one_line(name):
    spec = variants_of(name)
    assert decode.decoding_of(spec.spec) == decode.NONE
    core = build(spec, causal=False)
    with pytest.raises(OptionError, match="bidirectional") as info:
        decode.init_state(core, decode.StateShape(1, 2, 8, 10))
    assert "\n" not in str(info.value)


def test_a_state_refuses_what_it_cannot_hold():
    spec = variants_of("sdpa")
    core = build(spec, causal=True)
    q, k, v = make_qkv(spec, b=1, h=2, n=5, d=8)
    state = decode.init_state(core, decode.StateShape(1, 2, 8, 4))
    with pytest.raises(InputError, match="max_length=4"):
        decode.step(core, q, k, v, state)
    with pytest.raises(ShapeError, match="heads"):
        decode.step(core, q[:, :1], k[:, :1], v[:, :1], state)
    with pytest.raises(OptionError, match="causal=True"):
        decode.init_state(build(spec, causal=False), decode.StateShape(1, 2, 8, 4))
