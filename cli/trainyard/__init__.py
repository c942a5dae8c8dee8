"""Trainyard: the ``trainyard`` command, its Python SDK (``trainyard.api``)
and the workflow-file schema shared with the server (``trainyard.workflows``)."""

__version__ = "0.1.0"
