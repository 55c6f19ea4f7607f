"""Template filters for health results: measured values and thresholds as short, readable text."""

from django import template

register = template.Library()


@register.filter
def readable(values, prefix=""):
    """{"a": 1.23456, "b": {"c": 2}} -> "a 1.235 · b.c 2"; long strings (checksums) are shortened."""
    if not isinstance(values, dict):
        return values
    parts = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            parts.append(readable(value, f"{name}.") or f"{name} —")
        elif isinstance(value, float):
            parts.append(f"{name} {value:.4g}")
        elif isinstance(value, str) and len(value) > 16:
            parts.append(f"{name} {value[:12]}…")
        else:
            parts.append(f"{name} {value}")
    return " · ".join(p for p in parts if p)
