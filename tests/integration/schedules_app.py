"""The app ``akadze schedules`` loads in tests/integration/test_schedules.py.

Built without a URL: the tests pass ``--database-url``, which points the app at their
database (this module is imported once per test session, by whichever test comes first).
"""

from __future__ import annotations

from datetime import timedelta

from akadze_core import App, Cron, Every

app = App()


@app.task("reports.build", queue="reports")
def build(kind: str) -> str:
    """Pretend to build a report."""
    return kind


build.schedule("reports.hourly", trigger=Every(timedelta(hours=1)), args={"kind": "hourly"})
app.add_schedule("reports.nightly", "reports.build",
                 trigger=Cron("0 3 * * *", timezone="Europe/Berlin"), args={"kind": "daily"},
                 queue="night", expires=timedelta(hours=1))
