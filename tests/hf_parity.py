"""Parity of ReformerLM.from_hf(model) with transformers' ReformerModelWithLMHead.

Random-init HF models of tiny configs; streams, logits, loss and every parameter gradient compared.
`python -m tests.hf_parity` prints the errors per config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attention_zoo import ReformerLM, ReformerModel
from attention_zoo.attention.spec import get_backend


@dataclass(frozen=True)
class ParityCase:
    """One HF config (HF field names) and the inputs it is compared on."""

    name: str
    hf: dict[str, Any]
    eval_length: int  # odd lengths: HF pads to the chunk lengths' lcm in eval
    left_pad: int = 0  # masked positions at the start of the second sequence
    hf_fields: dict[str, Any] = field(default_factory=dict)


BASE: dict[str, Any] = {
    "vocab_size": 11,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "attention_head_size": 8,
    "feed_forward_size": 24,
    "is_decoder": True,
    "hidden_dropout_prob": 0.0,
    "local_attention_probs_dropout_prob": 0.0,
    "lsh_attention_probs_dropout_prob": 0.0,
    "axial_pos_shape": [4, 8],
    "axial_pos_embds_dim": [6, 10],
    "max_position_embeddings": 32,
    "local_attn_chunk_length": 4,
    "lsh_attn_chunk_length": 4,
    "axial_norm_std": 0.5,
}

CASES = [
    ParityCase("local-causal-axial", {"attn_layers": ["local", "local"]}, 13, left_pad=3),
    ParityCase(
        "lsh-causal-h1-b4",
        {"attn_layers": ["lsh"], "num_hashes": 1, "num_buckets": 4, "hash_seed": 3},
        15,
        left_pad=2,
    ),
    ParityCase(
        "local+lsh-causal-h2-b2x2",
        {"attn_layers": ["local", "lsh"], "num_hashes": 2, "num_buckets": [2, 4], "hash_seed": 5},
        13,
        left_pad=4,
    ),
    ParityCase(
        "lsh+local-table-h3-b2x2x2",
        {
            "attn_layers": ["lsh", "local", "lsh"],
            "num_hashes": 3,
            "num_buckets": [2, 2, 2],
            "hash_seed": 7,
            "axial_pos_embds": False,
        },
        11,
        left_pad=1,
    ),
    ParityCase(
        "lsh-h4-auto-buckets-chunks-6",
        {
            "attn_layers": ["lsh", "local"],
            "num_hashes": 4,
            "num_buckets": None,
            "hash_seed": 11,
            "lsh_attn_chunk_length": 8,
            "local_attn_chunk_length": 4,
            "lsh_num_chunks_before": 1,
            "num_attention_heads": 1,
        },
        19,
        left_pad=2,
    ),
]
ENCODER_CASES = [
    ParityCase(
        "local+lsh-bidirectional-h2-b[8]",
        {
            "attn_layers": ["local", "lsh"],
            "is_decoder": False,
            "num_hashes": 2,
            "num_buckets": [8],
            "hash_seed": 2,
            "local_num_chunks_after": 1,
            "lsh_num_chunks_after": 1,
        },
        13,
        left_pad=2,
    ),
]


TOLERANCE = {  # max relative error (max-norm) per quantity
    torch.float32: {"streams": 1e-5, "logits": 1e-5, "hidden": 1e-5, "loss": 1e-5, "grads": 1e-5},
    # HF computes its loss in float32 whatever the model's dtype: 1e-6 there
    torch.float64: {
        "streams": 1e-10,
        "logits": 1e-10,
        "hidden": 1e-10,
        "loss": 1e-6,
        "grads": 1e-10,
    },
}


def hf_semantics_missing(case: ParityCase) -> str | None:
    """Why this case cannot match HF yet: a core without semantics='hf' where HF's differs."""
    cfg = {**BASE, **case.hf}
    layers = set(cfg["attn_layers"])
    need = {"lsh"} & layers
    if "local" in layers and not cfg.get("is_decoder", False):
        need.add("local")  # HF's non-causal local windows wrap around; exact ones do not
    missing = sorted(b for b in need if "semantics" not in get_backend(b).defaults())
    if missing:
        return f"the {', '.join(missing)} core(s) have no semantics='hf' option yet"
    return None


def _relative(ours: Tensor, reference: Tensor) -> float:
    """max |ours - reference| / max |reference| (0 when both are 0)."""
    scale = reference.abs().max().item()
    diff = (ours.to(reference.dtype) - reference).abs().max().item()
    return diff / scale if scale else diff


