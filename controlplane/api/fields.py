"""Input fields stricter than DRF's defaults: JSON has types, and an agent that sends the wrong
one has a bug worth a 400, not a guess (DRF's CharField takes `5` for `"5"`, its BooleanField
takes `"yes"`, its IntegerField takes `"5"` and `true`)."""

from rest_framework import serializers


class _OnlyStrings:
    """A string, and only a string."""

    default_error_messages = {"not_a_string": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class Text(_OnlyStrings, serializers.CharField):
    pass


class Slug(_OnlyStrings, serializers.SlugField):
    pass


class Bool(serializers.BooleanField):
    """`true` or `false`, nothing else."""

    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class Int(serializers.IntegerField):
    """A JSON integer: not a string of digits, not `true`, not `5.0`."""

    default_error_messages = {"invalid": "Must be an integer."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)
