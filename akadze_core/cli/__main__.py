"""``python -m akadze_core.cli``: the ``akadze`` command (the process pool's children run it)."""

from .main import main

if __name__ == "__main__":
    main()
