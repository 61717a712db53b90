from django import template

from policies_app.testing import shown

register = template.Library()


@register.filter
def verdict(value: dict) -> str:
    """A test's expectation or outcome as the document writes it, never a Python dict."""
    return shown(value or {})
