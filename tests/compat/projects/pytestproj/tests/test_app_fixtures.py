import pytest
from proj.tasks import add, boom, flaky

from akadze_compat import current_app, states


def test_a_shared_task_runs_on_the_worker(celery_app, celery_worker):
    assert add.delay(2, 3).get(timeout=10) == 5


def test_a_task_defined_in_the_test_runs(celery_app, celery_worker):
    @celery_app.task
    def mul(x, y):
        return x * y

    celery_worker.reload()
    assert mul.delay(4, 4).get(timeout=10) == 16


def test_a_failure_is_raised_by_get(celery_app, celery_worker):
    result = boom.delay()
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=10)
    assert result.state == states.FAILURE


def test_retries_run_again(celery_app, celery_worker):
    assert flaky.delay(2).get(timeout=10) == 2


@pytest.mark.celery(task_default_queue="urgent")
def test_the_marker_configures_the_app(celery_app, celery_worker):
    assert celery_app.conf.task_default_queue == "urgent"
    assert add.delay(1, 1).get(timeout=10) == 2


def test_celery_config_configures_the_app(celery_app):
    assert celery_app.conf.task_track_started is True


@pytest.mark.celery(task_always_eager=True)
def test_eager_without_a_worker(celery_app):
    assert celery_app.tasks["proj.tasks.add"].delay(3, 4).get(timeout=10) == 7


def test_depends_on_current_app(celery_app, depends_on_current_app):
    assert current_app._get_current_object() is celery_app
