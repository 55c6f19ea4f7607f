"""What a run's pages and API show of it: its logged steps, a summary, its layout and its log."""

import re

from ..catalog import get_recipe
from ..models import RunStatus


def metrics(run, limit=None):
    """The run's logged steps as the sync stored them, oldest first (the newest `limit` when given)."""
    if limit:
        return list(reversed(run.metric_rows.order_by("-line").values_list("values", flat=True)[:limit]))
    return list(run.metric_rows.values_list("values", flat=True))


def summary(run):
    """Step, loss, tokens/s and ETA from the metrics the run wrote."""
    rows = metrics(run)
    if not rows:
        return {}
    last = rows[-1]
    eta = None
    if run.status == RunStatus.RUNNING and len(rows) > 1:
        per_step = (rows[-1]["time"] - rows[0]["time"]) / max(1, rows[-1]["step"] - rows[0]["step"])
        eta = round(per_step * (run.steps - last["step"]))
    return {
        "step": last["step"],
        "loss": last["loss"],
        "tokens_per_s": last["tokens_per_s"],
        "eta_s": eta,
        "first_loss": rows[0]["loss"],
        "peak_memory_mb": max((r.get("peak_memory_mb") or 0) for r in rows) or None,
        "mfu": last.get("mfu"),
    }


def layout_summary(run):
    """How the run is laid out and what it was estimated to need, from its config: ranks, the mesh,
    the batch, the precision it trains in, and the memory estimate per GPU (recipes/fit.py)."""
    config = run.config or {}
    parallel = config.get("parallel") or {}
    if not parallel:
        return {}
    recipe = get_recipe(run.recipe_id) or {}
    profile = (recipe.get("profiles") or {}).get(run.profile) or {}
    ranks = run.nodes * (profile.get("ranks_per_node") or profile.get("gpus_per_node") or 1)
    tensor = parallel.get("tensor", 1)
    micro = config.get("micro_batch", 1)
    asked = config.get("precision", "fp32")
    return {
        "ranks": ranks,
        "tensor": tensor,
        "data": ranks // tensor,
        "global_batch": parallel.get("global_batch"),
        "micro_batch": micro,
        "accumulation": (parallel.get("global_batch") or 0) // max(1, micro * (ranks // tensor)),
        "precision": asked,
        # FP8 training needs torchao's float8 layers, which the nodes' runtime does not have.
        "precision_note": "fp8 is trained in bf16 here (float8 training needs torchao)" if asked == "fp8" else "",
        "estimate": config.get("estimate") or {},
    }


# Lines of a job's output that are libraries talking, not the run: Python warnings and the source line
# they quote, torch's per-rank notices ("[rank3]:W1206 ..."), torchrun's banner, progress bars.
NOISE = re.compile(
    r"Warning: |warnings\.warn\(|^\s+(return |warnings\.)|^\[rank\d+\]:[WI]\d{4}|^\*+$"
    r"|OMP_NUM_THREADS environment variable|\d+%\|"
)


def log_view(text, full=False):
    """The log tail as the run page shows it: with `full`, as written; otherwise the run's own lines
    (training steps, errors, tracebacks), library noise left out, and a line repeated by every rank
    shown once with its count."""
    if full:
        return text
    shown, last = [], None
    for line in text.splitlines():
        if not line.strip() or NOISE.search(line):
            continue
        if line == last:
            shown[-1] = (line, shown[-1][1] + 1)
            continue
        shown.append((line, 1))
        last = line
    return "\n".join(line if count == 1 else f"{line}  (x{count})" for line, count in shown)
