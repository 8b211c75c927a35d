"""The Reformer's published numbers, typed once here, each with its source, in the source's units
and names (megabytes as the blog prints them, Table 2 in percent with the paper's row and column
names); the claims and the report's Table 2 derive everything else from them."""

from __future__ import annotations

from typing import Any

BLOG = "HF blog 'The Reformer - Pushing the limits of language modeling' (2020)"
PAPER = "Reformer paper (Kitaev et al. 2020), Table 2"
TABLE2_CITATION = (
    "Kitaev, Kaiser, Levskaya, Reformer: The Efficient Transformer, ICLR 2020 "
    "(arXiv 2001.04451), Table 2"
)

PUBLISHED: dict[str, Any] = {
    # inference memory [MB], google/reformer-enwik8, batch 1; global = chunks as long as the input
    "a": {
        "source": BLOG,
        "global_mb": {2048: 1465, 4096: 2757, 8192: 7893},  # 16386: out of memory
        "local_lsh_mb": {2048: 1785, 4096: 2621, 8192: 4281, 16384: 7607},  # 32768: OOM
    },
    # inference memory [MB], batch 8, no chunk vs chunk_size_feed_forward=1
    "b_default": {"source": BLOG, "mb": {1024: (4281, 4309), 2048: (7607, 7669)}},
    "b_wide": {  # feed_forward_size 16384, 2 attention heads
        "source": BLOG,
        "mb": {1024: (3743, 2973), 2048: (5539, 3999), 4096: (9087, 6011)},
    },
    # training memory [MB], batch 8, n 512, by layers: bert-base-uncased vs reformer-enwik8
    "c": {
        "source": BLOG,
        "standard_mb": {4: 4103, 8: 5759, 12: 7415},
        "reversible_mb": {4: 4607, 8: 4987, 12: 5367},
    },
    # google/reformer-crime-and-punishment: ReformerModel parameters; inference batch 8, n 512
    "d": {
        "source": BLOG,
        "axial_parameters": 2_584_064,
        "standard_parameters": 136_572_416,
        "axial_mb": 447,
        "standard_mb": 959,
    },
    "e": {"source": BLOG, "tokens": 524_288, "budget_gb": 8},  # "less than 8GB of RAM"
    # duplication task (sequences `0 w 0 w`, length 1024, scored on the second copy; 1 layer,
    # d_model 256, 4 heads): accuracy [%], attention in training (rows) x at evaluation (columns)
    "f": {
        "source": PAPER,
        "accuracy": {
            "full": {"full": 100.0, "lsh-8": 94.8, "lsh-4": 92.5, "lsh-2": 76.9, "lsh-1": 52.5},
            "lsh-4": {"full": 0.8, "lsh-8": 100.0, "lsh-4": 99.9, "lsh-2": 99.4, "lsh-1": 91.9},
            "lsh-2": {"full": 0.8, "lsh-8": 100.0, "lsh-4": 99.9, "lsh-2": 98.1, "lsh-1": 86.8},
            "lsh-1": {"full": 0.8, "lsh-8": 99.9, "lsh-4": 99.6, "lsh-2": 94.8, "lsh-1": 77.9},
        },
    },
}

# The paper's "Full attention" shares queries and keys: our `shared-qk` backend. As a column
# (an evaluation attention) our task rows call it "full" too.
TRAINED_AS = {"full": "shared-qk"}


def table2() -> dict[str, dict[str, float]]:
    """Table 2 as fractions, rows named by our backends: {train: {eval: accuracy}}."""
    return {
        TRAINED_AS.get(train, train): {e: v / 100 for e, v in row.items()}
        for train, row in PUBLISHED["f"]["accuracy"].items()
    }
