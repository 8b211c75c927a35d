"""The needle-in-a-haystack ladder's claims: softmax attention (a cache that grows with the context)
keeps its retrieval accuracy as the length grows, while recurrences with a fixed state of the
same size (same heads, same head width) fall. Sources: RULER (Hsieh et al. 2024) for the task,
Jelassi et al. 2024 ("Repeat After Me") and Zoology (Arora et al. 2023) for the claim.

Each length of a ladder is a rung trained apart (one model per length, as Zoology trains each
length). Each mechanism is judged on its own ladder: the paired gap, seed by seed, between its
accuracy at the longest and at the shortest length (each the mean over the depth splits there).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ...errors import UnknownPresetError, ZooError
from ...measure.fair import FairSetting, fair_numbers
from ...measure.metrics import is_measured
from ...report.claims import FAILS, HOLDS, NOT_MEASURED, UNDECIDED, ClaimRow
from ...tasks.suite import TaskPreset, load_task_preset
from .. import evidence
from ..evidence import (
    BELOW,
    MIN_SEEDS,
    NOT_BELOW,
    NOT_LEARNED,
    cell_text,
    judge_gap,
    seed_mean,
    seeds_text,
)
from ..intervals import Interval

TASK = "niah"
REFERENCE = "full"  # softmax attention: the reference every fixed-state claim needs to retrieve
SOURCES = (
    "RULER (Hsieh et al. 2024), NVIDIA/RULER scripts/data/synthetic/niah.py: the NIAH variants",
    "Jelassi et al. 2024, 'Repeat After Me: Transformers are Better than State Space Models at "
    "Copying', abstract",
    "Zoology (Arora, Eyuboglu et al. 2023): recall needs a state that grows with the pairs",
)
PUBLISHED = (
    '"transformer models dramatically outperform state space models at copying and retrieving '
    'information from context"; GSSMs "are fundamentally limited by their fixed-size latent '
    'state" (Jelassi et al. 2024)'
)
# The preset names `zoo reproduce niah --preset SIZE` trains (the niah suite), one per variant.
SIZES = {
    "smoke": ("ladder-smoke",),
    "cpu": ("ladder-cpu", "ladder-cpu-single"),
    "gpu": ("ladder-gpu-multikey", "ladder-gpu-multiquery", "ladder-gpu-multivalue"),
}
LEARNED = 50.0  # %: a mechanism's interval at the shortest length clears this before it is judged
MARGIN = 5.0  # points above the task's key-blind rules that the shortest length must clear too
BAND = 10.0  # points: a fall is a gap (longest - shortest) whose interval lies wholly below -BAND
SPLIT = re.compile(r"n(\d+)-d(\d+)")  # the task's evaluation split labels: n<length>-d<depth %>
NO_FALL = f"{UNDECIDED}: it did not clear the floor at the shortest length"
NO_REFERENCE = f"{UNDECIDED}: full attention did not keep its accuracy here (its claim must hold)"
STRADDLES = f"{UNDECIDED}: the gap's interval crosses -{BAND:g} points"
UNSIZED = f"{UNDECIDED}: its state cannot be sized here (fixed or growing: which claim applies)"
KEY_BLIND = (
    f"{UNDECIDED}: a rule that never reads the asked key scores {{:.0f}}% at the shortest length, "
    "so no accuracy here shows retrieval"
)
RULE = (
    f"per mechanism, over >= {MIN_SEEDS} seeds: the paired gap of its accuracy at the longest "
    f"length minus the shortest (each the mean over depths), its 95% interval classed below "
    f"(wholly under -{BAND:g} points) or not below (wholly at or above -{BAND:g}), else undecided; "
    f"judged only when its own interval at the shortest length clears the floor ({LEARNED:g}%, "
    f"or the key-blind rules' accuracy + {MARGIN:g} points if higher) and, for a "
    "fixed state, when full attention keeps its accuracy here (its own claim holds: the contrast "
    "the claim states); a growing cache holds when not below, a fixed state when below; a ladder "
    f"whose key-blind rules score {100 - MARGIN:g}% or more is judged nowhere (no floor is left)"
)

Accuracies = dict[str, dict[int, dict[int, float]]]  # backend -> length -> seed -> accuracy [%]


@dataclass(frozen=True)
class Memory:
    """What a mechanism keeps per layer and sequence at the shortest and the longest length."""

    short_bytes: int | None
    long_bytes: int | None

    @property
    def fixed(self) -> bool:
        return self.short_bytes is not None and self.short_bytes == self.long_bytes

    @property
    def kind(self) -> str:
        """How the state grows, as a plot's legend says it."""
        if self.short_bytes is None or self.long_bytes is None:
            return "state not sized here"
        return "fixed state" if self.fixed else "growing cache"


def ladder_presets(size: str) -> list[TaskPreset]:
    """The niah suite presets trained at `size` that the suite in use defines (a user's copy may
    lack those added since); UnknownPresetError when it defines none of them."""
    found, missing = [], []
    for name in SIZES[size]:
        try:
            found.append(load_task_preset(TASK, name))
        except UnknownPresetError as exc:
            missing.append(exc)
    if missing and not found:
        raise missing[0]
    return found


