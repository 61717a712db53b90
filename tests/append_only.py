"""The database's refusals to change or delete audit rows and policy history, which the test
database drops for Django's flush (tests/conftest.py) and tests of the refusals put back."""

import contextlib
import importlib

from django.db import DatabaseError, connection, transaction

APPEND_ONLY = ["controlplane.migrations.0003_audit_append_only", "controlplane.migrations.0007_audit_triggers_always",
               "policies_app.migrations.0015_history_append_only", "policies_app.migrations.0016_history_always",
               "policies_app.migrations.0017_policy_identity"]


def append_only_statements(vendor: str, *, drop: bool) -> list[str]:
    """The statements that create (or drop) the database's refusals to change or delete audit
    rows and policy history."""
    return [statement for module in APPEND_ONLY
            for statement in importlib.import_module(module).statements(vendor, drop=drop)]


@contextlib.contextmanager
def append_only_enforced():
    """The database as a deployment's: its append-only triggers in place. (PostgreSQL alters no
    table with foreign-key checks pending in the test's transaction: they are run first.)"""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for statement in append_only_statements(connection.vendor, drop=False):
            cursor.execute(statement)
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for statement in append_only_statements(connection.vendor, drop=True):
                cursor.execute(statement)


def refused(sql: str, params: list, *, says: str = "append-only") -> bool:
    """Whether the database refuses the statement, saying `says` (in a savepoint: a refused
    statement aborts PostgreSQL's transaction)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as exc:
        return says in str(exc)
    return False
