import pytest
from proj.celery import app
from proj.tasks import add, send_report

from akadze_compat.contrib.testing.worker import start_worker


@pytest.fixture(scope="module")
def project_worker():
    with start_worker(app, perform_ping_check=False) as worker:
        yield worker


def test_the_project_app_runs_its_own_tasks(project_worker):
    assert send_report.delay(42).get(timeout=10) == {"order": 42, "status": "sent"}


def test_shared_tasks_go_to_the_worker_app(project_worker):
    assert add.delay(40, 2).get(timeout=10) == 42
