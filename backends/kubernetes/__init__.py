"""``kind: kubernetes``: the only package that imports ``kubernetes_asyncio`` (in ``client``).

``api``: the narrow interface (and its errors) the backend speaks; ``client``: that interface
over ``kubernetes_asyncio`` and how credentials are found; ``informer``: list + watch + resume;
``observe``: pure readings of the watched objects; ``backend``: the Backend itself.
"""

from backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
