"""Sessions into running jobs: grants, the relay between a client and a job's
runner, and their audit (docs/ACCESS.md)."""
