"""Periodic jobs: triggers (when a schedule fires), schedules declared in code and those
stored in the database, and the timetable a worker fires them from."""
