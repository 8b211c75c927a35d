"""On CUDA: every backend computes what it computes on the CPU, the residuals replay the GPU's RNG,
a model from Hugging Face matches transformers there, and a case is measured with CUDA events and
the allocator's peak. Skipped without a CUDA device (the gpu marker)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attention_zoo import ReformerLM, RunTarget
from attention_zoo.attention.inputs import Inputs
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK

from .contract import build, make_inputs, make_qkv, reference, variants, with_grads
from .hf_parity import (
    CASES,
    ENCODER_CASES,
    TOLERANCE,
    ParityCase,
    compare,
    hf_semantics_missing,
)
from .reformer_cases import tiny_config

pytestmark = pytest.mark.gpu

VARIANTS = variants()


def _modes(spec) -> list[bool]:
    return [c for c, ok in ((False, spec.caps.non_causal), (True, spec.caps.causal)) if ok]


def _on_cpu(variant, *, causal: bool) -> torch.nn.Module:
    """The same core on the CPU; a CUDA-only core is checked against its dense reference."""
    if variant.unsupported_reason_cpu() is None:
        return build(variant, causal=causal)
    if not variant.caps.exact:
        pytest.skip(f"{variant.id} runs on CUDA only and has no exact reference")
    return reference(variant, causal=causal)


def _same_rotations(gpu: torch.nn.Module, cpu: torch.nn.Module) -> None:
    """Seeded rotations are drawn by each device's own generator: give the GPU core the CPU's."""
    if hasattr(gpu, "rotations") and hasattr(cpu, "rotations"):

        def rotations(heads: int, d: int, nb: Any, device: torch.device, dtype: torch.dtype):
            return cpu.rotations(heads, d, nb, torch.device("cpu"), dtype).to(device)

        gpu.rotations = rotations


def _same_parameters(gpu: torch.nn.Module, cpu: torch.nn.Module) -> None:
    """Parameters drawn at build differ between two builds (each draws the next random numbers):
    give the GPU core the CPU core's."""
    if type(gpu) is type(cpu):
        gpu.load_state_dict(cpu.state_dict())


def _outputs_and_grads(attn: torch.nn.Module, shared: bool, inputs: Inputs):
    """The core's output and the gradients of every input, extras included (shared QK: k = q)."""
    names = list(inputs.extras)
    head = [inputs.q, inputs.v] if shared else [inputs.q, inputs.k, inputs.v]

    def call(*xs: torch.Tensor) -> torch.Tensor:
        qkv, extras = xs[: len(head)], dict(zip(names, xs[len(head) :]))
        return attn(qkv[0], qkv[0], qkv[1], **extras) if shared else attn(*qkv, **extras)

    return with_grads(call, [*head, *inputs.extras.values()])


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_every_backend_on_cuda_equals_cpu(variant) -> None:
    """Outputs and input gradients at an odd length (padding inside chunks), float32."""
    for causal in _modes(variant):
        if reason := variant.unsupported(RunTarget(device="cuda", dtype="float32", causal=causal)):
            pytest.skip(reason)
        x = make_inputs(variant, n=45)
        cpu = _on_cpu(variant, causal=causal)
        gpu = build(variant, causal=causal, device="cuda")
        _same_rotations(gpu, cpu)
        _same_parameters(gpu, cpu)
        shared = variant.caps.shared_qk
        on_gpu = Inputs(
            *(t.cuda() for t in (x.q, x.k, x.v)), {n: t.cuda() for n, t in x.extras.items()}
        )
        out_cpu, grads_cpu = _outputs_and_grads(cpu, shared, x)
        out_gpu, grads_gpu = _outputs_and_grads(gpu, shared, on_gpu)
        torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=2e-5, rtol=2e-5)
        for g_gpu, g_cpu in zip(grads_gpu, grads_cpu):
            torch.testing.assert_close(g_gpu.cpu(), g_cpu, atol=1e-4, rtol=1e-4)


EXACT = [v for v in VARIANTS if v.caps.exact]


@pytest.mark.parametrize("variant", EXACT, ids=[v.id for v in EXACT])
def test_bfloat16_on_cuda_stays_near_float32(variant) -> None:
    for causal in _modes(variant):
        if reason := variant.unsupported(RunTarget(device="cuda", dtype="bfloat16", causal=causal)):
            pytest.skip(reason)
        q, k, v = make_qkv(variant, n=300, d=64, device="cuda")
        attn = build(variant, causal=causal, device="cuda")
        want = attn(q, k, v)
        got = attn(q.bfloat16(), k.bfloat16(), v.bfloat16())
        assert got.dtype == torch.bfloat16
        # bfloat16 keeps 8 significant bits: rounded inputs move the scores, and so the weights,
        # by up to a few percent of the largest output
        error = (got.float() - want).abs().max() / want.abs().max()
        assert error < 3e-2, f"{variant.id}: bfloat16 relative error {error:.3g}"


def _loss_and_grads(model: ReformerLM, ids: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same CUDA dropout masks and LSH rotations in both runs
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mix", [("full", "shared-qk"), ("local", "lsh")], ids="+".join)
def test_reversible_backward_replays_cuda_dropout_exactly(mix: tuple[str, ...]) -> None:
    """float64 on CUDA, hidden and attention dropout on: recomputation gives autograd's grads."""
    cfg = tiny_config(
        attn_layers=mix,
        residual="reversible",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_hidden_layers=4,
    )
    model = ReformerLM(cfg).double().cuda().train()
    ids = torch.randint(0, cfg.vocab_size, (2, 23), device="cuda")
    loss_rev, grads_rev = _loss_and_grads(model, ids, seed=3)
    model.reformer.encoder.recompute = False  # the same network, plain autograd
    loss_ref, grads_ref = _loss_and_grads(model, ids, seed=3)
    torch.testing.assert_close(loss_rev, loss_ref, atol=1e-10, rtol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads_rev[name], grads_ref[name], atol=1e-8, rtol=0, msg=name)
    assert not torch.allclose(_loss_and_grads(model, ids, seed=4)[0], loss_ref)


@pytest.mark.parametrize("case", CASES + ENCODER_CASES, ids=lambda c: c.name)
def test_from_hf_matches_transformers_on_cuda(case: ParityCase) -> None:
    """float64 on the GPU: streams, logits, loss and every gradient equal transformers'."""
    if reason := hf_semantics_missing(case):
        pytest.skip(reason)
    errors = compare(case, torch.float64, device="cuda")
    assert errors["grad_params"] >= 10
    limits = TOLERANCE[torch.float64]
    bad = {k: errors[k] for k, limit in limits.items() if k in errors and errors[k] > limit}
    assert not bad, f"relative errors above tolerance on CUDA: {bad} (all: {errors})"


@pytest.mark.parametrize("mode", ["forward", "forward+backward", "train-step"])
def test_a_cuda_case_is_timed_and_its_peak_matches_the_prediction(mode: str) -> None:
    case = BenchCase(target="block", backend="full", seq_len=2048, device="cuda", mode=mode)
    settings = MeasureSettings(
        time_budget_s=0.05, metrics=("time", "memory", "predict"), min_repeats=3
    )
    result = measure_case(case, settings)
    assert result.status == OK, result.error
    assert result.value("time_median") > 0
    measured, predicted = result.value("peak_bytes"), result.value("predicted_peak_bytes")
    assert measured > 4 * 2048 * 2048 * 4  # the float32 score matrix of 4 heads at least
    assert 0.8 < measured / predicted < 1.25, (measured, predicted)