def rung_name(preset: TaskPreset, length: int) -> str:
    """The stored preset name of the ladder's rung at `length`."""
    return f"{preset.name}-n{length}"


def rung_lengths(preset: TaskPreset) -> dict[str, int]:
    """The stored preset name of each of the ladder's rungs -> its length."""
    return {rung_name(preset, n): n for n in preset.task.lengths}


def rungs(preset: TaskPreset) -> list[TaskPreset]:
    """The ladder's lengths as presets of their own, each trained apart."""
    return [
        dataclasses.replace(
            preset,
            name=rung_name(preset, n),
            description=f"{preset.description} (the rung at length {n})",
            task=dataclasses.replace(preset.task, seq_len=n, lengths=(n,)),
        )
        for n in preset.task.lengths
    ]


def accuracies(rows: Iterable[Mapping[str, Any]], preset: TaskPreset) -> tuple[Accuracies, dict]:
    """backend -> length -> seed -> accuracy [%] (the mean over the length's depth splits), and
    backend -> the stored cases ("run/case") read, from tidy rows of the ladder's rungs."""
    names = rung_lengths(preset)
    splits: dict[tuple[str, int, int], list[float]] = {}
    refs: dict[str, list[str]] = {}
    for r in rows:
        if r["task"] != TASK or r["metric"] != "accuracy" or r["preset"] not in names:
            continue
        match = SPLIT.fullmatch(str(r["eval"]))
        if (
            match is None
            or int(match.group(1)) != names[r["preset"]]
            or not is_measured(r["value"])
        ):
            continue
        key = (r["backend"], int(match.group(1)), int(r["seed"]))
        splits.setdefault(key, []).append(100 * float(r["value"]))
        if r.get("ref"):
            refs.setdefault(r["backend"], []).append(r["ref"])
    out: Accuracies = {}
    for (backend, length, seed), values in splits.items():
        out.setdefault(backend, {}).setdefault(length, {})[seed] = sum(values) / len(values)
    return out, {b: list(dict.fromkeys(v)) for b, v in refs.items()}


