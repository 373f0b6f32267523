import pytest

pytest_plugins = ("akadze_compat.contrib.pytest",)


@pytest.fixture(scope="session")
def celery_config():
    return {
        "broker_url": "memory://",
        "result_backend": "cache+memory://",
        "task_track_started": True,
    }


@pytest.fixture(scope="session")
def celery_includes():
    return ["proj.tasks"]
