"""``python -m akadze_core.contrib.django migrate``: apply akadze's schema to the database of
the Django project's ``TASKS["default"]`` backend (``DJANGO_SETTINGS_MODULE`` set), as
``manage.py migrate`` does for Django's tables."""

from __future__ import annotations

import sys

from . import app_for


def main(argv: list[str]) -> int:
    """Run the command ``argv`` names; the exit status."""
    if argv[:1] != ["migrate"] or len(argv) > 2:
        print("usage: python -m akadze_core.contrib.django migrate [ALIAS]", file=sys.stderr)
        return 2
    applied = app_for(argv[1] if len(argv) > 1 else "default").migrate()
    print(f"applied migrations {', '.join(map(str, applied))}" if applied
          else "the akadze schema is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
