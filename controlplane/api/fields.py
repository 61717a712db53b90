"""Input fields stricter than DRF's defaults."""

from rest_framework import serializers


class _OnlyStrings:
    """A string, and only a string: DRF's CharField would take `5` for `"5"`, and an agent that
    sends a number where a program name or an argument belongs has a bug worth a 400."""

    default_error_messages = {"not_a_string": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class Text(_OnlyStrings, serializers.CharField):
    pass


class Slug(_OnlyStrings, serializers.SlugField):
    pass
