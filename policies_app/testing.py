"""A policy document's own tests: each request, evaluated offline, must get its expectation."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from policies_app.document import PolicyDocument
from policies_app.engine import VersionRef, compile_policy, evaluate


@dataclass(frozen=True)
class TestOutcome:
    index: int
    request: dict
    passed: bool
    expected: dict
    got: dict


def shown(verdict: dict) -> str:
    """An expectation or an outcome as the document writes it: `allowed: false, reason_code: arg_denied`."""
    return ", ".join(f"{key}: {str(value).lower() if isinstance(value, bool) else value}"
                     for key, value in verdict.items() if value is not None)


def run_tests(document: PolicyDocument, ref: VersionRef) -> list[TestOutcome]:
    compiled = compile_policy(document, ref)
    expiring = {rule.id: rule.expires for rule in document.commands if rule.expires}
    now = datetime.now(UTC)
    outcomes = []
    for index, test in enumerate(document.tests):
        # A test of a rule that has expired proves what the rule allowed while it lived: it is
        # judged just before the expiry, so an old narrow rule never blocks the next publish.
        expires = expiring.get(test.expect.rule_id)
        at = expires - timedelta(seconds=1) if expires and expires <= now else now
        decision = evaluate(compiled, test.request, at)
        expected = test.expect.model_dump(exclude_none=True)
        got = {"allowed": decision.allowed, "reason_code": decision.reason_code, "rule_id": decision.rule_id}
        passed = all(got[key] == value for key, value in expected.items())
        outcomes.append(TestOutcome(index, test.request.model_dump(), passed, expected, got))
    return outcomes
