"""What an operator runs against: health and readiness probes, Prometheus
metrics, the count of open websockets (docs/DEPLOY.md)."""