def _lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Next-token cross-entropy, labels -100 ignored (HF's, without its float32 cast)."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def _inputs(case: ParityCase, n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """ids (2, n), attention_mask with case.left_pad masked positions in row 1, labels."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, BASE["vocab_size"], (2, n), generator=gen)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, : case.left_pad] = 0
    # A masked position predicts nothing: its own output is whatever a query with every key masked
    # gets (HF: the mean of its window), which is no real token's business.
    labels = ids.masked_fill(torch.nn.functional.pad(mask, (1, 0))[:, :-1] == 0, -100)
    labels[:, 0] = -100
    return ids, mask, labels


def _train_length(cfg: dict[str, Any]) -> int:
    """HF trains on whole chunks and, with axial positions, exactly prod(axial_pos_shape)."""
    if cfg.get("axial_pos_embds", True):
        return math.prod(cfg["axial_pos_shape"])
    chunks = [cfg[f"{b}_attn_chunk_length"] for b in set(cfg["attn_layers"])]
    multiple = math.lcm(*chunks)
    return cfg["max_position_embeddings"] // multiple * multiple


def _outputs(
    model: torch.nn.Module, case: ParityCase, probe: Tensor
) -> dict[str, Tensor | dict[str, Tensor]]:
    """One model's gradients (training mode, full length; named as ours) and its real tokens'
    streams, logits (or hidden states) and loss (eval mode, odd length, left-padded mask)."""
    from attention_zoo.hf_reformer import state_dict_from_hf

    cfg = {**BASE, **case.hf}
    lm, ours = cfg["is_decoder"], isinstance(model, (ReformerLM, ReformerModel))
    trunk = model.reformer if lm else model
    norm = trunk.norm if ours else trunk.encoder.layer_norm
    streams: list[Tensor] = []
    hook = norm.register_forward_pre_hook(lambda m, args: streams.append(args[0].detach()))

    def loss_of(ids: Tensor, mask: Tensor, labels: Tensor) -> Tensor:
        out = model(ids, attention_mask=mask)
        if lm:
            return _lm_loss(out.logits, labels)
        return (out.last_hidden_state * probe[:, : ids.shape[1]]).sum()

    device = next(model.parameters()).device
    ids, mask, labels = (t.to(device) for t in _inputs(case, _train_length(cfg), seed=1))
    model.train().zero_grad()
    loss_of(ids, mask, labels).backward()
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    if not ours:  # HF names -> ours (projections fused as in_proj)
        prefix = "" if lm else "reformer."
        backends = [
            "lsh" if hasattr(layer.attention.self_attention, "query_key") else "local"
            for layer in trunk.encoder.layers
        ]
        named = state_dict_from_hf({prefix + k: v for k, v in grads.items()}, backends)
        grads = {k.removeprefix(prefix): v for k, v in named.items()}
    ids, mask, labels = (t.to(device) for t in _inputs(case, case.eval_length, seed=2))
    real = mask.bool()
    with torch.no_grad():
        out = model.eval()(ids, attention_mask=mask, **({"labels": labels} if lm else {}))
    hook.remove()
    result: dict[str, Tensor | dict[str, Tensor]] = {
        "grads": grads,
        "streams": streams[-1][:, : case.eval_length][real],
    }
    if lm:
        result["logits"], result["loss"] = out.logits[real], out.loss
    else:
        result["hidden"] = out.last_hidden_state[real]
    return result


def _errors(ours: dict, reference: dict) -> dict[str, float]:
    """Relative errors per quantity; grads: the worst tensor, and all tensors on one scale."""
    errors = {k: _relative(v, reference[k]) for k, v in ours.items() if k != "grads"}
    ref = reference["grads"]
    errors["grads"] = max(_relative(ours["grads"][k], g) for k, g in ref.items())
    scale = max(g.abs().max().item() for g in ref.values())
    errors["grads_all"] = (
        max((ours["grads"][k].to(g.dtype) - g).abs().max().item() for k, g in ref.items()) / scale
    )
    return errors


def compare(
    case: ParityCase, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, Any]:
    """Relative errors of ReformerLM.from_hf(hf) against the HF model itself, at `dtype`, both on
    `device`.

    Training mode first (HF sizes num_buckets=None from its first batch, ours from
    max_position_embeddings: the same when that batch is full length, as HF's axial training
    demands): every parameter gradient at the full length. Then eval mode at an odd length (HF pads
    to whole chunks) with a left-padded attention_mask: streams, logits, loss of real tokens.
    """
    import warnings

    from transformers import ReformerConfig as HFConfig
    from transformers import ReformerModel as HFModel
    from transformers import ReformerModelWithLMHead

    from attention_zoo.hf_reformer import HFConversionWarning

    cfg = {**BASE, **case.hf}
    lm = cfg["is_decoder"]
    torch.manual_seed(0)
    hf = (ReformerModelWithLMHead if lm else HFModel)(HFConfig(**cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        ours = (ReformerLM if lm else ReformerModel).from_hf(hf).to(device, dtype)
    probe = torch.randn(2, 64, 2 * cfg["hidden_size"], dtype=dtype).to(device)  # encoders' loss
    errors: dict[str, Any] = _errors(
        _outputs(ours, case, probe), _outputs(hf.to(device, dtype), case, probe)
    )
    errors["grad_params"] = len([p for p in hf.parameters() if p.grad is not None])
    return errors


def report() -> None:
    """Print the parity errors of every case (max relative, max-norm) in float32 and float64."""
    columns = ("streams", "logits", "loss", "grads", "grads_all")
    print(f"{'case':34s} {'dtype':8s}" + "".join(f"{k:>10s}" for k in columns))
    for case in CASES + ENCODER_CASES:
        if reason := hf_semantics_missing(case):
            print(f"{case.name:34s} skipped: {reason}")
            continue
        for dtype in (torch.float32, torch.float64):
            e = compare(case, dtype)
            e["logits"] = e.get("logits", e.get("hidden"))
            cells = [e.get(k) for k in columns]
            print(
                f"{case.name:34s} {str(dtype).removeprefix('torch.'):8s}"
                + "".join(f"{c:10.1e}" if c is not None else f"{'-':>10s}" for c in cells)
            )


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors
    report()
