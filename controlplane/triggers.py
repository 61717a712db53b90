"""Database triggers as migrations make them (docs/architecture.md, "Audit"). A migration that
refuses writes with triggers has a `statements(vendor, *, drop)` function, which the test suite
also calls (tests/append_only.py: it drops the refusals for Django's flush), and one operation
from here that runs those statements forward and back."""

from collections.abc import Callable, Sequence

from django.db import migrations

Statements = Callable[..., list[str]]


def operation(statements: Statements, *, afterwards: dict[str, Sequence[str]] | None = None) -> migrations.RunPython:
    """Forward, `statements(vendor, drop=False)`; backward, `statements(vendor, drop=True)` then
    `afterwards[vendor]` (what only a migration's reversal undoes: a function, a trigger's
    ALWAYS)."""

    def create(apps, schema_editor):
        for statement in statements(schema_editor.connection.vendor, drop=False):
            schema_editor.execute(statement)

    def drop(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        for statement in [*statements(vendor, drop=True), *(afterwards or {}).get(vendor, ())]:
            schema_editor.execute(statement)

    return migrations.RunPython(create, drop)
