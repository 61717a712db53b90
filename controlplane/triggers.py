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


def no_replace(table: str, trigger: str, clash: str, refusal: str) -> str:
    """A SQLite trigger refusing an insert that meets an existing row (`clash`, a condition on
    the table's columns and NEW's): SQLite's `INSERT OR REPLACE` deletes the row it meets without
    firing DELETE or UPDATE triggers. (PostgreSQL's upsert is an UPDATE, refused by those.)"""
    return (f"CREATE TRIGGER {trigger} BEFORE INSERT ON {table} WHEN EXISTS (SELECT 1 FROM {table} WHERE {clash}) "  # noqa: S608 - DDL from constants
            f"BEGIN SELECT RAISE(ABORT, '{refusal}'); END")


def sqlite_only(*created: str, dropped: Sequence[str]) -> Statements:
    """`statements` for triggers that only SQLite needs: `created`, and `dropped` by name."""

    def statements(vendor: str, *, drop: bool) -> list[str]:
        if vendor != "sqlite":
            return []
        return [f"DROP TRIGGER IF EXISTS {name}" for name in dropped] if drop else list(created)

    return statements
