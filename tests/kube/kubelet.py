"""A small test "kubelet" for the real control plane in cluster.py (no container runtime).

It registers a Ready Node that advertises ``nvidia.com/gpu: 1`` (an extended resource, so the
real kube-scheduler decides who gets the GPU), and runs each pod bound to it as a local process:
the first container's ``command + args`` with its ``env`` (over this process's env), where
``{host}`` and ``{port}`` are replaced by the pod's own address (10.244.x.y on the pod network of
netns.py, else 127.0.0.N) and its container port. ``status.podIP`` is that address, so the real
EndpointSlice controller publishes it. The pod turns Ready once its readinessProbe ``httpGet``
answers 2xx/3xx on that address (at once when it has no probe), not-ready when the probe fails.
Pods being deleted have their process stopped and are force-deleted.

Image pulls are simulated with real statuses (podstatus.py): a ``warmgate.test/pull-seconds``
annotation keeps the pod ``ContainerCreating`` that long; an image named ``warmgate.test/bad:...``
ends in ``ErrImagePull`` then ``ImagePullBackOff``. A process that exits is restarted, as
``restartPolicy: Always`` says, and from its second exit waits in ``CrashLoopBackOff`` between
restarts; with ``restartPolicy: Never`` the pod is ``Failed``. A process killed by a signal from
outside (a test killing "the pod") fails its pod, as the loss of its node would: the ReplicaSet
replaces it with a new one.

With ``bind=True`` (a cluster without kube-scheduler) the kubelet binds Pending pods itself.
Several kubelets (each its own ``node_name`` and ``gpus``) make a cluster of several nodes; each
hands its GPUs to the pods it runs as a device plugin would (gpus.py: ``NVIDIA_VISIBLE_DEVICES``,
and a ledger of who held which GPU when, with ``gpu_ledger``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .containers import container_name, podman_argv, runs_in_podman
from .gpus import GpuSlots
from .netns import pod_address
from .podstatus import (
    CRASH_LOOP_AFTER,
    bad_image,
    command_line,
    node_status,
    now,
    pod_env,
    pod_status,
    probe_port,
    pull_seconds,
    running,
    terminated,
    waiting,
)

_Json = dict[str, Any]
_addresses = itertools.count(2)


def next_pod_address(port: int) -> str:
    """The next unused pod address (netns.pod_address: 10.244.x.y on the pod network, else
    127.x.y.z; counting up from 2 per test process) whose ``port`` is bindable."""
    while True:
        n = next(_addresses)
        if n & 255 in (0, 255) or n >= 1 << 16:
            continue
        host = pod_address(n)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return host


@dataclass
class _Workload:
    pod: _Json
    host: str
    port: int
    proc: asyncio.subprocess.Process | None = None  # None while its image is "pulled"
    ready: bool | None = None  # last state reported to the API (None: nothing yet)
    failed: bool = False
    restarts: int = 0
    stopping: bool = False  # being stopped: an exit is no crash, and nothing more is reported
    gpus: list[int] = field(default_factory=list)  # the node's devices it holds (gpus.py)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class TestKubelet:
    """Run with ``async with TestKubelet(api_client) as k:``; see the module docstring."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str = "warmgate-test-node",
        log_dir: Path | None = None,
        probe_period: float = 0.2,
        *,
        bind: bool = True,
        gpus: int = 1,
        crash_backoff: float = 0.5,
        gpu_ledger: Path | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.log_dir = log_dir
        self.probe_period = probe_period
        self.bind = bind
        """Bind Pending pods to this node (no kube-scheduler in the cluster)."""
        self.gpus = gpus
        """``nvidia.com/gpu`` the Node advertises (capacity and allocatable)."""
        self.crash_backoff = crash_backoff
        """Seconds before the first restart in ``CrashLoopBackOff`` (doubling, up to 8x)."""
        self.slots = GpuSlots(node_name, gpus, gpu_ledger)
        self.workloads: dict[str, _Workload] = {}  # by pod uid
        self._deleting: set[str] = set()
        self._killing: list[_Workload] = []  # being stopped: stop() finishes them if cancelled
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TestKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1))
        await self._register_node()
        self._main = asyncio.create_task(self._run(), name="test-kubelet")

    async def stop(self) -> None:
        tasks = [t for t in (self._main, *self._tasks) if t]
        tasks += [w.task for w in self.workloads.values() if w.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        left = {id(w): w for w in [*self.workloads.values(), *self._killing]}
        await asyncio.gather(*(self._kill(w) for w in left.values()))
        self.workloads.clear()
        if self._http:
            await self._http.close()

    # -- node ------------------------------------------------------------------------------

    async def _register_node(self) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name},
            },
            "status": node_status(self.node_name, self.gpus),
        }
        try:
            await self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        await self.core.patch_node_status(
            self.node_name, {"status": node_status(self.node_name, self.gpus)}
        )
        # The API server taints a new Node not-ready; the node lifecycle controller (not run
        # here) lifts that once the Node reports Ready. Lifted here, as it would.
        await self.core.patch_node(
            self.node_name,
            {"spec": {"taints": None}},
            _content_type="application/merge-patch+json",
        )

    # -- pods ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                pods = await self.core.list_pod_for_all_namespaces()
                rv = pods.metadata.resource_version
                seen = set()
                for pod in pods.items:
                    p = self.api.sanitize_for_serialization(pod)
                    seen.add(p["metadata"]["uid"])
                    await self._handle("MODIFIED", p)
                for uid in set(self.workloads) - seen:
                    self._spawn(self._kill(self._retire(uid)))
                async with watch.Watch() as w:
                    async for ev in w.stream(
                        self.core.list_pod_for_all_namespaces,
                        resource_version=rv,
                        timeout_seconds=30,
                        allow_watch_bookmarks=True,
                    ):
                        if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            await self._handle(ev["type"], ev["raw_object"])
            except asyncio.CancelledError:
                raise
            except Exception:  # apiserver restarting, 410 Gone, ...: relist
                await asyncio.sleep(0.5)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _handle(self, kind: str, pod: _Json) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        if kind == "DELETED":
            if uid in self.workloads:
                self._spawn(self._kill(self._retire(uid)))
            return
        node = spec.get("nodeName")
        if node and node != self.node_name:
            return
        if meta.get("deletionTimestamp"):
            if uid not in self._deleting:
                self._deleting.add(uid)
                self._spawn(self._delete(pod))
        elif not node:
            if self.bind:  # else kube-scheduler binds it (or says why it cannot)
                self._spawn(self._bind(pod))
        elif uid not in self.workloads and (pod.get("status") or {}).get("phase") not in (
            "Succeeded",
            "Failed",
        ):
            self._start(pod)

    async def _bind(self, pod: _Json) -> None:
        meta = pod["metadata"]
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        with contextlib.suppress(ApiException):  # 409: already bound
            # Raw response: the client cannot deserialize what a binding create returns.
            resp: Any = await self.core.create_namespaced_pod_binding(
                meta["name"], meta["namespace"], body, _preload_content=False
            )
            resp.release()

    async def _delete(self, pod: _Json) -> None:
        meta = pod["metadata"]
        try:
            w = self.workloads.pop(meta["uid"], None)
            if w:
                await self._kill(w)
            with contextlib.suppress(ApiException):  # 404 / 409: gone or replaced
                await self.core.delete_namespaced_pod(
                    meta["name"],
                    meta["namespace"],
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0,
                        preconditions=client.V1Preconditions(uid=meta["uid"]),
                    ),
                )
        finally:
            self._deleting.discard(meta["uid"])

    def _start(self, pod: _Json) -> None:
        """Take the pod on at once (later events of it find it here), run it in a task."""
        c = pod["spec"]["containers"][0]
        ports = [p["containerPort"] for p in c.get("ports") or []]
        probe = (c.get("readinessProbe") or {}).get("httpGet")
        port = ports[0] if ports else probe_port(c, probe) or 8080
        w = _Workload(pod, next_pod_address(port), port)
        self.workloads[pod["metadata"]["uid"]] = w
        w.task = asyncio.create_task(self._run_pod(w, probe, c))

    async def _run_pod(self, w: _Workload, probe: _Json | None, c: _Json) -> None:
        """Pull (simulated), then run the container, restarting it as its policy says."""
        pod = w.pod
        image = bad_image(pod)
        if image is not None:
            why = f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}"'
            await self._report(w, "Pending", False, waiting("ErrImagePull", why))
            await asyncio.sleep(1.0)
            backoff = f'Back-off pulling image "{image}"'
            await self._report(w, "Pending", False, waiting("ImagePullBackOff", backoff))
            return
        pull = pull_seconds(pod)
        if pull > 0:
            await self._report(w, "Pending", False, waiting("ContainerCreating"))
            await asyncio.sleep(pull)
        with self.slots.held(pod) as w.gpus:
            await self._run_restarting(w, probe, c)

    async def _run_restarting(self, w: _Workload, probe: _Json | None, c: _Json) -> None:
        pod = w.pod
        policy = pod["spec"].get("restartPolicy") or "Always"
        while True:
            code = await self._run_container(w, probe, c)
            if code is None or w.stopping:
                return  # it could not be started (the pod failed), or it is being stopped
            if code < 0:  # killed by a signal from outside: the pod is lost, as with its node
                w.failed = True
                await self._report(w, "Failed", False, terminated(128 - code), retry=True)
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                w.failed = True
                phase = "Failed" if code else "Succeeded"
                await self._report(w, phase, False, terminated(code), retry=True)
                return
            w.restarts += 1
            last = terminated(code)
            if w.restarts >= CRASH_LOOP_AFTER:
                delay = self.crash_backoff * 2 ** min(3, w.restarts - CRASH_LOOP_AFTER)
                name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
                why = f"back-off {delay:g}s restarting failed container={c['name']} pod={name}"
                state = waiting("CrashLoopBackOff", why)
                await self._report(w, "Running", False, state, last_state=last, retry=True)
                await asyncio.sleep(delay)

    async def _run_container(self, w: _Workload, probe: _Json | None, c: _Json) -> int | None:
        """Start the process, report readiness until it exits; its exit code (``None``: it
        could not be started, and the pod is reported ``Failed``)."""
        meta = w.pod["metadata"]
        argv, env = command_line(w.pod, c, w.host, w.port, self.node_name)
        if w.gpus:  # as the NVIDIA device plugin tells a container which cards are its own
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(map(str, w.gpus))
        if runs_in_podman(w.pod):  # its image, with podman (containers.py)
            own = pod_env(w.pod, c, w.host, w.port, self.node_name)
            root = (self.log_dir or Path(tempfile.gettempdir())) / f"volumes-{meta['uid']}"
            argv, env = await podman_argv(self.api, w.pod, c, own, root), dict(os.environ)
        out: Any = asyncio.subprocess.DEVNULL
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = (self.log_dir / f"{meta['namespace']}_{meta['name']}.log").open("ab")
        try:
            if not argv:
                raise ValueError("container has no command (images are not run)")
            w.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=c.get("workingDir") or None,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            w.failed = True
            await self._report(w, "Failed", False, terminated(1, str(e)), retry=True)
            return None
        finally:
            if out is not asyncio.subprocess.DEVNULL:
                out.close()
        started = now()
        w.ready = None
        port = probe_port(c, probe) or w.port
        url = f"http://{w.host}:{port}{(probe or {}).get('path') or '/'}"
        proc = w.proc
        while proc.returncode is None:
            if probe is None:
                ok = True
            else:
                try:
                    assert self._http is not None
                    async with self._http.get(url) as r:
                        ok = 200 <= r.status < 400
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
            if proc.returncode is None and ok != w.ready:
                last = terminated(1) if w.restarts else None
                reported = await self._report(w, "Running", ok, running(started), last_state=last)
                if reported:
                    w.ready = ok
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), self.probe_period)
        return proc.returncode

    async def _report(
        self,
        w: _Workload,
        phase: str,
        ready: bool,
        state: _Json,
        *,
        last_state: _Json | None = None,
        retry: bool = False,
    ) -> bool:
        """Patch the pod's status; False when the API server did not take it (away: the
        caller reports again on its next tick; ``retry``: tried here until it lands)."""
        host = w.host if state.get("running") is not None or w.proc is not None else None
        status = pod_status(
            w.pod,
            host,
            phase=phase,
            ready=ready,
            state=state,
            restarts=w.restarts,
            last_state=last_state,
        )
        meta = w.pod["metadata"]
        while not w.stopping:
            try:
                await self.core.patch_namespaced_pod_status(
                    meta["name"], meta["namespace"], {"status": status}
                )
                return True
            except asyncio.CancelledError:
                raise
            except Exception:  # apiserver away (or the pod gone)
                if not retry:
                    return False
                await asyncio.sleep(self.probe_period)
        return False

    def _retire(self, uid: str) -> _Workload:
        """A workload to stop, listed as being stopped at once: a kill task cancelled before it
        ran (the kubelet stopping) would otherwise leave its process running."""
        w = self.workloads.pop(uid)
        self._killing.append(w)
        return w

    async def _kill(self, w: _Workload) -> None:
        if w not in self._killing:
            self._killing.append(w)
        await self._stop_process(w)  # cancelled (kubelet stopping): stop() finishes it
        if w in self._killing:
            self._killing.remove(w)

    async def _stop_process(self, w: _Workload) -> None:
        w.stopping = True
        if w.task:
            w.task.cancel()
        proc = w.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if runs_in_podman(w.pod):  # its container outlives a killed `podman run`
            rm = await asyncio.create_subprocess_exec(
                "podman",
                "rm",
                "-f",
                "-t",
                "0",
                container_name(w.pod),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await rm.wait()
