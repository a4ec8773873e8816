"""A pod network for the test kubelet: 10.244.0.0/16 routed to ``lo`` inside a network
namespace of the test process's own.

EndpointSlices refuse loopback addresses on current Kubernetes, so pods cannot live on
127.0.0.N there. In a namespace made for the test run (``unshare -n``), ``lo`` is brought up
and ``ip route add local 10.244.0.0/16 dev lo`` makes every address of the range local: a pod
binds 10.244.x.y as it would 127.0.0.N, and nothing leaves the namespace.

The test process enters it before any test runs (fixtures.py's ``pytest_configure``), when
it may: as root, while it has one thread (a namespace is per thread). Without it the pods get
loopback addresses, which only Kubernetes before 1.2x accepts; ``WARMGATE_KUBE_NETNS=0``
asks for that.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import threading

POD_NETWORK = "10.244.0.0/16"
API_ADDRESS = "10.244.0.1"
"""The API server's advertised address (and the node's) on the pod network."""
_CLONE_NEWNET = 0x40000000


def pod_network_routed() -> bool:
    """Whether this process's namespace has the pod network (an address of it binds)."""
    with socket.socket() as s, contextlib.suppress(OSError):
        s.bind((API_ADDRESS, 0))
        return True
    return False


def node_address() -> str:
    """The test node's address: on the pod network where routed, else loopback."""
    return API_ADDRESS if pod_network_routed() else "127.0.0.1"


def pod_address(n: int) -> str:
    """The n-th pod address (n >= 2): 10.244.x.y on the pod network, else 127.x.y.z."""
    if pod_network_routed():
        return f"10.244.{(n >> 8) & 255}.{n & 255}"
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def enter() -> str | None:
    """Enter a new network namespace holding the pod network. None when done (or already
    there), else why not (the pods then stay on loopback)."""
    if pod_network_routed():
        return None
    if os.environ.get("WARMGATE_KUBE_NETNS") == "0":
        return "WARMGATE_KUBE_NETNS=0"
    if os.geteuid() != 0:
        return "not root: unshare(CLONE_NEWNET) needs it"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to bring lo up in the namespace"
    if threading.active_count() != 1:
        return "the test process runs threads already: a network namespace is per thread"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}"
    for argv in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "route", "add", "local", POD_NETWORK, "dev", "lo"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"{' '.join(argv)}: {done.stderr.strip()}"
    return None
