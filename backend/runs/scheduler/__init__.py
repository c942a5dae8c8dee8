"""Matching pending jobs to machines: passes, the warm hand-overs, the
claim of an idle machine, the choice among offers, and launches.

It changes state only through ``backend.runs.lifecycle`` and sends runners
what ``lifecycle.dispatch`` builds; it is called by the use cases, the
consumers and the tasks, and imports none of them (``.importlinter``).
"""
