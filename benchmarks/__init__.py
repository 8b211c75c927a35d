"""The asv suite of attention-zoo (run with `asv run --python=same --quick`); see asv.conf.json."""
