"""The SQL room: every statement, the connections that carry them, the migrations, and the
reads built on them (lookups, LISTEN wake-ups). Below it only ``model``."""
