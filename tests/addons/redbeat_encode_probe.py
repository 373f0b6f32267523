"""celery-redbeat's JSON of the schedules a project saves (``RedBeatJSONEncoder``) and back
(``RedBeatJSONDecoder``), with the project's ``celery.schedules``: on akadze they are
akadze_compat's, which RedBeat's ``isinstance`` checks must accept. Prints the JSON and
the decoded schedules' own fields."""

from __future__ import annotations

import json

from celery.schedules import crontab, schedule
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder

saved = {"interval": schedule(30), "relative": schedule(90, relative=True),
         "crontab": crontab(minute="*/15", hour="9-17", day_of_week="mon-fri")}
text = json.dumps(saved, cls=RedBeatJSONEncoder, sort_keys=True)
back = json.loads(text, cls=RedBeatJSONDecoder)
print(json.dumps({
    "json": json.loads(text),
    "back": {"interval": [back["interval"].run_every.total_seconds(),
                          back["interval"].relative],
             "relative": [back["relative"].run_every.total_seconds(),
                          back["relative"].relative],
             "crontab": [type(back["crontab"]).__name__ == "crontab",
                         back["crontab"] == saved["crontab"]]},
}, sort_keys=True))
