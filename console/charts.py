"""Numbers over time, drawn in the browser by uPlot (static/vendor/uplot-1.6.31: MIT, from the npm
registry's uplot 1.6.31 tarball; static/console/charts.js draws every `[data-chart]` figure).

The server decides what a chart shows: its x axis (steps or time), its series (several overlaid when
runs are compared), its unit, whether a log scale is offered, and where a line breaks: a value that is
missing, not finite, or a stretch of time with no sample stays a gap, never a straight line across. It
also writes the sentence a screen reader (or a page without JavaScript) reads instead of the canvas.
"""

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

MAX_POINTS = 600  # a chart is a few hundred pixels wide: longer series are averaged down to this


@dataclass
class Chart:
    id: str
    title: str
    x: str  # "step" or "time" (seconds since the epoch; the browser shows its local time)
    xs: list
    series: list = field(default_factory=list)  # [{"label", "values", "span"}]: span joins an overlay's gaps
    unit: str = ""
    log: bool = False  # offer a log scale (loss)

    @property
    def data(self):
        return {"x": self.x, "xs": self.xs, "series": self.series, "unit": self.unit, "title": self.title}

    @property
    def summary(self):
        """What the chart shows, in words: per series its points, last value and range."""
        parts = []
        for s in self.series:
            known = [(x, v) for x, v in zip(self.xs, s["values"], strict=True) if v is not None]
            if not known:
                parts.append(f"{s['label']}: no values")
                continue
            values = [v for _, v in known]
            last, low, high = (number(v, self.unit) for v in (values[-1], min(values), max(values)))
            points = f"{len(known)} point{'s' if len(known) != 1 else ''}"
            parts.append(
                f"{s['label']}: {points} from {self.at(known[0][0])} to {self.at(known[-1][0])}, "
                f"last {last}, lowest {low}, highest {high}"
            )
        return f"{self.title}. " + "; ".join(parts) + "."

    def at(self, x):
        if self.x == "time":
            return datetime.fromtimestamp(x, UTC).strftime("%H:%M:%S UTC")
        return f"{self.x} {x:g}"


def number(value, unit=""):
    """Four significant figures ("680.3", "0.0005", "1.235e+06"), with the unit."""
    text = f"{value:.4g}"
    return f"{text} {unit}".strip() if unit and not unit.startswith("%") else text + unit


def finite(value):
    return value if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) else None


def chart(id, title, rows, keys, *, x="step", unit="", log=False, gap=None):
    """A chart of rows (dicts with `x` and each key of `keys`, {key: label}); None with under two values.
    Values that are missing or not finite stay gaps; with `gap` (seconds or steps), so does any stretch
    between two rows further apart than it. Longer series are averaged down to MAX_POINTS."""
    rows = sorted((r for r in rows if finite(r.get(x)) is not None), key=lambda r: r[x])
    if gap is not None:
        spaced = []
        for row in rows:
            if spaced and row[x] - spaced[-1][x] > gap:
                spaced.append({x: (row[x] + spaced[-1][x]) / 2})  # no value: the line breaks here
            spaced.append(row)
        rows = spaced
    xs = [r[x] for r in rows]
    series = [{"label": label, "values": [finite(r.get(k)) for r in rows], "span": False} for k, label in keys.items()]
    if sum(v is not None for s in series for v in s["values"]) < 2:
        return None
    xs, series = thin(xs, series)
    return Chart(id, title, x, xs, series, unit, log)


def overlay(id, title, runs, key, *, x="step", unit="", log=False):
    """Several runs' `key` on one chart ({label: rows}), aligned on their x values; a run that logged
    fewer steps is joined across the steps it lacks."""
    xs = sorted({r[x] for rows in runs.values() for r in rows if finite(r.get(x)) is not None})
    series = []
    for label, rows in runs.items():
        by_x = {r[x]: finite(r.get(key)) for r in rows if finite(r.get(x)) is not None}
        series.append({"label": label, "values": [by_x.get(v) for v in xs], "span": True})
    if sum(v is not None for s in series for v in s["values"]) < 2:
        return None
    xs, series = thin(xs, series)
    return Chart(id, title, x, xs, series, unit, log)


def thin(xs, series):
    """At most MAX_POINTS points: consecutive points averaged (a bucket with no value stays a gap)."""
    if len(xs) <= MAX_POINTS:
        return xs, series
    size = math.ceil(len(xs) / MAX_POINTS)
    buckets = range(0, len(xs), size)
    thinned = []
    for s in series:
        values = []
        for start in buckets:
            known = [v for v in s["values"][start : start + size] if v is not None]
            values.append(sum(known) / len(known) if known else None)
        thinned.append({**s, "values": values})
    return [xs[min(start + size, len(xs)) - 1] for start in buckets], thinned


def training_charts(rows):
    """A training run's loss (with a log scale to offer), learning rate and tokens/s by step, those it
    logged: the run's page and its registered version's."""
    found = [
        chart("loss-chart", "Training loss", rows, {"loss": "loss"}, log=True),
        chart("lr-chart", "Learning rate", rows, {"lr": "learning rate"}),
        chart("throughput-chart", "Throughput", rows, {"tokens_per_s": "tokens/s"}, unit="tokens/s"),
    ]
    return [c for c in found if c]
