"""SQLite's writers in one process take turns on a lock of their own (controlplane/sqlite/base.py):
held from BEGIN to the commit or rollback, whatever ends the transaction, and never longer."""

import contextlib
import threading

import pytest
from django.db import OperationalError, connection, connections, transaction

from controlplane.models import Tenant
from controlplane.sqlite.base import writer_lock

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the lock serves SQLite's single writer only"),
]


def lock():
    return writer_lock(connection.settings_dict["NAME"])


def in_thread(function):
    """Run `function` on a thread of its own (its own connection), and return what it returned or raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # reported to the caller
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the thread never ended"
    return outcome


def test_a_transaction_holds_the_lock_from_begin_to_commit():
    assert not lock().locked()
    with transaction.atomic():
        assert lock().locked()
        Tenant.objects.create(slug="one", name="One")
        with transaction.atomic():  # a savepoint: the same turn
            Tenant.objects.create(slug="two", name="Two")
        assert lock().locked()
    assert not lock().locked()
    assert Tenant.objects.filter(slug__in=["one", "two"]).count() == 2


def test_a_rolled_back_transaction_gives_its_turn_back():
    with pytest.raises(ValueError), transaction.atomic():
        Tenant.objects.create(slug="gone", name="Gone")
        raise ValueError("the caller failed")
    assert not lock().locked()
    assert not Tenant.objects.filter(slug="gone").exists()
    # The next writer, on another thread, gets in at once.
    assert in_thread(lambda: Tenant.objects.create(slug="next", name="Next").slug) == {"value": "next"}


def test_a_failed_statement_inside_the_transaction_ends_it_and_its_turn():
    Tenant.objects.create(slug="taken", name="Taken")
    with pytest.raises(Exception, match="UNIQUE"), transaction.atomic():
        Tenant.objects.create(slug="taken", name="Twice")
    assert not lock().locked()


@contextlib.contextmanager
def another_thread_writing(slug: str):
    """Another thread holds a write transaction open (having written a tenant `slug`) until the
    block ends."""
    entered, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            Tenant.objects.create(slug=slug, name=slug.title())
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(30)
        yield
    finally:
        release.set()
        holder.join(30)


@contextlib.contextmanager
def database_timeout(seconds: float):
    options = connection.settings_dict["OPTIONS"]  # the dict every connection of the alias reads
    connection.settings_dict["OPTIONS"] = {**options, "timeout": seconds}
    try:
        yield
    finally:
        connection.settings_dict["OPTIONS"] = options


def test_a_writer_waits_for_the_one_writing_and_then_writes():
    result = {}
    second = threading.Thread(target=lambda: result.update(in_thread(
        lambda: Tenant.objects.create(slug="second", name="Second").slug)))
    with another_thread_writing("first"):
        second.start()
        second.join(0.5)
        assert second.is_alive(), "the second writer did not wait for the first"
    second.join(30)
    assert result == {"value": "second"}
    assert list(Tenant.objects.filter(slug__in=["first", "second"]).order_by("pk").values_list("slug", flat=True)) \
        == ["first", "second"]


def hold_a_transaction_while(function):
    """`function`'s outcome on a thread of its own, with a database timeout of 0.2 s, while
    another thread holds a write transaction open."""
    with another_thread_writing("holder"), database_timeout(0.2):
        return in_thread(function)


@pytest.mark.parametrize("write", ["transaction", "single statement"])
def test_a_writer_that_waits_past_the_timeout_fails_with_database_is_locked(write):
    Tenant.objects.create(slug="kept", name="Kept")

    def second():
        if write == "transaction":
            with transaction.atomic():
                Tenant.objects.create(slug="late", name="Late")
        else:  # outside a transaction: SQLite would commit it by itself
            Tenant.objects.filter(slug="kept").update(name="Changed")

    outcome = hold_a_transaction_while(second)
    error = outcome.get("error")
    # This process's lock refused it (SQLite's own message would not name the thread).
    assert isinstance(error, OperationalError) and "another thread of this process" in str(error), outcome
    assert not lock().locked()
    assert not Tenant.objects.filter(slug="late").exists()
    assert Tenant.objects.get(slug="kept").name == "Kept"
    assert Tenant.objects.filter(slug="holder").exists()


def test_reads_do_not_wait_for_a_writer():
    Tenant.objects.create(slug="there", name="There")
    assert hold_a_transaction_while(lambda: Tenant.objects.filter(slug="there").count()) == {"value": 1}


def test_a_transaction_sqlite_ended_by_itself_does_not_wait_for_its_own_turn():
    """After an interrupt or a full disk SQLite rolls the transaction back on its own; the block's
    next write runs (as SQLite runs it: on its own) instead of waiting for the turn it holds."""
    with database_timeout(0.2), transaction.atomic():
        connection.connection.rollback()  # what SQLite does by itself after SQLITE_FULL
        assert not connection.connection.in_transaction and lock().locked()
        Tenant.objects.filter(slug="nobody").update(name="x")  # would wait 0.2 s and fail on its own turn
    assert not lock().locked()
