"""The ``self-hosted`` backend: ``compute.py`` (``SelfHostedCompute``).

The user's own machines, each registered with ``trainyard-runner register``
(``backend/clouds/services/selfhosted.py``). Nothing is launched or
terminated here; the class exists so that the services treat a self-hosted
account like any other (docs/BACKENDS.md, "The `self-hosted` backend").
"""
