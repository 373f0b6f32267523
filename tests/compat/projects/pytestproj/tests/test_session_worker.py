# The session worker consumes the default queue until the run ends, so this module runs
# last (pytest goes through the files in order).
from proj.tasks import add

workers = []


def test_the_session_worker_runs_tasks(celery_session_app, celery_session_worker):
    workers.append(celery_session_worker)
    assert add.delay(20, 22).get(timeout=10) == 42


def test_the_session_worker_lives_for_the_whole_run(celery_session_worker):
    workers.append(celery_session_worker)
    assert workers[0] is workers[-1]
    assert add.delay(1, 2).get(timeout=10) == 3
