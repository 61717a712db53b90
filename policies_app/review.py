"""What the editor shows about a document before it is saved or published: errors at their
lines, lint warnings, its own tests, a diff against the published version, a replay."""

import difflib
from dataclasses import dataclass, field

from policies_app import floor
from policies_app.decisions import ReplayResult, replay
from policies_app.document import DocumentError, PolicyDocument, lines_of, parse_yaml
from policies_app.engine import VersionRef, compile_policy
from policies_app.lint import LintWarning, lint
from policies_app.models import Policy
from policies_app.testing import TestOutcome, run_tests, shown


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
    floor: list[dict] = field(default_factory=list)  # how it widens the platform floor: {line, message}
    floor_number: int | None = None  # the floor in force

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
    in_force = floor.current()
    widened = floor.check(document, in_force) if in_force else []
    line_at = lines_of(source) if widened else None
    result = Review(document=document, warnings=lint(document), tests=run_tests(document, ref), diff=diff,
                    published=published.number if published else None,
                    floor=[{"line": line_at(list(w.location)), "message": w.message} for w in widened],
                    floor_number=in_force.number if in_force else None)
    if with_replay:
        result.replay = replay(policy=policy, compiled=compile_policy(document, ref), limit=replay_limit)
    return result


MARKS = 200  # what the editor marks at most: past that, the first ones are what a person reads


def marks(result: Review, source: str) -> list[dict]:
    """What the editor marks at a line: errors, lint warnings and failing tests, each
    `{line, severity, message}` (a line of None: the document as a whole), at most MARKS."""
    found = [{"line": error.get("line"), "severity": "error",
              "message": f"{error['path'] or 'document'}: {error['message']}"} for error in result.errors]
    document = result.document
    if document is None:
        return found[:MARKS]
    line_at = lines_of(source)
    found += [{"line": widening["line"], "severity": "error", "message": f"platform floor: {widening['message']}"}
              for widening in result.floor]
    rules = [rule.id for rule in document.commands]
    allowed = document.network.allow
    for warning in result.warnings:
        if warning.rule_id in rules:
            location = ["commands", rules.index(warning.rule_id)]
        elif warning.rule_id == "network":
            location = ["network", "allow", *(i for i, entry in enumerate(allowed) if f"`{entry}`" in warning.message)]
        else:
            location = [warning.rule_id]
        found.append({"line": line_at(location[:3]), "severity": "warning", "message": warning.message})
    for outcome in result.tests:
        if len(found) >= MARKS:
            break
        if not outcome.passed:
            got = {key: value for key, value in outcome.got.items() if key in outcome.expected}
            found.append({"line": line_at(["tests", outcome.index]), "severity": "error",
                          "message": f"test {outcome.index + 1} fails: expected {shown(outcome.expected)}, got "
                                     f"{shown(got)}"})
    return found[:MARKS]


def source_diff(old: str, new: str) -> list[DiffLine]:
    lines = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "published", "this", lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "same")
        lines.append(DiffLine(kind, line))
    return lines
