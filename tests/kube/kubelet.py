"""A small test "kubelet" for the real control plane in cluster.py (no container runtime).

It registers a Ready Node, binds Pending pods to it, and runs each pod's first container as a
local process: ``command + args`` with the container's ``env`` (over this process's env), where
``{host}`` and ``{port}`` are replaced by the pod's own loopback address (127.0.0.N, N >= 2) and
its container port. ``status.podIP`` is that address, so the real EndpointSlice controller
publishes it. The pod turns Ready once its readinessProbe ``httpGet`` answers 2xx/3xx on that
address (at once when it has no probe), not-ready when the probe fails, Failed when the process
exits. Pods being deleted have their process stopped and are force-deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

_Json = dict[str, Any]
_addresses = itertools.count(2)


def next_pod_address(port: int) -> str:
    """The next unused 127.0.0.N address (N counts up from 2 per test process) whose
    ``port`` is bindable (Linux routes all of 127.0.0.0/8 to loopback)."""
    while True:
        n = next(_addresses)
        host = f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
        if n & 255 in (0, 255) or n >= 1 << 24:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return host


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _subst(s: str, host: str, port: int) -> str:
    return s.replace("{host}", host).replace("{port}", str(port))


@dataclass
class _Workload:
    pod: _Json
    host: str
    port: int
    proc: asyncio.subprocess.Process
    ready: bool | None = None  # last state reported to the API (None: nothing yet)
    failed: bool = False
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
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.log_dir = log_dir
        self.probe_period = probe_period
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

    def _node_status(self) -> _Json:
        now = _now()
        return {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "local://",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.20.2",
                "kubeProxyVersion": "",
            },
        }

    async def _register_node(self) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name},
            },
            "status": self._node_status(),
        }
        try:
            await self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        await self.core.patch_node_status(self.node_name, {"status": self._node_status()})

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
                    self._spawn(self._kill(self.workloads.pop(uid)))
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
                self._spawn(self._kill(self.workloads.pop(uid)))
            return
        node = spec.get("nodeName")
        if node and node != self.node_name:
            return
        if meta.get("deletionTimestamp"):
            if uid not in self._deleting:
                self._deleting.add(uid)
                self._spawn(self._delete(pod))
        elif not node:
            self._spawn(self._bind(pod))
        elif uid not in self.workloads and (pod.get("status") or {}).get("phase") not in (
            "Succeeded",
            "Failed",
        ):
            await self._launch(pod)

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

    async def _launch(self, pod: _Json) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        c = spec["containers"][0]
        ports = [p["containerPort"] for p in c.get("ports") or []]
        probe = (c.get("readinessProbe") or {}).get("httpGet")
        port = ports[0] if ports else self._probe_port(c, probe) or 8080
        host = next_pod_address(port)
        argv = [_subst(a, host, port) for a in (c.get("command") or []) + (c.get("args") or [])]
        env = dict(os.environ)
        fields = {
            "status.podIP": host,
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "spec.nodeName": self.node_name,
        }
        for e in c.get("env") or []:
            ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            env[e["name"]] = (
                fields.get(ref, "") if ref else _subst(e.get("value") or "", host, port)
            )
        out: Any = asyncio.subprocess.DEVNULL
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = (self.log_dir / f"{meta['namespace']}_{meta['name']}.log").open("ab")
        try:
            if not argv:
                raise ValueError("container has no command (images are not run)")
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=c.get("workingDir") or None,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            await self._patch_status(pod, host, ready=False, failed=True, message=str(e))
            return
        finally:
            if out is not asyncio.subprocess.DEVNULL:
                out.close()
        w = _Workload(pod, host, port, proc)
        self.workloads[meta["uid"]] = w
        w.task = asyncio.create_task(self._probe_loop(w, probe, c))

    @staticmethod
    def _probe_port(c: _Json, probe: _Json | None) -> int | None:
        if not probe:
            return None
        port = probe.get("port")
        if isinstance(port, int):
            return port
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        return int(str(port)) if str(port).isdigit() else None

    async def _probe_loop(self, w: _Workload, probe: _Json | None, c: _Json) -> None:
        assert self._http is not None
        port = self._probe_port(c, probe) or w.port
        url = f"http://{w.host}:{port}{(probe or {}).get('path') or '/'}"
        while True:
            if w.proc.returncode is not None:
                ok, w.failed = False, True
            elif probe is None:
                ok = True
            else:
                try:
                    async with self._http.get(url) as r:
                        ok = 200 <= r.status < 400
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
            if ok != w.ready or w.failed:
                with contextlib.suppress(Exception):  # apiserver away: retry next tick
                    await self._patch_status(w.pod, w.host, ready=ok, failed=w.failed)
                    w.ready = ok
                    if w.failed:
                        return
            await asyncio.sleep(self.probe_period)

    async def _patch_status(
        self, pod: _Json, host: str, ready: bool, failed: bool = False, message: str = ""
    ) -> None:
        meta, c = pod["metadata"], pod["spec"]["containers"][0]
        now, flag = _now(), "True" if ready else "False"
        state: _Json = (
            {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": message,
                    "finishedAt": now,
                }
            }
            if failed
            else {"running": {"startedAt": now}}
        )
        status = {
            "phase": "Failed" if failed else "Running",
            "hostIP": "127.0.0.1",
            "podIP": host,
            "podIPs": [{"ip": host}],
            "startTime": (pod.get("status") or {}).get("startTime") or now,
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": now}
                for t, s in (
                    ("Initialized", "True"),
                    ("PodScheduled", "True"),
                    ("ContainersReady", flag),
                    ("Ready", flag),
                )
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image") or "",
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "started": not failed,
                    "state": state,
                }
            ],
        }
        await self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": status}
        )

    async def _kill(self, w: _Workload) -> None:
        self._killing.append(w)
        await self._stop_process(w)  # cancelled (kubelet stopping): stop() finishes it
        self._killing.remove(w)

    async def _stop_process(self, w: _Workload) -> None:
        if w.task:
            w.task.cancel()
        if w.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(w.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
        await w.proc.wait()
