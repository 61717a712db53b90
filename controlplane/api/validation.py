"""Validating a request body without building its serializer anew (docs/architecture.md, "A
command's way").

Building a DRF serializer deep-copies every field it declares, which cost more than validating
the body of a command. `validated` keeps one bound instance of each serializer class and
validates through its public `run_validation`, which is what `is_valid` itself calls and which
keeps no state on the serializer or its fields: threads share the instance. It returns what
`is_valid` would leave in `validated_data`, and raises the ValidationError that
`is_valid(raise_exception=True)` raises. Only for serializers that read neither a context nor an
instance."""

import threading

from rest_framework.serializers import Serializer

_bound: dict[type[Serializer], Serializer] = {}
_lock = threading.Lock()


def validated(serializer_class: type[Serializer], data) -> dict:
    if data is None:  # a JSON `null` body: is_valid words that error its own way ("No data provided")
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
    serializer = _bound.get(serializer_class)
    if serializer is None:
        with _lock:
            serializer = _bound.get(serializer_class)
            if serializer is None:
                serializer = serializer_class()
                serializer.fields  # noqa: B018 - bound here, once, not by the first requests at the same time
                _bound[serializer_class] = serializer
    return serializer.run_validation(data)
