from django import template

register = template.Library()


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
