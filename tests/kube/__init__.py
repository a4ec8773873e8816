"""A real Kubernetes control plane (v1.20.2 by default, or any version from 1.20 on) plus a test
kubelet for the tests.

cluster.py starts etcd + kube-apiserver + kube-controller-manager (binaries from
``make kube-bins``, or ``$WARMGATE_KUBE_BIN``; flags.py picks their flags by version); netns.py
makes the pod network; kubelet.py runs pods as local processes (containers.py: or from a local
image with podman); fixtures.py has pytest fixtures.
"""
