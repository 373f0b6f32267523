from akadze_compat import Celery

app = Celery("proj", include=["proj.tasks"])
app.config_from_object("proj.celeryconfig")
