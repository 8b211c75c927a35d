"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax replaced by a
positive feature map, out_i = phi(q_i) S_i / (phi(q_i) z_i); O(n) time and memory.

No attention probabilities exist to drop, so there is no `dropout` option.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore
from .decode import StateShape, SumsState, sums_add, sums_state, sums_state_bytes, sums_step
from .kernels.sums.plain import FEATURE_MAPS, KernelSums, compute_dtype
from .kernels.sums.scan import CallFeatures
from .kernels.sums.table import SUMS_KERNELS
from .options import check_int
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LinearConfig:
    """Options of linear attention."""

    feature_map: str = "elu+1"  # phi applied to queries and keys: elu+1 (the paper's) or relu
    eps: float = 1e-6  # added to the denominator phi(q_i) z_i
    chunk_length: int = 64  # causal: positions per chunk of the prefix sums
    kernel: str = "auto"  # auto (the pick rule), scan, math, fla (CUDA, causal)

    def __post_init__(self) -> None:
        if self.feature_map not in FEATURE_MAPS:
            raise OptionError(
                f"linear feature_map {self.feature_map!r} is not one of: {', '.join(FEATURE_MAPS)}"
            )
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise OptionError(f"linear option eps must be a float > 0, got {eps!r}")
        check_int("chunk_length", self.chunk_length, minimum=1, backend="linear")
        SUMS_KERNELS.check_option("linear", self.kernel)


@register_attention("linear", config=LinearConfig, caps=Capabilities(exact=False))
class LinearAttention(AttentionCore):
    """Linear attention with a feature map; causal by chunked prefix sums, O(n) memory."""

    kernels = SUMS_KERNELS

    def sums_for(self, q: Tensor) -> KernelSums:
        """What a call on q computes."""
        cfg = self.cfg
        return KernelSums(cfg.feature_map, self.causal, cfg.chunk_length, cfg.eps)

    def feature_dim(self, head_dim: int) -> int:
        return head_dim

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        impl = self.kernel_for(q, key_padding_mask)
        return impl.run(self, q, k, v, key_padding_mask).to(q.dtype)

    # ---- decoding: the running sums S, z (constant size) --------------------------------------

    def init_state(self, shape: StateShape) -> SumsState:
        """S and z over the positions seen: head_dim features per head."""
        return sums_state(shape, features=shape.head_dim)

    def state_bytes(self, shape: StateShape) -> int:
        return sums_state_bytes(shape, features=shape.head_dim)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: SumsState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, SumsState]:
        """New tokens against the sums (see attention/decode.py); the prefill is the forward."""
        feats = CallFeatures(
            self.cfg.feature_map, None, 1.0, key_padding_mask, compute_dtype(q.dtype)
        )
        if state.length == 0:
            return self.attend(q, k, v, key_padding_mask), sums_add(state, k, v, feats)
        return sums_step(q, k, v, state, feats, eps=self.cfg.eps)
