"""Compute backends: one package per backend, same files in each (docs/BACKENDS.md)."""
