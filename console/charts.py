"""Server-rendered SVG line charts: numbers over time without a JavaScript charting library."""

from dataclasses import dataclass


@dataclass
class LineChart:
    points: str
    width: int
    height: int
    y_min: float
    y_max: float
    x_max: int
    last: float


def line_chart(rows, key, width=640, height=200, pad=30):
    """A polyline of `key` against `step`; None when there is nothing to draw."""
    # A missing or non-finite value (stored as None, recipes/runs/alerts.py) is left out.
    data = [(row["step"], row[key]) for row in rows if isinstance(row.get(key), int | float)]
    if len(data) < 2:
        return None
    xs, ys = [x for x, _ in data], [y for _, y in data]
    x_max, y_min, y_max = max(xs), min(ys), max(ys)
    span = (y_max - y_min) or 1.0
    scale_x = (width - 2 * pad) / max(1, x_max - min(xs))
    points = " ".join(
        f"{pad + (x - min(xs)) * scale_x:.1f},{height - pad - (y - y_min) / span * (height - 2 * pad):.1f}"
        for x, y in data
    )
    return LineChart(points, width, height, y_min, y_max, x_max, ys[-1])
