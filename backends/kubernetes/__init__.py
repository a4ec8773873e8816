"""``kind: kubernetes``: the only package that imports ``kubernetes_asyncio`` (in ``client``).

``api``: the narrow interface (and its errors) the backend speaks; ``client``: that interface
over ``kubernetes_asyncio`` and how credentials are found; ``informer``: list + watch + resume;
``observe``: pure readings of the watched objects; ``backend``: the Backend itself;
``membership``: the other warmgate replicas; ``lease``: the leader Lease.
"""

from backends.kubernetes.backend import KubernetesBackend
from backends.kubernetes.membership import KubernetesMembership

__all__ = ["KubernetesBackend", "KubernetesMembership"]
