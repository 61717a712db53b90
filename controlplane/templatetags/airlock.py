import math
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



@register.filter
def money(value) -> str:
    """An amount a person can read: cents for a cent or more, else its first two significant
    digits (0.00042), and 0 as 0.00; never 0.000000 for a small cost nor 6 places for a large one."""
    if value is None:
        return "—"
    value = float(value)
    if value == 0 or abs(value) >= 0.01:
        return f"{value:,.2f}"
    places = 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{places}f}"
