"""Reformer skeleton building blocks: attention sublayer, feed-forward, residuals, positions."""

from .attention import SelfAttention
from .feedforward import ChunkedFeedForward
from .layer import PreNorm, ReformerLayer
from .position import AxialPositionEmbedding, NoPositionEmbedding, TablePositionEmbedding
from .residual import RESIDUALS, CheckpointResidual, ReversibleResidual, StandardResidual

__all__ = [
    "RESIDUALS",
    "AxialPositionEmbedding",
    "CheckpointResidual",
    "ChunkedFeedForward",
    "NoPositionEmbedding",
    "PreNorm",
    "ReformerLayer",
    "ReversibleResidual",
    "SelfAttention",
    "StandardResidual",
    "TablePositionEmbedding",
]
