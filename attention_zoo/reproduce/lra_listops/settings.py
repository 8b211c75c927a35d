"""The presets a ListOps reproduction trains: a suite preset with the preset's own attention
options, or with each LRA-mapped backend set as LRA's row ran it (`--settings lra`).

LRA's settings, read from google-research/long-range-arena (lra_benchmarks/listops/configs/*.py
and models/*/): Local Attention: blocks of 50, each attending within itself
(local/local.py block_size=50); Reformer: 1 hash, 10 buckets, the sorted sequence in 10 chunks each
also seeing the one before (reformer/reformer_attention.py n_hashes=1, n_buckets=10, chunk_size =
n_hashes * n_buckets); Performer: 2 random features (configs/performer_base.py nb_features=2);
Linformer: k = 16 (linformer/linformer_attention.py low_rank_features=16); BigBird: blocks of 64,
3 random blocks (bigbird/bigbird_attention.py); Longformer: a 512-token window, 256 on each side,
no global token (longformer/longformer_attention.py sliding_window_size=512); Linear Trans.:
elu + 1 features.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ...tasks.suite import TaskPreset, load_task_preset
from ..base import OWN_SETTINGS
from ..training import model_and_budget

TASK = "listops"
LRA_SETTINGS = "lra"
SETTINGS = (OWN_SETTINGS, LRA_SETTINGS)
LRA_HASHES = 1  # the Reformer row's hash rounds
LRA_CHUNKS = 10  # the Reformer row splits the sorted sequence into n_hashes * n_buckets chunks
# HF-named model fields of the local and lsh backends, as LRA's rows ran them
LRA_FIELDS = {
    "local_attn_chunk_length": 50,
    "local_num_chunks_before": 0,
    "local_num_chunks_after": 0,
    "num_buckets": 10,
    "lsh_num_chunks_before": 1,
    "lsh_num_chunks_after": 0,
}
LRA_OPTIONS = {
    "performer": {"nb_features": 2},
    "linformer": {"proj_length": 16},  # + max_length: the preset's length
    "bigbird": {"block_size": 64, "num_random_blocks": 3},
    "sliding-window": {"window": 256, "global_tokens": 0},  # |i - j| < 256: 256 on each side
    "linear": {"feature_map": "elu+1"},
}


def preset_name(size: str, settings: str) -> str:
    """The stored preset name of `size` trained with `settings` (the preset's own: its name)."""
    return size if settings == OWN_SETTINGS else f"{size}-{settings}-settings"


def lra_model(model: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """The preset's model fields with every LRA-mapped backend set as LRA's row ran it."""
    options = {k: dict(v) for k, v in model.get("attn_options", {}).items()}
    for backend, lra in LRA_OPTIONS.items():
        options[backend] = {**lra, **({"max_length": seq_len} if backend == "linformer" else {})}
    fields = {**model, **LRA_FIELDS, "attn_options": options}
    fields["lsh_attn_chunk_length"] = math.ceil(seq_len / LRA_CHUNKS)
    return fields


def listops_preset(size: str, settings: str = OWN_SETTINGS) -> TaskPreset:
    """The listops suite's preset `size`, its attention as `settings` say."""
    preset = load_task_preset(TASK, size)
    if settings == OWN_SETTINGS:
        return preset
    grid = dataclasses.replace(preset.grid, train_hashes=(LRA_HASHES,))
    return dataclasses.replace(
        preset,
        name=preset_name(size, settings),
        description=f"{preset.description}; attention as LRA's rows ran it",
        model=lra_model(preset.model, preset.task.seq_len),
        grid=grid,
    )


def stored_presets(sizes: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Stored preset name -> (size, settings) of every preset this reproduction trains."""
    return {preset_name(z, s): (z, s) for z in sizes for s in SETTINGS}


def scale_text(preset: TaskPreset) -> str:
    """The size a claim was measured at, in one line."""
    task = preset.task
    return (
        f"expressions {task.min_length + 1}-{task.max_length - 1} tokens (depth <= "
        f"{task.max_depth}, <= {task.max_args} arguments), {model_and_budget(preset)}, "
        f"{task.eval_size} evaluation expressions"
    )
