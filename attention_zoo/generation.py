"""Autoregressive generation for ReformerLM, as transformers' `generate` does it: a prefill of the
prompt, then one token at a time, each layer's attention reading its decoding state
(attention/decode.py); greedy, or sampled with HF's temperature, top-k and top-p warpers and one
multinomial draw per token. Without the cache every token runs the forward over the whole sequence
(HF's use_cache=False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention.decode import DecodeState
from .blocks.layer import PreNorm
from .blocks.residual import ReversibleResidual
from .errors import ConfigError, InputError


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How the next token is chosen (HF's GenerationConfig names and defaults)."""

    do_sample: bool = False  # False: the most likely token (greedy)
    temperature: float = 1.0  # logits divided by it before sampling
    top_k: int | None = 50  # sample among the k most likely tokens (None or 0: all)
    top_p: float = 1.0  # ... and among the fewest whose probabilities sum to top_p
    seed: int | None = None  # seeds the draws (a generator of its own); None: torch's global RNG

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ConfigError(f"temperature must be > 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ConfigError(f"top_k must be None or an int >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")

    def pick(self, logits: Tensor, generator: torch.Generator | None) -> Tensor:
        """The next token (b,) from the last position's float32 logits (b, vocab)."""
        if not self.do_sample:
            return logits.argmax(-1)
        scores = logits / self.temperature if self.temperature != 1.0 else logits
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]))[0][..., -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            drop = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            drop[..., -1:] = False  # the most likely token always stays
            scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
        probs = F.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def generate(
    lm: nn.Module,  # a ReformerLM
    input_ids: Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    *,
    use_cache: bool = True,
    attention_mask: Tensor | None = None,
    prompt_padding: int = 0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
) -> Tensor:
    """input_ids (b, n) followed by up to max_new_tokens tokens each: (b, n + new). The prompt's
    attention_mask (b, n) bool; prompt_padding: positions the model appends to it (HF pads to
    whole chunks), forgotten after the prefill. A sequence that produced eos_token_id (or one of
    a list) is continued with pad_token_id (the config's, else the first eos, as HF); all of them
    done, generation stops."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise InputError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise InputError(
            f"input_ids must be (batch, length >= 1), got shape {tuple(input_ids.shape)}"
        )
    if use_cache and lm.training:
        raise ConfigError(
            "generate with the cache runs the model for inference: call model.eval() first "
            "(or generate with use_cache=False)"
        )
    eos = None if eos_token_id is None else torch.as_tensor(eos_token_id, device=input_ids.device)
    if eos is not None:
        eos = eos.flatten()
        if pad_token_id is None:
            pad_token_id = lm.config.pad_token_id
        if pad_token_id is None:
            pad_token_id = int(eos[0])
    generator = None
    if sampling.seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(sampling.seed)
    ids, mask = input_ids, attention_mask
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    with torch.no_grad():
        states = None
        if use_cache and max_new_tokens:
            states = _Cache(lm, ids.shape[0], ids.shape[1] + prompt_padding, max_new_tokens)
        for i in range(max_new_tokens):
            if states is None:
                logits = lm(ids, attention_mask=mask).logits[:, -1]
            else:
                prompt = i == 0
                new = ids if prompt else ids[:, -1:]
                logits = states.logits(new, mask if prompt else None, prompt_padding * prompt)
            token = sampling.pick(logits.float(), generator)
            if eos is not None:
                token = torch.where(done, pad_token_id, token)
                done = done | torch.isin(token, eos)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            if eos is not None and bool(done.all()):
                break
    return ids


class _Cache:
    """Every layer's decoding state, fed the prompt, then one token at a time."""

    def __init__(self, lm: nn.Module, batch: int, prompt: int, max_new_tokens: int) -> None:
        """States for `batch` prompts of `prompt` positions (with their padding) and the new
        tokens fed back (the last one never is)."""
        self.lm, self.model = lm, lm.reformer
        length = max(prompt, prompt + max_new_tokens - 1)
        self.states = [layer.attention.init_state(batch, length) for layer in self.model.layers]
        # the last token fed and whether it is real (previous-token embeddings read it)
        self.last: tuple[Tensor, Tensor | None] | None = None

    def logits(self, ids: Tensor, mask: Tensor | None, pad: int) -> Tensor:
        """The next-token logits (b, vocab) after feeding ids (b, t): the prompt with `pad`
        positions of padding appended (then forgotten), or one new token."""
        b, t = ids.shape
        start = self.states[0].length
        if pad:
            pad_id = self.model.config.pad_token_id
            ids = F.pad(ids, (0, pad), value=0 if pad_id is None else pad_id)
            real = ids.new_ones(b, t, dtype=torch.bool) if mask is None else mask
            mask = F.pad(real, (0, pad), value=False)
        hidden = decode_stack(self.model, ids, self.states, mask, start, self.last)[:, t - 1]
        self.last = (ids[:, t - 1], None if mask is None else mask[:, t - 1])
        if pad:
            self.states = [s.truncated(start + t) for s in self.states]
        return self.lm.lm_head(hidden)


def decode_stack(
    model: nn.Module,
    ids: Tensor,
    states: list[DecodeState],
    mask: Tensor | None,
    start: int,
    before: tuple[Tensor, Tensor | None] | None = None,
) -> Tensor:
    """The model's output (b, t, 2 * hidden) for ids (b, t) at positions start.. (before: the
    tokens fed before them and whether each is real, as ReformerModel.embed), every layer's
    attention a decoding step: `states` are replaced by the states after it."""
    x = model.embed(ids, mask, start=start, before=before)
    reversible = isinstance(model.encoder, ReversibleResidual)
    y1 = y2 = x
    for i, layer in enumerate(model.layers):
        if reversible:  # Y1 = X1 + f(X2), Y2 = X2 + g(Y1)
            out, states[i] = _attend(layer.f, y2, states[i], mask)
            y1 = y1 + out
            y2 = y2 + layer.g(y1)
        else:  # x + f(x), then + g
            out, states[i] = _attend(layer.f, y1, states[i], mask)
            y1 = y1 + out
            y1 = y2 = y1 + layer.g(y1)
    return model.out_dropout(model.norm(torch.cat([y1, y2], dim=-1)))


def _attend(
    f: PreNorm, x: Tensor, state: DecodeState, mask: Tensor | None
) -> tuple[Tensor, DecodeState]:
    """PreNorm(SelfAttention) as a decoding step: dropout(attention.step(LayerNorm(x)))."""
    out, state = f.fn.step(f.norm(x), state, mask)
    return f.dropout(out), state
