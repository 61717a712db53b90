"""What the editor shows about a document before it is saved or published: errors at their
lines, lint warnings, its own tests, a diff against the published version, a replay."""

import difflib
from dataclasses import dataclass, field

from policies_app.decisions import ReplayResult, replay
from policies_app.document import DocumentError, PolicyDocument, parse_yaml
from policies_app.engine import VersionRef, compile_policy
from policies_app.lint import LintWarning, lint
from policies_app.models import Policy
from policies_app.testing import TestOutcome, run_tests


@dataclass
class DiffLine:
    kind: str  # add, del, hunk, same
    text: str


@dataclass
class Review:
    document: PolicyDocument | None
    errors: list[dict] = field(default_factory=list)
    warnings: list[LintWarning] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    diff: list[DiffLine] = field(default_factory=list)
    replay: ReplayResult | None = None
    published: int | None = None  # the number of the version the diff is against

    @property
    def error_lines(self) -> list[int]:
        return sorted({error["line"] for error in self.errors if error.get("line")})

    @property
    def tests_failed(self) -> int:
        return sum(not outcome.passed for outcome in self.tests)


def review(*, policy: Policy, source: str, number: int = 0, with_replay: bool = False,
           replay_limit: int = 10_000) -> Review:
    published = policy.published_version() if policy.pk else None  # not created yet: nothing published
    diff = source_diff(published.source if published else "", source)
    try:
        document = parse_yaml(source)
    except DocumentError as exc:
        return Review(document=None, errors=exc.errors, diff=diff, published=published.number if published else None)
    ref = VersionRef(policy.name, number, document.sha256())
    result = Review(document=document, warnings=lint(document), tests=run_tests(document, ref), diff=diff,
                    published=published.number if published else None)
    if with_replay:
        result.replay = replay(policy=policy, compiled=compile_policy(document, ref), limit=replay_limit)
    return result


def source_diff(old: str, new: str) -> list[DiffLine]:
    lines = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "published", "this", lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "same")
        lines.append(DiffLine(kind, line))
    return lines
