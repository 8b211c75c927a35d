"""Reformer skeleton building blocks: attention sublayer, feed-forward, residuals, positions."""

from .attention import SelfAttention
from .feedforward import ChunkedFeedForward
from .layer import PreNorm, ReformerLayer
from .position import AxialPositionEmbedding, TablePositionEmbedding
from .residual import RESIDUALS, CheckpointResidual, ReversibleResidual, StandardResidual

__all__ = [
    "RESIDUALS",
    "AxialPositionEmbedding",
    "CheckpointResidual",
    "ChunkedFeedForward",
    "PreNorm",
    "ReformerLayer",
    "ReversibleResidual",
    "SelfAttention",
    "StandardResidual",
    "TablePositionEmbedding",
]
