"""Reading and writing rows without the ORM's per-query SQL compilation, for the hot paths that
touch a row or two per request (a command's start and end, a session's token, a tenant's
count). Compiling a query costs Django ~250 µs of CPU, ten times the statement itself; a command
runs about ten of them (docs/architecture.md, "A command's way").

Each helper builds its SQL from the model's metadata (table and column names, quoted by the
connection), prepares every value with its field as the ORM would (`get_db_prep_value`), and
converts what it reads back with the converters the ORM's compiler applies, so SQLite and
PostgreSQL hold and return exactly what the ORM would write and read. Conditions are
equalities, or membership for a tuple or list value; anything richer (and a model that inherits
another's table) belongs to the ORM. Statements run on the default database: Airlock has one."""

import weakref
from collections.abc import Iterable
from functools import lru_cache

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model
from django.db.transaction import TransactionManagementError

_known_readers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # connection -> {field: reader}


def insert(records: list[Model]) -> None:
    """One INSERT statement run for all rows of one model (executemany): what bulk_create does,
    without compiling each row's SQL, which cost more than the write. No signals are sent; the
    instances are marked saved, as create() leaves them."""
    if not records:
        return
    meta = records[0]._meta
    if any(getattr(record, meta.pk.attname) is None for record in records):
        raise ValueError(f"rows.insert needs each {meta.object_name}'s primary key set before the write "
                         "(a default such as uuid4); the database would make it, and the instance not know it")
    db = _database()
    fields = meta.concrete_fields
    table = db.ops.quote_name(meta.db_table)
    columns = ", ".join(db.ops.quote_name(field.column) for field in fields)
    rows = [[field.get_db_prep_save(field.pre_save(record, True), db) for field in fields] for record in records]
    with db.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})",  # noqa: S608
                           rows)
    for record in records:
        record._state.adding, record._state.db = False, db.alias


def update(model: type[Model], where: dict, values: dict) -> int:
    """UPDATE model SET values WHERE where; the number of rows changed (as QuerySet.update)."""
    db = _database()
    sql, fields, where_fields = _statement(model, "update", tuple(values), _shape(where), db.vendor)
    params = [field.get_db_prep_save(value, db) for field, value in zip(fields, values.values(), strict=True)]
    with db.cursor() as cursor:
        cursor.execute(sql, params + _params(where_fields, where, db))
        return cursor.rowcount


def select(model: type[Model], columns: Iterable[str], where: dict, *, for_update: bool = False) -> list[tuple]:
    """The columns (field names) of the rows matching `where`, converted as the ORM reads them;
    `for_update` locks them for the transaction where the database can (PostgreSQL)."""
    db = _database()
    if for_update and not db.in_atomic_block:
        raise TransactionManagementError("rows.select(for_update=True) locks until the transaction ends: run it in one")
    kind = "select for update" if for_update and db.features.has_select_for_update else "select"
    sql, fields, where_fields = _statement(model, kind, tuple(columns), _shape(where), db.vendor)
    with db.cursor() as cursor:
        cursor.execute(sql, _params(where_fields, where, db))
        found = cursor.fetchall()
    readers = _readers(fields, db)
    return [tuple(_convert(value, reader, db) for value, reader in zip(row, readers, strict=True)) for row in found]


def get(model: type[Model], where: dict, *, related: tuple[str, ...] = ()) -> Model | None:
    """The one row matching `where` as an instance, or None; with the rows its foreign keys
    `related` name (paths such as "policy_version__policy") joined in the same SELECT and
    cached on it, as select_related leaves them. More than one row raises ValueError."""
    db = _database()
    sql, models, where_fields = _joined(model, related, _shape(where), db.vendor)
    with db.cursor() as cursor:
        cursor.execute(sql, _params(where_fields, where, db))
        found = cursor.fetchmany(2)
    if len(found) > 1:
        raise ValueError(f"rows.get: more than one {model.__name__} matches")
    if not found:
        return None
    values, instances = iter(found[0]), {}
    for path, joined, parent, via, names, fields, pk_at in models:
        row = [_convert(next(values), reader, db) for reader in _readers(fields, db)]
        instance = None if row[pk_at] is None else joined.from_db(db.alias, names, row)
        instances[path] = instance
        if parent is not None and instances[parent] is not None:
            setattr(instances[parent], via, instance)
    return instances[""]


def count(model: type[Model], where: dict) -> int:
    db = _database()
    sql, _, where_fields = _statement(model, "count", (), _shape(where), db.vendor)
    with db.cursor() as cursor:
        cursor.execute(sql, _params(where_fields, where, db))
        return cursor.fetchone()[0]


def _shape(where: dict) -> tuple:
    """Each condition's field name, and how many values it takes (None: an equality)."""
    if not where:
        raise ValueError("rows: a condition is required (no statement here touches a whole table)")
    shape = []
    for name, value in where.items():
        if isinstance(value, tuple | list | set | frozenset):
            if not value:
                raise ValueError(f"rows: {name} would have to be one of an empty set")
            shape.append((name, len(value)))
        else:
            shape.append((name, None))
    return tuple(shape)


def _params(fields: tuple, where: dict, db) -> list:
    params = []
    for field, value in zip(fields, where.values(), strict=True):
        if isinstance(value, tuple | list | set | frozenset):
            params += [field.get_db_prep_value(item, db, prepared=False) for item in value]
        else:
            params.append(field.get_db_prep_value(value, db, prepared=False))
    return params


