"""The ``local`` backend: ``compute.py`` (``LocalCompute``), ``process.py``
(runner processes found again by key, also used by the ``fake`` backend) and
``host.py`` (this host's resources)."""
