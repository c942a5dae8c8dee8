"""The state machine of jobs, attempts and runs, and what it tells runners.

Every status change is a compare-and-set in ``transitions``; whether an
ended attempt is tried again is ``retry``'s; groups restart together
(``groups``); when a job may start and what it reads come from the DAG
(``dag``); whether it is served from the cache is decided once
(``cache``, explained by ``cachewhy``); every frame and download URL sent to
a runner is built in ``dispatch``. It imports nothing of the scheduler, the
use cases or the interfaces: those call it (``.importlinter`` holds the
layers). A change that may let a job start asks for a pass through the
``backend.runs.wakeups`` leaf.
"""
