"""What one measurement is (`BenchCase`) and how to build it into a runnable step on a device.

Targets: an attention core alone on (q, k, v); the `SelfAttention` block around it (projections from
(b, n, hidden)); a whole model: `ReformerLM`, or `ReformerForSequenceClassification` when not
causal. Modes: `forward` (inference, no autograd graph), `forward+backward` (loss = sum of outputs,
or the model's loss; gradients cleared after each step), `train-step` (forward+backward and an AdamW
step). Every step leaves no gradients behind, so each call starts from the same resident state and
repeated calls measure the same thing. Generation, on a causal core (attention/decode.py):
`prefill` (the prompt of seq_len tokens into an empty decoding state, made for seq_len +
new_tokens positions) and `decode` (one generated token against the prefilled state; after
new_tokens of them the state goes back to the prefilled one, so every call decodes at a context
of seq_len to seq_len + new_tokens).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import decode
from ..attention.inputs import Inputs, gaussian
from ..attention.spec import RunTarget, build_attention, get_backend
from ..blocks.attention import SelfAttention
from ..config import ReformerConfig
from ..declarative import check_count, checked_dataclass
from ..errors import ConfigError, UnavailableError
from ..model import ReformerForSequenceClassification, ReformerLM
from .peers import get_peer, is_peer

TARGETS = ("attention", "block", "model")
DECODE_MODES = ("prefill", "decode")  # generation: a core's decoding state (attention/decode.py)
MODES = ("forward", "forward+backward", "train-step", *DECODE_MODES)
# how a decode case decodes: the backend's own decoding, or the whole prefix recomputed per token
DECODERS = ("own", "recompute")
MODEL_CASE_LAYERS = 6  # layers of a model case whose model does not set num_hidden_layers
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True, kw_only=True)
class BenchCase:
    """One measured configuration; `to_dict()` is what the store keeps with every row."""

    target: str = (
        "attention"  # attention (core on q, k, v), block (SelfAttention), model (ReformerLM)
    )
    backend: str = (
        "full"  # registry name; for a model whose `model` sets attn_layers, their '+' join
    )
    seq_len: int = 1024
    batch: int = 1
    num_heads: int = 4
    head_dim: int = 64
    hidden: int = 256  # block/model width; the attention target ignores it
    causal: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"  # forward, forward+backward, train-step, prefill, decode
    new_tokens: int = 0  # prefill/decode: tokens generated after the seq_len-token prompt
    decoder: str = "own"  # prefill/decode: own (the backend's decoding) or recompute
    options: dict[str, Any] = field(default_factory=dict)  # backend options
    model: dict[str, Any] = field(default_factory=dict)  # ReformerConfig fields (target model)
    label: str = ""  # a short name for tables (e.g. the model preset's name); not part of the key
    peer: str = ""  # a peer backend's package and version ("transformers 5.23.0"); filled in
    note: str = ""  # what a peer computes differently (filled in); not part of the key

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not one of: {', '.join(TARGETS)}")
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not one of: {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not one of: {', '.join(DTYPES)}")
        for name in ("seq_len", "batch", "num_heads", "head_dim", "hidden"):
            check_count(getattr(self, name), name)
        if self.target == "attention" and self.mode == "train-step":
            raise ConfigError(
                "mode 'train-step' needs parameters to update; an attention core alone has none. "
                "Use target 'block' or 'model', or mode 'forward+backward'"
            )
        self._check_decoding()
        if is_peer(self.backend):
            spec = get_peer(self.backend)
            object.__setattr__(self, "peer", self.peer or spec.provenance())
            object.__setattr__(self, "note", self.note or spec.note)

    def _check_decoding(self) -> None:
        """ConfigError unless new_tokens and decoder fit the mode."""
        if self.decoder not in DECODERS:
            raise ConfigError(f"decoder {self.decoder!r} is not one of: {', '.join(DECODERS)}")
        tokens = self.new_tokens
        check_count(tokens, "new_tokens", minimum=0)
        if self.mode not in DECODE_MODES:
            if tokens or self.decoder != "own":
                raise ConfigError(
                    f"new_tokens and decoder describe generation: use mode prefill or decode, "
                    f"not {self.mode!r}"
                )
            return
        if self.target != "attention" or not self.causal:
            raise ConfigError(
                f"mode {self.mode!r} measures a causal attention core's decoding state: use "
                "target 'attention' with causal=true (ReformerLM.generate decodes a whole model)"
            )
        if self.mode == "decode" and tokens < 1:
            raise ConfigError("mode 'decode' needs new_tokens >= 1 (tokens per decoded stretch)")

    # ---- identity and serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), sort_keys=True))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchCase:
        return checked_dataclass(cls, data, where="BenchCase", noun="field")

    def key(self) -> str:
        """Stable identity of what is measured (label and note excluded): the store's case key."""
        data = self.to_dict()
        data.pop("label")
        data.pop("note")
        if not data["peer"]:
            data.pop("peer")  # our own backends keep the keys they had before peers existed
        for name, default in (("new_tokens", 0), ("decoder", "own")):
            if data[name] == default:
                data.pop(name)  # cases that do not generate keep the keys they had before
        return case_key(data)

    def name(self) -> str:
        """Short human-readable description for progress bars and errors."""
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        what = self.label or self.backend
        if self.target == "model":
            extra = [
                f"{k}={self.model[k]}"
                for k in (
                    "residual",
                    "num_hidden_layers",
                    "chunk_size_feed_forward",
                    "axial_pos_embds",
                )
                if k in self.model
            ]
            what += f"({','.join(extra)})" if extra else ""
        mode = self.mode
        if mode in DECODE_MODES:
            recompute = " recompute" if self.decoder == "recompute" else ""
            mode = f"{mode}(+{self.new_tokens}{recompute})"
        return (
            f"{self.target}:{what}{'[' + opts + ']' if opts else ''} "
            f"L={self.seq_len} b={self.batch} "
            f"{mode} {self.dtype} {self.device}"
        )

    def replace(self, **changes: Any) -> BenchCase:
        return dataclasses.replace(self, **changes)

    # ---- what can run ----------------------------------------------------------------------

    def backends(self) -> list[str]:
        """Registry names this case uses."""
        if self.target == "model" and "attn_layers" in self.model:
            layers = self.model["attn_layers"]
            return list(dict.fromkeys([layers] if isinstance(layers, str) else layers))
        return [self.backend]

    def unsupported(self, device: str | None = None) -> str | None:
        """Why this case cannot run on `device` (default: its own), or None."""
        device = device or self.device
        for name in self.backends():
            if is_peer(name):
                if reason := get_peer(name).unsupported(self):
                    return reason
                continue
            reason = get_backend(name).unsupported(
                RunTarget(device=torch.device(device).type, dtype=self.dtype, causal=self.causal)
            )
            if reason:
                return reason
            if self.mode in DECODE_MODES:
                spec = get_backend(name)
                if decode.decoding_of(spec, **self.options) == decode.NONE:
                    return decode.refusal(name)
        return None

    def attention_shape(self) -> tuple[int, int]:
        """(query heads, head size) the case's attention runs with: a model case's overrides
        (num_attention_heads, attention_head_size, hidden_size) included."""
        if self.target != "model":
            return self.num_heads, self.head_dim
        config = self.reformer_config()
        return config.num_attention_heads, config.head_size

    def reformer_config(self) -> Any:
        """The ReformerConfig of a model case (imports the model lazily)."""
        fields = {
            "hidden_size": self.hidden,
            "num_attention_heads": self.num_heads,
            "attention_head_size": self.head_dim,
            "is_decoder": self.causal,
            "attn_layers": [self.backend],
        }
        if self.options:
            fields["attn_options"] = {self.backend: dict(self.options)}
        if "num_hidden_layers" not in self.model:  # a fixed depth, whatever attn_layers lists
            layers = self.model.get("attn_layers", ())
            fields["num_hidden_layers"] = max(
                MODEL_CASE_LAYERS, 1 if isinstance(layers, str) else len(layers)
            )
        if not {"axial_pos_embds", "axial_pos_shape", "max_position_embeddings"} & set(self.model):
            fields.update(_auto_positions(self.seq_len, self.model.get("hidden_size", self.hidden)))
        fields.update(self.model)
        return ReformerConfig.from_dict(fields)


