"""Writing rows without the ORM's per-row SQL compilation, for the hot paths that insert a row
per request (a decision, a command run) or many at once (an egress proxy's decisions)."""

from django.db import connection
from django.db.models import Model


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
    fields = meta.concrete_fields
    table = connection.ops.quote_name(meta.db_table)
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    rows = [[field.get_db_prep_save(field.pre_save(record, True), connection) for field in fields]
            for record in records]
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})",  # noqa: S608
                           rows)
    for record in records:
        record._state.adding, record._state.db = False, connection.alias
