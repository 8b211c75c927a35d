"""Block variants section: per-layer training-memory growth and time price of the residual
variants (standard / checkpoint / reversible), and chunked vs unchunked feed-forward, from model
cases that differ only in those fields."""

from __future__ import annotations

import json
from typing import Any

from .context import TIME, Context, empty_section, trusted
from .cost import computes, header
from .document import Heading, Para, Table

COMMAND = "zoo reproduce reformer"
LAYERS = "num_hidden_layers"
TRAINING = ("train-step", "forward+backward")


def _group_key(row: Any, drop: tuple[str, ...]) -> str:
    config = {k: v for k, v in row["config"].items() if k not in ("label", "model")}
    model = {k: v for k, v in (row["config"].get("model") or {}).items() if k not in drop}
    return json.dumps([row["setting"], config, model], sort_keys=True, default=str)


def _model(row: Any, name: str, default: Any) -> Any:
    return (row["config"].get("model") or {}).get(name, default)


def block_variants(ctx: Context) -> list[Any]:
    bench = ctx.bench
    models = (
        bench.iloc[0:0]
        if bench.empty
        else bench[
            (bench["target"] == "model") & (bench["status"] == "ok") & bench["mode"].isin(TRAINING)
        ]
    )
    residual = _residual_table(ctx, models)
    chunked = _chunk_table(ctx, models)
    if residual is None and chunked is None:
        return empty_section("Block variants", COMMAND)
    blocks: list[Any] = [Heading(1, "Block variants")]
    if residual is not None:
        blocks += [
            Para(
                "Residual variants: peak training memory added per layer (least-squares slope of "
                "peak memory over the number of layers) and the time of one step as a ratio to "
                "`standard` with the same number of layers."
            ),
            residual,
        ]
    if chunked is not None:
        blocks += [
            Para(
                "Feed-forward chunking: each chunked model against the same model unchunked "
                "(`chunk_size_feed_forward=0`)."
            ),
            chunked,
        ]
    return blocks


def _residual_table(ctx: Context, models: Any) -> Table | None:
    models = models[[LAYERS in (c.get("model") or {}) for c in models["config"]]]
    if models.empty:
        return None
    rows = []
    for _, part in models.groupby(
        [_group_key(r, ("residual", LAYERS)) for _, r in models.iterrows()], sort=True
    ):
        by_residual: dict[str, list[Any]] = {}
        for _, r in part.iterrows():
            by_residual.setdefault(_model(r, "residual", "reversible"), []).append(r)
        standard = {int(_model(r, LAYERS, 0)): r for r in by_residual.get("standard", [])}
        for name in sorted(by_residual):
            points = [r for r in by_residual[name] if "peak_bytes" in r["metrics"]]
            layers = sorted({int(_model(r, LAYERS, 0)) for r in points})
            if len(layers) < 2:
                continue
            _, per_layer = ctx.ledger.derive(
                "peak_bytes",
                "slope",
                [ctx.input(r, "peak_bytes") for r in points],
                x=f"config.model.{LAYERS}",
            )
            top = max(by_residual[name], key=lambda r: int(_model(r, LAYERS, 0)))
            ref = standard.get(int(_model(top, LAYERS, 0)))
            price = "-"
            if ref is not None and trusted(top, TIME) and trusted(ref, TIME):
                price = ctx.ledger.derive(
                    "ratio", "ratio", [ctx.input(top, "time_median"), ctx.input(ref, "time_median")]
                )[1]
            rows.append(
                [
                    f"`{top['setting']}`",
                    f"`{name}`",
                    computes(top),
                    ", ".join(
                        ctx.config(r, f"config.model.{LAYERS}", "count")
                        for r in sorted(points, key=lambda r: int(_model(r, LAYERS, 0)))
                    ),
                    per_layer,
                    ctx.config(top, f"config.model.{LAYERS}", "count"),
                    price,
                ]
            )
    if not rows:
        return None
    return Table(
        [
            "setting",
            "residual",
            "computes",
            "layers measured",
            header("peak_bytes", "memory per layer"),
            "at layers",
            "time x standard",
        ],
        rows,
    )


def _chunk_table(ctx: Context, models: Any) -> Table | None:
    key = "chunk_size_feed_forward"
    rows = []
    groups = models.groupby([_group_key(r, (key,)) for _, r in models.iterrows()], sort=True)
    for _, part in groups:
        plain = [r for _, r in part.iterrows() if not _model(r, key, 0)]
        chunked = [r for _, r in part.iterrows() if _model(r, key, 0)]
        if not plain or not chunked:
            continue
        base = plain[-1]
        for r in chunked:
            cells = [
                f"`{r['setting']}`",
                f"`{r['label']}`",
                computes(r),
                ctx.config(r, f"config.model.{key}", "count"),
            ]
            for metric in ("peak_bytes", TIME):
                if trusted(r, metric) and trusted(base, metric) and base["metrics"][metric]:
                    cells.append(
                        ctx.ledger.derive(
                            "ratio", "ratio", [ctx.input(r, metric), ctx.input(base, metric)]
                        )[1]
                    )
                else:
                    cells.append("-")
            rows.append(cells)
    if not rows:
        return None
    return Table(
        ["setting", "variant", "computes", "chunk size", "memory x unchunked", "time x unchunked"],
        rows,
    )
