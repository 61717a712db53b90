"""Input fields stricter than DRF's defaults."""

from rest_framework import serializers


class Text(serializers.CharField):
    """A string, and only a string: DRF's CharField would take `5` for `"5"`, and an agent that
    sends a number where a program name or an argument belongs has a bug worth a 400."""

    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class Slug(serializers.SlugField):
    default_error_messages = {"invalid_type": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_type")
        return super().to_internal_value(data)
