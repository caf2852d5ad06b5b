"""rl_plot_curves: the chosen metrics of one or more runs against step, drawn on the server as
a PNG a host can show inline. matplotlib is imported only when the tool is called."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

from mcp import types

from server.mcp.models import PlotIn
from server.mcp.registry import Call, ToolSpec

MAX_POINTS = 1000  # per metric and run: more than a 900-pixel-wide panel can show
HISTORY_ROWS = 100_000

Series = dict[str, dict[str, tuple[list[float], list[float]]]]  # run -> metric -> (steps, ys)


def _series(call: Call, args: PlotIn) -> Series:
    keys = ",".join(args.metrics)
    found: Series = {}
    for run_id in dict.fromkeys(args.run_ids):
        rows = call.svc.runs.history(run_id, keys, HISTORY_ROWS, MAX_POINTS).rows
        found[run_id] = {
            metric: (
                [float(r["step"]) for r in rows if _number(r.get(metric))],
                [float(r[metric]) for r in rows if _number(r.get(metric))],
            )
            for metric in args.metrics
        }
    return found


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _draw(series: Series, metrics: list[str]) -> bytes:
    from matplotlib.figure import Figure  # heavy: only here (the Agg canvas, no pyplot state)

    fig = Figure(figsize=(6.4, 2.6 * len(metrics)), dpi=100, layout="constrained")
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics, strict=True):
        drawn = False
        for run_id, by_metric in series.items():
            steps, ys = by_metric[metric]
            if steps:
                ax.plot(steps, ys, marker="." if len(steps) < 30 else None, label=run_id)
                drawn = True
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no values yet", ha="center", va="center", transform=ax.transAxes)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


async def _plot(call: Call, args: PlotIn) -> types.CallToolResult:
    series = await asyncio.to_thread(_series, call, args)
    png = await asyncio.to_thread(_draw, series, args.metrics)
    points = {
        run_id: {metric: len(steps) for metric, (steps, _) in by_metric.items()}
        for run_id, by_metric in series.items()
    }
    counts = "; ".join(
        f"{run_id}: " + ", ".join(f"{m} {n} points" for m, n in by_metric.items())
        for run_id, by_metric in points.items()
    )
    return types.CallToolResult(
        content=[
            types.ImageContent(
                type="image", data=base64.b64encode(png).decode(), mimeType="image/png"
            ),
            types.TextContent(type="text", text=f"Curves against step. {counts}."),
        ],
        structuredContent={"metrics": args.metrics, "points": points, "png_bytes": len(png)},
    )


def curve_tool() -> ToolSpec:
    return ToolSpec(
        name="rl_plot_curves",
        description="Draw metrics of one or more runs (default reward/mean and train/loss) "
        "against step as a PNG image, one panel per metric and one line per run. About a "
        "second. Use it to compare runs or a sweep's runs at a glance.",
        args=PlotIn,
        run=_plot,
    )