@lru_cache(maxsize=256)
def _statement(model: type[Model], kind: str, columns: tuple, shape: tuple, vendor: str) -> tuple[str, list, tuple]:
    """The SQL of one statement, built once per shape: (sql, the fields of `columns`, the fields
    of the conditions)."""
    table = _quote(model._meta.db_table)
    fields = [_field(model, name) for name in columns]
    where, where_fields = _conditions(model, shape)
    if kind == "update":
        assignments = ", ".join(f"{_quote(field.column)} = %s" for field in fields)
        sql = f"UPDATE {table} SET {assignments} WHERE {where}"  # noqa: S608
    elif kind == "count":
        sql = f"SELECT COUNT(*) FROM {table} WHERE {where}"  # noqa: S608
    else:
        selected = ", ".join(_quote(field.column) for field in fields)
        lock = " FOR UPDATE" if kind == "select for update" else ""
        sql = f"SELECT {selected} FROM {table} WHERE {where}{lock}"  # noqa: S608
    return sql, fields, where_fields


@lru_cache(maxsize=64)
def _joined(model: type[Model], related: tuple[str, ...], shape: tuple, vendor: str) -> tuple[str, list, tuple]:
    """rows.get's SELECT: every concrete column of the model and of each related row (LEFT
    JOINs, so a null foreign key gives None); and per model, in column order, (its path, the
    model, its parent's path, the parent's field that holds it, its columns' attribute names,
    their fields, where its primary key is among them)."""
    models = [("", model, None, None)]  # completed below
    aliases = {"": "t0"}
    joins = []
    for path in related:
        parent = ""
        for name in path.split("__"):
            here = f"{parent}__{name}" if parent else name
            if here not in aliases:
                field = next(m for p, m, _, _ in models if p == parent)._meta.get_field(name)
                if not (field.many_to_one or field.one_to_one) or not field.concrete:
                    raise ValueError(f"rows.get: {path} is not a chain of foreign keys")
                aliases[here] = f"t{len(aliases)}"
                joins.append(f"LEFT JOIN {_quote(field.related_model._meta.db_table)} {aliases[here]} ON "
                             f"{aliases[parent]}.{_quote(field.column)} = "
                             f"{aliases[here]}.{_quote(field.target_field.column)}")
                models.append((here, field.related_model, parent, field.name))
            parent = here
    columns = ", ".join(f"{aliases[path]}.{_quote(field.column)}"
                        for path, joined, _, _ in models for field in joined._meta.concrete_fields)
    models = [(path, joined, parent, via, [field.attname for field in joined._meta.concrete_fields],
               joined._meta.concrete_fields,
               joined._meta.concrete_fields.index(joined._meta.pk)) for path, joined, parent, via in models]
    where, where_fields = _conditions(model, shape, "t0.")
    sql = f"SELECT {columns} FROM {_quote(model._meta.db_table)} t0 {' '.join(joins)} WHERE {where}"  # noqa: S608
    return sql, models, where_fields


def _conditions(model: type[Model], shape: tuple, prefix: str = "") -> tuple[str, tuple]:
    """The WHERE clause of `shape`, and the field each condition's values are prepared with. A
    name through a foreign key (`session__tenant`) becomes a subquery on the related table."""
    clauses, fields = [], []
    for name, n in shape:
        test = "= %s" if n is None else f"IN ({', '.join(['%s'] * n)})"
        first, _, rest = name.partition("__")
        field = _field(model, first)
        if rest:
            if not field.many_to_one:
                raise ValueError(f"rows: {name} does not go through a foreign key")
            target = field.related_model
            inner, (final,) = _conditions(target, ((rest, n),))
            subquery = f"SELECT {_quote(field.target_field.column)} FROM {_quote(target._meta.db_table)} WHERE {inner}"  # noqa: S608
            clauses.append(f"{prefix}{_quote(field.column)} IN ({subquery})")
            fields.append(final)
        else:
            clauses.append(f"{prefix}{_quote(field.column)} {test}")
            fields.append(field)
    return " AND ".join(clauses), tuple(fields)


def _field(model: type[Model], name: str):
    """A concrete field by name or attname (`session` and `session_id` alike)."""
    if model._meta.parents:
        raise ValueError(f"rows: {model.__name__} inherits another model's table; use the ORM")
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    if not field.concrete:
        raise ValueError(f"rows: {model.__name__}.{name} is not a column")
    return field


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def _readers(fields, db) -> list[tuple]:
    """Per field, its column expression and the converters the ORM's compiler applies to what
    the database returns for it (the backend's, then the column's: a foreign key's include its
    target's). Converters are bound to one connection (this thread's `db`): kept per connection."""
    known = _known_readers.get(db)
    if known is None:
        known = _known_readers[db] = {}
    readers = []
    for field in fields:
        reader = known.get(field)
        if reader is None:
            column = field.get_col(field.model._meta.db_table)
            reader = known[field] = (column, tuple(db.ops.get_db_converters(column) + column.get_db_converters(db)))
        readers.append(reader)
    return readers


def _convert(value, reader: tuple, db):
    column, converters = reader
    for converter in converters:
        value = converter(value, column, db)
    return value


def _database():
    """This thread's connection, looked up once per statement: `django.db.connection` is a proxy
    that looks it up again on every attribute, and preparing a row's values reads it ~20 times."""
    return connections[DEFAULT_DB_ALIAS]
