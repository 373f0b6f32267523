# The broker comes from the environment (CELERY_BROKER_URL), as in production.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
timezone = "UTC"
