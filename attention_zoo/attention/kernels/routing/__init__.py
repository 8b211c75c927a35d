"""Content-routed block selection (MoBA, NSA): a router picks, per (batch, head, query), a fixed
number of key blocks; every implementation reads that one selection. Reference: a dense softmax
under the selection's token mask; implementations: gathered key blocks, FlexAttention's kv lists."""
