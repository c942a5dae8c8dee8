"""Trainyard: the ``trainyard`` command and its Python SDK (``trainyard.api``).

The workflow-file schema and the provider SDK it validates with are the
``trainyard_spec`` package, shared with the server."""

__version__ = "0.1.0"
