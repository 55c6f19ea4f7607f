"""Template helpers for the wizard: the error span beside each field."""

from django import template
from django.utils.html import format_html

register = template.Library()


@register.simple_tag
def field_error(errors, *parts):
    """The span the live check fills: id err-<key>, where key joins `parts` with '-'."""
    key = "-".join(str(p) for p in parts)
    messages = (errors or {}).get(key, [])
    return format_html('<span class="field-error" id="err-{}" aria-live="polite">{}</span>', key, "; ".join(messages))


@register.simple_tag
def key(*parts):
    return "-".join(str(p) for p in parts)
