"""Request bodies validated by one shared serializer instance (controlplane/api/validation.py)
answer exactly as a serializer built for the request would, from any number of threads."""

import json
import threading

import pytest
from rest_framework.exceptions import ValidationError

from controlplane.api.validation import validated
from sessions.api.serializers import CommandCreateSerializer, SessionCreateSerializer

BODIES = [
    (CommandCreateSerializer, {"bin": "true"}),
    (CommandCreateSerializer, {"bin": "pytest", "args": ["-q", "tests"], "cwd": "/workspace/a", "timeout_s": 5,
                               "wait": True}),
    (CommandCreateSerializer, {"bin": 5, "args": "x", "wait": "yes", "timeout_s": "5"}),
    (CommandCreateSerializer, {"args": ["a" * 70000]}),
    (CommandCreateSerializer, {"bin": "x", "args": ["a" * 60000] * 5}),  # validate_args: too long in all
    (CommandCreateSerializer, []),
    (CommandCreateSerializer, "text"),
    (CommandCreateSerializer, None),
    (SessionCreateSerializer, {"conversation_id": "c"}),
    (SessionCreateSerializer, {"conversation_id": "c", "workspace": {"repo": "demo"}, "persist": True}),
    (SessionCreateSerializer, {"conversation_id": "c", "workspace": {"repo": "demo"}, "resume": "latest"}),
    (SessionCreateSerializer, {"conversation_id": "c", "resume": "not-an-id", "workspace": 3}),
    (SessionCreateSerializer, {"policy": "Not A Slug"}),
]


def _answer(function):
    try:
        return "valid", json.loads(json.dumps(function()))
    except ValidationError as exc:
        return "invalid", json.loads(json.dumps(exc.detail))


def _built(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


@pytest.mark.parametrize(("serializer_class", "data"), BODIES)
def test_the_same_answer_as_a_serializer_built_for_the_request(serializer_class, data):
    assert _answer(lambda: validated(serializer_class, data)) == _answer(lambda: _built(serializer_class, data))


def test_threads_each_get_their_own_body_back():
    failures = []

    def agent(number: int) -> None:
        for round_ in range(200):
            body = {"bin": f"prog{number}", "args": [str(round_)] * (number % 4), "timeout_s": number + 1}
            data = validated(CommandCreateSerializer, body)
            if data["bin"] != body["bin"] or data["args"] != body["args"] or data["timeout_s"] != number + 1:
                failures.append((number, round_, data))
            try:
                validated(CommandCreateSerializer, {"bin": number})
            except ValidationError as exc:
                if set(exc.detail) != {"bin"}:
                    failures.append((number, round_, exc.detail))

    threads = [threading.Thread(target=agent, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
