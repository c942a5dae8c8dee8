"""Writes for runs and jobs, split by concern:

- ``runs``: submitting and stopping a run;
- ``transitions``: every job/run state change (compare-and-set) and its event;
- ``logs``: exactly-once storage of log lines;
- ``scheduling``: matching pending jobs to runners, asking backends for more.
"""
