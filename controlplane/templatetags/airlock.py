import re

from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()
CODE_SPAN = re.compile(r"`([^`\n]+)`")


@register.filter
def ticks(value) -> SafeString:
    """A message whose `quoted` parts are code (programs, rules, entries) with them shown as code:
    the text is escaped first, so only the <code> elements this adds are markup."""
    return mark_safe(CODE_SPAN.sub(r"<code>\1</code>", conditional_escape(str(value))))  # noqa: S308 - escaped above


@register.filter
def plain(value) -> str:
    """A JSON value as a person reads it: lists joined by commas, null as an em dash."""
    if value is None or value == "":
        return "—"
    if isinstance(value, list | tuple):
        return ", ".join(plain(item) for item in value) or "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@register.filter
def percent(value) -> str:
    """A ratio (0.25) as a percentage ("25.0 %"); None as an em dash."""
    return "—" if value is None else f"{value * 100:.1f} %"

