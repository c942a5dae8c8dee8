"""The Kubernetes backend: one bare Pod per machine in the user's own cluster (docs/BACKENDS.md, "Kubernetes").

``compute.py`` (the contract), ``config.py`` (the kubeconfig and the config
keys), ``client.py`` (the HTTP client: timeouts, TLS, the token),
``errors.py`` (API answers as ``errors.py`` errors), ``pods.py`` (the pod's
manifest, labels, and what a pod's status and events say), ``offers.py``
(node facts and the offers made from them), ``checks.py`` (the connection
check).
"""
