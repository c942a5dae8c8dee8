"""Open in JupyterLab and run: the job's own environment and variables."""

import os
import sys

print("python", sys.version.split()[0], "in", sys.prefix)
print("run", os.environ.get("TRAINYARD_RUN_NAME"), "job", os.environ.get("TRAINYARD_JOB_NAME"))
