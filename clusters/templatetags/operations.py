"""Template filters for operations: the label of an operation's kind, from the engine's registry."""

from django import template

from ..operations import kind, kinds

register = template.Library()


@register.filter
def kind_label(operation):
    """ "Create", "Health scan", ...; the raw kind for one no module registers any more."""
    return kind(operation.kind).label if operation.kind in kinds() else operation.kind.title()
