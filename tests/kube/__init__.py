"""A real Kubernetes control plane (v1.20.2) plus a test kubelet for the tests.

cluster.py starts etcd + kube-apiserver + kube-controller-manager (binaries from
``make kube-bins``); kubelet.py runs pods as local processes; fixtures.py has pytest fixtures.
"""
