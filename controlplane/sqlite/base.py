"""Django's SQLite backend, with the writers of one process served in the order they come.

SQLite has one writer at a time. A transaction takes the write lock at BEGIN IMMEDIATE (see
controlplane/env.py); one that finds it taken is retried by SQLite's busy handler, which sleeps
between tries with a growing back-off (1, 2, 5 … up to 100 ms), so a writer that has waited long
sleeps longest and keeps losing to writers that just arrived. Under 20 concurrent sessions some
commands waited 2.5 s behind others' 20 ms; another tenant's requests, which share the lock,
waited with them (bench/sessions.py, bench/fairness.py). Python's sqlite3 module offers no way to
install another busy handler (sqlite3_busy_handler is not exposed: asked of pysqlite in
ghaering/pysqlite#96 and coleifer/pysqlite3#80, both declined; one written in Python would hold
the GIL while it waits).

So the threads of one process take a lock of their own before BEGIN, and hold it to the commit or
rollback (a write outside a transaction, which SQLite commits by itself, holds it for its one
statement): a waiter blocks on the lock (woken as soon as it is free, instead of sleeping out a
back-off), and the process's writers reach SQLite one at a time. Other processes (a management
command, a second server) still meet at SQLite's own lock, as before. The wait is bounded like
SQLite's, by the database's `timeout` option; past it the writer fails `database is locked`, as
it would have without this.

Django starts every outermost atomic block on SQLite through `_start_transaction_under_autocommit`
(it keeps the sqlite3 module in autocommit mode, see django.db.backends.sqlite3.base), and ends it
through `_commit` or `_rollback`, or `_close` when even the rollback failed; its cursors come from
`create_cursor`. Those are the backend's own hooks, overridden here, not patched."""

import threading

from django.db import OperationalError
from django.db.backends.sqlite3 import base

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")  # what SQLite commits by itself outside a transaction

_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def writer_lock(name: str) -> threading.Lock:
    """The lock of one database file, shared by every connection to it in this process."""
    with _locks_lock:
        return _locks.setdefault(name, threading.Lock())


def _take(lock: threading.Lock, timeout: float) -> None:
    if not lock.acquire(timeout=timeout):
        raise OperationalError("database is locked (another thread of this process kept writing past the "
                               "database's timeout)")


class _Cursor(base.SQLiteCursorWrapper):
    """A statement that writes outside a transaction takes the writer's turn for itself (unless
    its connection holds the turn already: SQLite may have ended the transaction by itself, after
    an interrupt or a full disk, and the block's next write must not wait for its own turn)."""

    wrapper: "DatabaseWrapper"
    writer: threading.Lock
    timeout: float

    def execute(self, query, params=None):
        return self._in_turn(super().execute, query, params)

    def executemany(self, query, param_list):
        return self._in_turn(super().executemany, query, param_list)

    def _in_turn(self, run, query, parameters):
        if (self.connection.in_transaction or self.wrapper._writing is not None
                or not query.lstrip()[:7].upper().startswith(WRITES)):
            return run(query, parameters)
        _take(self.writer, self.timeout)
        try:
            return run(query, parameters)
        finally:
            self.writer.release()


class DatabaseWrapper(base.DatabaseWrapper):
    _writing = None  # the writer lock (a threading.Lock) this connection holds, if it holds one

    def create_cursor(self, name=None):
        cursor = self.connection.cursor(factory=_Cursor)
        cursor.wrapper, cursor.writer, cursor.timeout = self, writer_lock(self.settings_dict["NAME"]), self._timeout()
        return cursor

    def _timeout(self) -> float:
        return self.settings_dict["OPTIONS"].get("timeout", 5)

    def _start_transaction_under_autocommit(self):
        lock = writer_lock(self.settings_dict["NAME"])
        _take(lock, self._timeout())
        self._writing = lock  # released as taken, whatever NAME says by then
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._end_writing()
            raise

    def _end_writing(self):
        lock, self._writing = self._writing, None
        if lock is not None:
            lock.release()

    def _commit(self):
        committed = super()._commit()  # a failed commit is rolled back (or the connection closed) next
        self._end_writing()
        return committed

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._end_writing()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._end_writing()
