"""replaceproj: a task that replaces itself (``Task.replace``), for the kill test.

With ``REPLACEPROJ_KILL_MARK`` set, the first run of ``replaced`` SIGKILLs its own worker
process after the hand-over statement ran and before its transaction commits (the marker
file makes later runs go through): what a worker lost between sending the replacement and
ending the task leaves behind. Every run of ``replaced`` and of ``add`` appends a line to
``REPLACEPROJ_RUNS`` so the test can count them.
"""

import os
import signal

import akadze_core.execution.context
from akadze_compat import Celery

app = Celery("replaceproj")
app.conf.worker_prefetch_multiplier = 1

_hand_over = akadze_core.execution.context.JobContext.hand_over


def _killing_hand_over(self, connection, to):
    _hand_over(self, connection, to)
    mark = os.environ.get("REPLACEPROJ_KILL_MARK")
    if mark and not os.path.exists(mark):
        with open(mark, "w", encoding="utf-8") as file:
            file.write(str(to))
        os.kill(os.getpid(), signal.SIGKILL)


akadze_core.execution.context.JobContext.hand_over = _killing_hand_over


def _ran(what):
    path = os.environ.get("REPLACEPROJ_RUNS")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(what + "\n")


@app.task
def add(x, y):
    _ran("add")
    return x + y


@app.task
def mul(x, y):
    _ran("mul")
    return x * y


@app.task(bind=True)
def replaced(self, x, y):
    _ran("replaced")
    return self.replace(add.s(x, y))
