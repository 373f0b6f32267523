"""The app ``akadze worker`` loads in tests/integration/test_cli.py.

``App(CLI_TEST_APP_URL or None)``: without that variable the App reads AKADZE_DATABASE_URL;
with it, the app is built with that URL (the tests point it at a dead server to check that
``akadze --database-url`` overrides it).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import timedelta

from psycopg.conninfo import conninfo_to_dict

from akadze_core import App, Fail

app = App(os.environ.get("CLI_TEST_APP_URL") or None)
logger = logging.getLogger("tests.cli_app")


@app.task("cli.add")
def add(a: int, b: int) -> int:
    """Add two numbers (a sync task: it runs in the worker's thread pool)."""
    return a + b


@app.task("cli.refuse")
async def refuse(reason: str) -> None:
    """Fail at once, without further attempts."""
    raise Fail(reason)


@app.task("cli.broken", max_attempts=2, backoff=lambda attempt: timedelta(seconds=0.2))
async def broken(item: str) -> None:
    """Fail every attempt with a two-line message (the worker logs it on one line)."""
    raise ValueError(f"bad id {item}\nsee the vendor's log")


@app.task("cli.block")
def block(seconds: float) -> None:
    """Block a thread for ``seconds``: shutdown cannot interrupt it."""
    time.sleep(seconds)


@app.task("cli.chatty")
async def chatty() -> None:
    """Log the database URL, password included: the worker's log handler must scrub it."""
    logger.info("connected to %s", app.database_url)


@app.task("cli.printer")
def printer() -> None:
    """print() the database URL and its bare password, to stdout and stderr, a piece at a
    time too: the worker must scrub them from what the task prints."""
    url = app.database_url
    password = conninfo_to_dict(url).get("password")
    print("connecting to", url)
    print(f"the secret is {password}", file=sys.stderr)
    sys.stdout.write("postgresql://postgres:")
    sys.stdout.write(f"{password}@db.example/app\n")
    print("done printing", flush=True)


#: Not an App: `akadze worker tests.integration.cli_app:not_an_app` must refuse it.
not_an_app = {"hello": "world"}
