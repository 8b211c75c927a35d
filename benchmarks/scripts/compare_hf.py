"""Retired: the comparison with Hugging Face's (and reformer-pytorch's) Reformer attention is now
`zoo bench --preset vs-hf`, measured by the same runner as every other case and stored in the
results store. This wrapper runs that preset, passing its arguments on to `zoo bench`:

    python benchmarks/scripts/compare_hf.py                       # = zoo bench --preset vs-hf
    python benchmarks/scripts/compare_hf.py --lengths 1024 --store results/hf.sqlite
"""

from __future__ import annotations

import sys

from attention_zoo.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--preset", "vs-hf", *sys.argv[1:]]))
