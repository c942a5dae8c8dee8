"""Use cases of runs: what the API, the consumers and the tasks call.

Submitting, previewing, stopping and re-running runs; a runner's hello and
what it fetches; storing, reading, archiving and pruning logs; environments;
tags; the reconciler. A use case may call the scheduler
(``backend.runs.scheduler``) and the state machine
(``backend.runs.lifecycle``), never the interfaces above it (``api``,
``consumers``, ``tasks``); ``.importlinter`` holds the layers.
"""