# Fields that name what is compared; every other field must match for two cases to be compared.
VARIANT_FIELDS = ("backend", "options", "label", "peer", "note")


def comparison_key(config: dict[str, Any]) -> str:
    """What must match for two cases to be compared: everything but the mechanism (JSON text)."""
    return json.dumps(
        {k: v for k, v in config.items() if k not in VARIANT_FIELDS}, sort_keys=True, default=str
    )


def case_key(config: dict[str, Any]) -> str:
    """sha1 of the canonical JSON of `config` (sorted keys), 16 hex digits."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _auto_positions(seq_len: int, hidden: int) -> dict[str, Any]:
    """Axial positions just large enough for `seq_len` (so any length works without a 2nd table)."""
    n1 = 2 ** math.ceil(math.log2(seq_len) / 2)
    n2 = math.ceil(seq_len / n1)
    d1 = min(64, hidden // 4) or 1
    return {
        "axial_pos_embds": True,
        "axial_pos_shape": [n1, n2],
        "axial_pos_embds_dim": [d1, hidden - d1],
        "max_position_embeddings": n1 * n2,
    }


# ---- building a case into a runnable step ---------------------------------------------------


@dataclass
class Runnable:
    """A built case: `step()` runs one call of the case's mode and returns nothing; `output()`
    one forward returning what the target returns (its contract is checked in validate.py)."""

    case: BenchCase
    module: nn.Module | None
    inputs: tuple[Tensor, ...]
    step: Callable[[], None]
    optimizer: torch.optim.Optimizer | None = None
    # keyword-only: code that builds a Runnable positionally (case, module, inputs, step,
    # optimizer) keeps its meaning, and code that leaves it out fails loudly, never unchecked
    output: Callable[[], Tensor] = field(kw_only=True)
    # prefill/decode: the decoding state now (alive between decode steps; its bytes are a metric)
    state: Callable[[], decode.DecodeState] | None = field(default=None, kw_only=True)
    # a step whose host work comes apart from its kernels for a CUDA graph: (host, kernels),
    # host() then kernels() doing what step() does; None: the step is all kernels
    split: tuple[Callable[[], None], Callable[[], None]] | None = field(default=None, kw_only=True)

    def parts(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """(host work, kernels) of one step: a captured step records the kernels once and runs
        the host work before each replay."""
        return self.split or (_nothing, self.step)

    def resident_bytes(self) -> int:
        """Bytes of everything alive between steps: parameters, buffers, inputs, optimizer state,
        a decode case's state."""
        tensors: list[Tensor] = list(self.inputs)
        if self.state is not None and self.case.mode == "decode":
            tensors += self.state().tensors()
        if self.module is not None:
            tensors += list(self.module.parameters()) + list(self.module.buffers())
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                tensors += [t for t in state.values() if isinstance(t, Tensor)]
        seen: dict[int, int] = {}
        for t in tensors:
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
        return sum(seen.values())


