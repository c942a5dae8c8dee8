"""Process supervision for the embedded default and the test entry point.

``python -m backend.embedded run`` starts Postgres and Valkey from pip wheels
(unless DATABASE_URL / REDIS_URL point elsewhere), migrates, and supervises
the web server, the Celery worker and Celery beat. ``python -m
backend.embedded test -- <pytest args>`` does the same for the test suite.
Nothing here imports Django: the supervisor runs Django only in children.
"""
