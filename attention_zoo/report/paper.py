"""Published numbers the report sets beside ours: constants of the paper, defined once, cited.

Table 2: Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer", ICLR 2020
(arXiv 2001.04451), Table 2 — accuracy on the duplication task (sequences `0 w 0 w`, length 1024,
scored on the second copy; 1 layer, d_model 256, 4 heads). Rows: attention used in training;
columns: attention used in evaluation.
"""

from __future__ import annotations

TABLE2_CITATION = (
    "Kitaev, Kaiser, Levskaya, Reformer: The Efficient Transformer, ICLR 2020 "
    "(arXiv 2001.04451), Table 2"
)

# Column and row names in this project's labels: "full" = shared-QK full attention
# (the paper's "Full attention"; our `shared-qk` backend), "lsh-<h>" = LSH with h hashes.
TABLE2_TRAIN = ("shared-qk", "lsh-4", "lsh-2", "lsh-1")
TABLE2_EVAL = ("full", "lsh-8", "lsh-4", "lsh-2", "lsh-1")
TABLE2: dict[tuple[str, str], float] = {
    (train, evaluation): value
    for train, values in {
        "shared-qk": (1.000, 0.948, 0.925, 0.769, 0.525),
        "lsh-4": (0.008, 1.000, 0.999, 0.994, 0.919),
        "lsh-2": (0.008, 1.000, 0.999, 0.981, 0.868),
        "lsh-1": (0.008, 0.999, 0.996, 0.948, 0.779),
    }.items()
    for evaluation, value in zip(TABLE2_EVAL, values)
}
