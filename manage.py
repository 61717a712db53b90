#!/usr/bin/env python
"""Airlock's command-line utility (Django's manage.py)."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.exceptions import ImproperlyConfigured

    try:
        import controlplane.settings  # noqa: F401 - fail early, in one line, on a bad environment
    except ImproperlyConfigured as exc:
        sys.exit(f"airlock: configuration error: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