def memory(preset: TaskPreset, backend: str) -> Memory:
    """The decoding state of one attention layer of `backend` at the preset's shortest and longest
    lengths, its heads and head width (computed on the meta device)."""
    model = preset.model
    heads = int(model["num_attention_heads"])
    width = int(model.get("attention_head_size") or model["hidden_size"] // heads)
    options = tuple(sorted(model.get("attn_options", {}).get(backend, {}).items()))
    lengths = preset.task.lengths
    return Memory(
        *(_state_bytes(backend, options, heads, width, n) for n in (lengths[0], lengths[-1]))
    )


@cache
def _state_bytes(
    backend: str, options: tuple[tuple[str, Any], ...], heads: int, width: int, length: int
) -> int | None:
    setting = FairSetting(heads=heads, head_dim=width, context=length)
    try:
        return fair_numbers(backend, dict(options), setting).state_bytes
    except ZooError:  # a backend unknown or unavailable here, a mix of layers: not sized
        return None


def key_blind(preset: TaskPreset) -> float:
    """% the best key-blind rule (one that never reads the asked key, niah.py) scores where the
    ladder is judged: its mean over the shortest length's depth splits (at a fixed depth the
    asked needle's place among the needles can be a giveaway the training draw does not have)."""
    shortest = preset.task.lengths[0]
    splits = [s for s in preset.task.eval_splits().values() if s.seq_len == shortest]
    rules = [s.key_blind_rules() for s in splits]
    return 100 * max(sum(r[name] for r in rules) / len(rules) for name in rules[0])


def learned_floor(preset: TaskPreset) -> float:
    """% the shortest length's interval must clear: LEARNED, or the key-blind rules plus MARGIN
    where they score higher."""
    return max(LEARNED, key_blind(preset) + MARGIN)


def fall(
    short: Mapping[int, float], long: Mapping[int, float], floor: float = LEARNED
) -> tuple[Interval | None, str | None, str]:
    """(gap interval, BELOW / NOT_BELOW / None, why not) of long - short over common seeds, once
    the shortest length's interval clears `floor` (%)."""
    judged = judge_gap(short, long, floor=floor, band=BAND, side=BELOW)
    why = {NOT_LEARNED: NO_FALL, evidence.STRADDLES: STRADDLES}.get(judged.reason, judged.reason)
    return judged.gap, judged.cls, why


def _kept(reference: Mapping[int, Any], cls: str | None, why: str | None) -> str:
    """Whether full attention keeps its accuracy down the ladder: yes, no (it falls), undecided
    (and why), or - when it was not trained."""
    if not reference:
        return "-"
    if why:
        return f"undecided ({why})"
    return "yes" if cls == NOT_BELOW else "no"


def claims(rows: Iterable[Mapping[str, Any]], preset: TaskPreset) -> list[ClaimRow]:
    """One claim per mechanism trained on the preset's ladder (reference first)."""
    accs, refs = accuracies(rows, preset)
    lengths = preset.task.lengths
    short, long = lengths[0], lengths[-1]
    reference = accs.get(REFERENCE, {})
    floor, blind = learned_floor(preset), key_blind(preset)
    unreachable = floor >= 100  # the key-blind rules solve the ladder: no accuracy shows retrieval
    _, ref_cls, ref_why = fall(reference.get(short, {}), reference.get(long, {}), floor)
    cleared = not ref_why and ref_cls == NOT_BELOW
    if unreachable:
        floor_text = f"none: the key-blind rules score {blind:.1f}% at L {short}"
    else:
        floor_text = (
            f"learned: >= {floor:.1f}% at L {short} (key-blind rules {blind:.1f}% + "
            f"{MARGIN:g}, at least {LEARNED:g}%); "
            "full keeps its accuracy: " + _kept(reference, ref_cls, ref_why)
        )
    backends = sorted(accs, key=lambda b: (b != REFERENCE, b)) or [REFERENCE]
    scale = scale_text(preset)
    out = []
    for backend in backends:
        per_length = accs.get(backend, {})
        mem = memory(preset, backend)
        gap, cls, why = fall(per_length.get(short, {}), per_length.get(long, {}), floor)
        if not per_length:
            verdict = NOT_MEASURED
        elif unreachable:
            verdict = KEY_BLIND.format(blind)
        elif why:
            verdict = why
        elif mem.long_bytes is None:
            verdict = UNSIZED
        elif mem.fixed and not cleared:
            verdict = NO_REFERENCE
        elif mem.fixed:
            verdict = HOLDS if cls == BELOW else FAILS
        else:
            verdict = HOLDS if cls == NOT_BELOW else FAILS
        out.append(
            ClaimRow(
                claim=claim_text(backend, mem),
                setting=f"niah {preset.task.variant}, {preset.task.haystack} haystack, preset "
                f"{preset.name}, backend {backend}",
                scale=scale,
                published=PUBLISHED,
                ours=ladder_text(per_length),
                interval="-"
                if gap is None
                else f"{gap.text(sign=True)}" + (f" ({cls})" if cls else ""),
                floor=floor_text,
                seeds=seeds_text(*per_length.values()) if per_length else "-",
                rule=RULE if verdict != NOT_MEASURED else "-",
                verdict=verdict,
                rows_used=tuple(dict.fromkeys(refs.get(backend, []) + refs.get(REFERENCE, []))),
            )
        )
    return out


def claim_text(backend: str, mem: Memory) -> str:
    """The claim a mechanism is judged on, with the state it keeps per layer and sequence."""
    if mem.fixed:
        return (
            f"{backend}, a fixed state ({_bytes(mem.long_bytes)} per layer and sequence; every "
            "recurrence here has the same heads and head width), falls as the length grows"
        )
    if mem.long_bytes is None:
        return f"{backend}, a state this machine cannot size (fixed or growing: not judged)"
    state = f"{_bytes(mem.short_bytes)} -> {_bytes(mem.long_bytes)}"
    return f"{backend}, a state that grows with the context ({state}), keeps its accuracy"


def ladder_text(per_length: Mapping[int, Mapping[int, float]]) -> str:
    """'L 16: 98.0; L 64: 31.5' (the mean over seeds, %), '-' when nothing is stored."""
    if not per_length:
        return "-"
    return "; ".join(f"L {n}: {seed_mean(s):.1f}" for n, s in sorted(per_length.items()))


def scale_text(preset: TaskPreset) -> str:
    """The size a claim was measured at, in one line."""
    task, model, train = preset.task, preset.model, preset.train
    heads = model["num_attention_heads"]
    width = model.get("attention_head_size") or model["hidden_size"] // heads
    return (
        f"lengths {', '.join(map(str, task.lengths))}, each trained apart; {task.num_needles} "
        f"needle{'s' if task.num_needles != 1 else ''}, {task.num_keys} keys, "
        f"{task.num_values} values (chance "
        f"{100 * task.chance_accuracy():.1f}%, key-blind rules at L {task.lengths[0]} "
        f"{key_blind(preset):.1f}%); "
        f"depths {', '.join(f'{d:g}' for d in task.depths)}; "
        f"{model['num_hidden_layers']} layers d {model['hidden_size']}, {heads} "
        f"head{'s' if heads != 1 else ''} x {width}"
        + (", previous-token embeddings" if model.get("previous_token_embeddings") else "")
        + f"; <= {train.max_steps} steps x {train.batch_size}"
    )


def table(
    rows: Iterable[Mapping[str, Any]], preset: TaskPreset
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the accuracy table beside the plot: a mechanism per row, a length per
    column."""
    accs, _ = accuracies(rows, preset)
    lengths: Sequence[int] = preset.task.lengths
    body = [
        [f"`{b}`", "fixed" if memory(preset, b).fixed else "grows"]
        + [cell_text(accs[b][n], scale=1) if accs[b].get(n) else "-" for n in lengths]
        for b in sorted(accs, key=lambda b: (b != REFERENCE, b))
    ]
    return ["mechanism", "state", *(f"L {n}" for n in lengths)], body


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,} bytes"