def build_runnable(case: BenchCase, device: str | torch.device | None = None) -> Runnable:
    """Build `case` on `device` (default: its own); under a FakeTensorMode this allocates nothing.

    Raises UnavailableError when a backend cannot run there.
    """
    device = torch.device(device or case.device)
    if reason := case.unsupported(device.type):
        raise UnavailableError(reason)
    dtype = DTYPES[case.dtype]
    if case.mode in DECODE_MODES:
        return _build_decoding(case, device, dtype)
    builders = {"attention": _build_attention, "block": _build_block, "model": _build_model}
    return builders[case.target](case, device, dtype)


@contextmanager
def _defaults(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create modules directly on `device` in `dtype` (no .to(): FakeTensors cannot be swapped)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            yield
    finally:
        torch.set_default_dtype(old)


def _clear(tensors: list[Tensor]) -> None:
    for t in tensors:
        t.grad = None


def _make_step(
    case: BenchCase, forward: Callable[[], Tensor], leaves: list[Tensor], optimizer: Any = None
) -> Callable[[], None]:
    if case.mode == "forward":

        def step() -> None:
            with torch.no_grad():
                forward()

        return step

    def step() -> None:
        loss = forward()
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        _clear(leaves)

    return step


def sample_inputs(
    case: BenchCase,
    device: torch.device,
    dtype: torch.dtype,
    *,
    length: int | None = None,
    requires_grad: bool = False,
) -> Inputs:
    """Random inputs of the case's backend as its input layout declares them (inputs.py), for
    `length` positions (default: the case's)."""
    layout = get_backend(case.backend).layout(**case.options)
    n = case.seq_len if length is None else length
    return layout.sample(
        case.batch,
        case.num_heads,
        n,
        case.head_dim,
        dtype=dtype,
        device=device,
        requires_grad=requires_grad,
    )


def _build_attention(case: BenchCase, device: torch.device, dtype: torch.dtype) -> Runnable:
    with _defaults(device, dtype):
        core = build_attention(case.backend, causal=case.causal, device=device.type, **case.options)
    x = sample_inputs(case, device, dtype, requires_grad=case.mode != "forward")
    leaves = x.leaves()

    def output() -> Tensor:
        return core(x.q, x.k, x.v, **x.extras)

    def forward() -> Tensor:
        return output().sum()

    return Runnable(case, core, leaves, _make_step(case, forward, list(leaves)), output=output)


def _build_block(case: BenchCase, device: torch.device, dtype: torch.dtype) -> Runnable:
    with _defaults(device, dtype):
        if is_peer(case.backend):  # another library's module, built where ours would be
            spec = get_peer(case.backend)
            block = spec.build(case, spec.make_options(**case.options))
        else:
            block = SelfAttention(
                case.hidden,
                case.num_heads,
                case.backend,
                head_size=case.head_dim,
                causal=case.causal,
                device=device.type,
                **case.options,
            )
    x = gaussian((case.batch, case.seq_len, case.hidden), device=device, dtype=dtype)
    params = list(block.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4) if case.mode == "train-step" else None

    def forward() -> Tensor:
        return block(x).sum()

    step = _make_step(case, forward, params, optimizer)
    return Runnable(case, block, (x,), step, optimizer, output=lambda: block(x))


def _build_decoding(case: BenchCase, device: torch.device, dtype: torch.dtype) -> Runnable:
    """prefill: the prompt into a new state, every call; decode: one token per call against a
    state prefilled here (untimed), set back to the prefilled state after new_tokens tokens (a
    state that only appends, a KV cache, is simply its prefilled self again; others are copied
    back from a snapshot, at one call in new_tokens)."""
    with _defaults(device, dtype):
        core = build_attention(case.backend, causal=True, device=device.type, **case.options)
    core.eval()
    b, h, n, d = case.batch, case.num_heads, case.seq_len, case.head_dim
    layout = core.layout
    kv, dv = layout.kv_heads_for(h), d * layout.expand_v
    shape = decode.StateShape(b, h, d, n + case.new_tokens, dtype, device, kv, dv)
    recompute = case.decoder == "recompute"

    def prefill(prompt: Inputs) -> tuple[Tensor, decode.DecodeState]:
        empty = decode.init_state(core, shape, recompute=recompute)
        with torch.no_grad():
            return decode.step(core, prompt.q, prompt.k, prompt.v, empty, **prompt.extras)

    if case.mode == "prefill":
        prompt = sample_inputs(case, device, dtype)
        kept: list[decode.DecodeState] = []

        def run() -> Tensor:
            out, state = prefill(prompt)
            kept[:] = [state]
            return out

        state = lambda: kept[0] if kept else prefill(prompt)[1]  # noqa: E731
        return Runnable(case, core, prompt.leaves(), _discard(run), output=run, state=state)
    # decode: the prompt is consumed here; the state, the new tokens and a snapshot stay resident
    first = prefill(sample_inputs(case, device, dtype))[1]
    new = sample_inputs(case, device, dtype, length=case.new_tokens)
    snapshot = None if first.appends_only else [t.clone() for t in first.tensors()]
    now = {"state": first, "i": 0}
    # a captured step's: the state in a form it can replay (on the same buffers; what that form
    # adds, such as a count of positions on the device, is set back with it) and its token
    graphed = decode.capturable_state(core, first)
    kept = first.tensors()
    ids = {id(t) for t in kept}
    added = [(t, t.clone()) for t in (graphed.tensors() if graphed else ()) if id(t) not in ids]
    position = torch.zeros((), dtype=torch.long, device=device)

    def rewind() -> None:
        if now["i"] == case.new_tokens:  # back to the prompt alone
            for live, saved in zip(kept, snapshot or ()):  # (the device sets back `added`)
                live.copy_(saved)
            now.update(state=first, i=0)
            position.zero_()
        now["i"] += 1

    def one() -> Tensor:
        rewind()
        i = now["i"] - 1
        with torch.no_grad():
            x = new.window(i, i + 1)
            out, now["state"] = decode.step(core, x.q, x.k, x.v, now["state"], **x.extras)
        return out

    def on_device() -> None:
        """one()'s kernels on the capturable form of the state: its token where `position`
        says, then the position moved on, on the device; what the form adds is set back where
        the position wraps, so calls made before a capture cannot run it past the new tokens."""
        with torch.no_grad():
            for live, saved in added:
                live.copy_(torch.where(position == 0, saved, live))
            x = new.at(position)
            decode.step(core, x.q, x.k, x.v, graphed, **x.extras)
            position.add_(1).remainder_(case.new_tokens)

    inputs = tuple({id(t): t for t in (*new.leaves(), *(snapshot or ()))}.values())
    return Runnable(
        case,
        core,
        inputs,
        _discard(one),
        output=one,
        state=lambda: now["state"],
        split=None if graphed is None else (rewind, on_device),
    )


def _nothing() -> None:
    """No host work."""


def _discard(fn: Callable[[], Tensor]) -> Callable[[], None]:
    """fn as a step: its output dropped at once."""

    def step() -> None:
        fn()

    return step


CLASSIFIER_LABELS = 2  # classes of a non-causal model case's head (a small part of its cost)


def _build_model(case: BenchCase, device: torch.device, dtype: torch.dtype) -> Runnable:
    config = case.reformer_config()
    ids = torch.randint(0, config.vocab_size, (case.batch, case.seq_len), device=device)
    with _defaults(device, dtype):
        if case.causal:
            model: torch.nn.Module = ReformerLM(config, device=device.type)
            labels = ids
        else:  # a bidirectional model: the sequence classifier
            model = ReformerForSequenceClassification(
                config, num_labels=CLASSIFIER_LABELS, device=device.type
            )
            labels = torch.zeros(case.batch, dtype=torch.long, device=device)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4) if case.mode == "train-step" else None
    if case.mode == "forward":
        model.eval()

    def forward() -> Tensor:
        out = model(ids, labels=None if case.mode == "forward" else labels)
        return out.logits if out.loss is None else out.loss

    step = _make_step(case, forward, params, optimizer)
    return Runnable(case, model, (ids,), step, optimizer, output=lambda: model(ids).logits)
