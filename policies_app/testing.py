"""A policy document's own tests: each request, evaluated offline, must get its expectation."""

from dataclasses import dataclass

from policies_app.document import PolicyDocument
from policies_app.engine import VersionRef, compile_policy, evaluate


@dataclass(frozen=True)
class TestOutcome:
    index: int
    request: dict
    passed: bool
    expected: dict
    got: dict


def run_tests(document: PolicyDocument, ref: VersionRef) -> list[TestOutcome]:
    compiled = compile_policy(document, ref)
    outcomes = []
    for index, test in enumerate(document.tests):
        decision = evaluate(compiled, test.request)
        expected = test.expect.model_dump(exclude_none=True)
        got = {"allowed": decision.allowed, "reason_code": decision.reason_code, "rule_id": decision.rule_id}
        passed = all(got[key] == value for key, value in expected.items())
        outcomes.append(TestOutcome(index, test.request.model_dump(), passed, expected, got))
    return outcomes
