"""Building blocks of the Reformer skeleton: attention sublayer, feed-forward, residuals, positions."""

from .attention import SelfAttention

__all__ = ["SelfAttention"]
