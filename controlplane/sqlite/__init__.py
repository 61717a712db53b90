"""SQLite as Airlock uses it: Django's backend, with a server's writers served in turn (base.py)."""
