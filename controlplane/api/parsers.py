"""The API's JSON parser: DRF's, with a bound on nesting. Python's json module recurses once per
level and raises RecursionError past ~1,000 levels, which DRF does not catch (a 500); and a
document nested hundreds of levels deep makes every later walk over it (validation, redaction)
recurse as deep. No request of this API nests more than a few levels."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


def depth_exceeds(value, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests deeper than `limit`; iterative, so any depth is safe."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        if depth_exceeds(data, MAX_DEPTH):
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
        return data
