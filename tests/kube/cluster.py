"""A real, throwaway Kubernetes control plane for tests: etcd + kube-apiserver +
kube-controller-manager + kube-scheduler, on free loopback ports. Any Kubernetes from 1.20 on:
the binaries come from ``$WARMGATE_KUBE_BIN`` (or envtest's ``$KUBEBUILDER_ASSETS``), by
default v1.20.2 built by tools/kube/build.sh; flags.py picks the flags by their version.

Plain module (no pytest): ``with KubeCluster.start() as c: ...``. Nothing runs pods; see
kubelet.py for the test kubelet. The scheduler binds pods to the test kubelet's Node (which
advertises one ``nvidia.com/gpu``), so Unschedulable and preemption are the real scheduler's;
a cache built before the scheduler was added has none, and the test kubelet binds pods itself
(``KubeCluster.has_scheduler``). Recipe: shared/notes/real-kube-apiserver.md.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from . import netns
from .flags import (
    KubeVersion,
    apiserver_flags,
    controller_manager_flags,
    makes_token_secrets,
    scheduler_flags,
)

KUBE_VERSION = "v1.20.2"
DEFAULT_VERSION = KubeVersion.parse(KUBE_VERSION)
DEFAULT_CACHE = "/var/cache/warmgate-kube"
CONTROLLERS = (
    "deployment,replicaset,endpointslice,serviceaccount,serviceaccount-token,"
    "namespace,garbagecollector,job"
)
"""The controllers the suite needs: ``job`` makes a batch Job's pods again when the scheduler
preempts them (the contention day, test_cluster_day.py)."""


class KubeClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class KubeBinaries:
    apiserver: Path
    controller_manager: Path
    etcd: Path
    scheduler: Path | None = None
    """kube-scheduler, when the cache has it (``None``: pods are bound by the test kubelet)."""

    version: KubeVersion = DEFAULT_VERSION
    """kube-apiserver's own (``--version``): the flags and the ServiceAccount tokens follow it."""

    @classmethod
    def directory(cls) -> tuple[Path, str]:
        """Where the binaries are, and which setting said so."""
        for name in ("WARMGATE_KUBE_BIN", "KUBEBUILDER_ASSETS"):
            if os.environ.get(name):
                return Path(os.environ[name]), name
        cache = Path(os.environ.get("WARMGATE_KUBE_CACHE") or DEFAULT_CACHE) / KUBE_VERSION
        return cache, "the default (make kube-bins)"

    @classmethod
    def find(cls) -> KubeBinaries | None:
        """kube-apiserver, kube-controller-manager (and kube-scheduler, and etcd when there)
        from ``$WARMGATE_KUBE_BIN``, else ``$KUBEBUILDER_ASSETS`` (envtest's), else the
        cached 1.20 build; etcd from that directory, else ``$WARMGATE_ETCD``, else Debian's.
        None when one is missing (``missing_in`` says which)."""
        d, _ = cls.directory()
        etcd = (
            d / "etcd"
            if os.access(d / "etcd", os.X_OK)
            else Path(os.environ.get("WARMGATE_ETCD") or shutil.which("etcd") or "/usr/bin/etcd")
        )
        scheduler = d / "kube-scheduler"
        found = cls(
            d / "kube-apiserver",
            d / "kube-controller-manager",
            etcd,
            scheduler if os.access(scheduler, os.X_OK) else None,
        )
        if found.missing():
            return None
        said = subprocess.run(
            [str(found.apiserver), "--version"], capture_output=True, text=True, check=False
        )
        return dataclasses.replace(found, version=KubeVersion.parse(said.stdout + said.stderr))

    @classmethod
    def missing_in(cls) -> str:
        """What find() did not find, for the skip or failure message."""
        d, said_by = cls.directory()
        bins = cls(d / "kube-apiserver", d / "kube-controller-manager", d / "etcd")
        etcd = os.environ.get("WARMGATE_ETCD") or shutil.which("etcd") or "/usr/bin/etcd"
        gone = [p for p in bins.missing() if not (p.endswith("/etcd") and os.access(etcd, 1))]
        return f"{', '.join(gone)} not found (binaries from {said_by}: {d})"

    def missing(self) -> list[str]:
        return [
            str(p)
            for p in (self.apiserver, self.controller_manager, self.etcd)
            if not os.access(p, os.X_OK)
        ]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (all held open together while choosing, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KubeClusterError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def generate_pki(d: Path) -> None:
    """Throwaway CA, serving cert (SAN IP:127.0.0.1) and ServiceAccount key pair in d."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=warmgate-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    (d / "server.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
        f"subjectAltName=IP:127.0.0.1,IP:10.0.0.1,IP:{netns.API_ADDRESS},DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=d,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
        cwd=d,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_dict(server: str, ca_file: str | Path, token: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "warmgate-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "warmgate-test", "user": user}}],
        "current-context": user,
    }


class _Proc:
    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        p, self.popen = self.popen, None
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(5)

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


class KubeCluster:
    """etcd + kube-apiserver + kube-controller-manager on free 127.0.0.1 ports."""

    def __init__(self, binaries: KubeBinaries, workdir: Path | None = None) -> None:
        self.binaries = binaries
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="warmgate-kube-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.admin_token = secrets.token_hex(16)
        etcd_client, etcd_peer, api_port, kcm_port, scheduler_port = _free_ports(5)
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        self.port = api_port
        self.base_url = f"https://127.0.0.1:{api_port}"
        self.ca_file = self.workdir / "ca.crt"
        self.kubeconfig_path = self.workdir / "admin.kubeconfig"
        self.apiserver_start_seconds: float | None = None
        self._ssl: ssl.SSLContext | None = None
        w = str(self.workdir)
        advertise = netns.API_ADDRESS if netns.pod_network_routed() else None
        self._etcd = _Proc(
            "etcd",
            [
                str(binaries.etcd),
                "--name",
                "default",
                "--data-dir",
                f"{w}/etcd",
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{etcd_peer}",
            ],
            self.workdir / "etcd.log",
        )
        self._apiserver = _Proc(
            "kube-apiserver",
            [
                str(binaries.apiserver),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={w}/server.crt",
                f"--tls-private-key-file={w}/server.key",
                f"--client-ca-file={w}/ca.crt",
                f"--token-auth-file={w}/tokens.csv",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--service-account-key-file={w}/sa.pub",
                f"--service-account-signing-key-file={w}/sa.key",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                "--enable-priority-and-fairness=false",
                *apiserver_flags(binaries.version, advertise),
            ],
            self.workdir / "kube-apiserver.log",
        )
        self._controller_manager = _Proc(
            "kube-controller-manager",
            [
                str(binaries.controller_manager),
                f"--kubeconfig={self.kubeconfig_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                *controller_manager_flags(binaries.version),
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={w}/sa.key",
                f"--root-ca-file={w}/ca.crt",
                f"--controllers={CONTROLLERS}",
            ],
            self.workdir / "kube-controller-manager.log",
        )
        self.scheduler_url = f"https://127.0.0.1:{scheduler_port}"
        self._scheduler = (
            _Proc(
                "kube-scheduler",
                [
                    str(binaries.scheduler),
                    f"--kubeconfig={self.kubeconfig_path}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={scheduler_port}",
                    *scheduler_flags(binaries.version),
                    "--leader-elect=false",
                ],
                self.workdir / "kube-scheduler.log",
            )
            if binaries.scheduler is not None
            else None
        )
        self._endpointslice_version: str | None = None

    @property
    def version(self) -> KubeVersion:
        return self.binaries.version

    @property
    def has_scheduler(self) -> bool:
        """kube-scheduler runs: it binds pods (the test kubelet only runs them)."""
        return self._scheduler is not None

    def _procs(self) -> list[_Proc]:
        procs = [self._etcd, self._apiserver, self._controller_manager]
        return procs + ([self._scheduler] if self._scheduler is not None else [])

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        binaries: KubeBinaries | None = None,
        workdir: Path | None = None,
        timeout: float = 90.0,
    ) -> KubeCluster:
        bins = binaries or KubeBinaries.find()
        if bins is None:
            raise KubeClusterError("kube binaries missing: run `make kube-bins`")
        cluster = cls(bins, workdir)
        try:
            cluster._start(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self, timeout: float) -> None:
        generate_pki(self.workdir)
        (self.workdir / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin,"system:masters"\n'
        )
        self.kubeconfig_path.write_text(
            json.dumps(
                kubeconfig_dict(self.base_url, self.ca_file, self.admin_token, "admin"), indent=2
            )
        )
        atexit.register(self.stop)
        self._etcd.start()
        self._wait(lambda: self._http_ok(f"{self.etcd_url}/health"), self._etcd, timeout)
        self._start_apiserver(timeout)
        self._controller_manager.start()
        # The controller-manager is up once it has made the default ServiceAccount.
        self._wait(
            lambda: (
                self._get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None
            ),
            self._controller_manager,
            timeout,
        )
        self._start_scheduler(timeout)

    def _start_scheduler(self, timeout: float) -> None:
        if self._scheduler is not None:
            self._scheduler.start()
            unverified = ssl.create_default_context()
            unverified.check_hostname = False
            unverified.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed
            self._wait(
                lambda: self._http_ok(f"{self.scheduler_url}/healthz", unverified),
                self._scheduler,
                timeout,
            )

    def _start_apiserver(self, timeout: float) -> None:
        t0 = time.monotonic()
        self._apiserver.start()
        self._wait(self.ready, self._apiserver, timeout)
        self.apiserver_start_seconds = time.monotonic() - t0

    def restart_apiserver(self, timeout: float = 90.0, grace: float = 5.0) -> None:
        """Stop kube-apiserver and start it again on the same port against the same etcd.

        SIGTERM, then SIGKILL after ``grace`` s (it waits up to 60 s for open watches
        otherwise). Watch clients see their stream end; resuming from an old resourceVersion
        then gets 410 Gone (the new watch cache starts at etcd's current revision): relist."""
        self._apiserver.stop(grace)
        self._start_apiserver(timeout)
        self._recover_scheduler(timeout)

    def _recover_scheduler(self, timeout: float) -> None:
        """Start kube-scheduler afresh once the API server is back. Its informers would find
        it again by themselves, but client-go's watch backoff grows with each outage (30-60 s
        after the third restart in a minute on 1.36), and a start asked meanwhile would wait
        that long to be placed: a real control plane's liveness probes restart a stuck
        scheduler too, on a longer clock than a test has."""
        if self._scheduler is None or not self._scheduler.alive():
            return
        self._scheduler.stop()
        self._start_scheduler(timeout)

    def stop_apiserver(self, grace: float = 5.0) -> None:
        self._apiserver.stop(grace)

    def start_apiserver(self, timeout: float = 90.0) -> None:
        """Start a stopped kube-apiserver again (see stop_apiserver)."""
        if not self._apiserver.alive():
            self._start_apiserver(timeout)
            self._recover_scheduler(timeout)

    def stop(self) -> None:
        for p in reversed(self._procs()):
            p.stop(5.0)
        atexit.unregister(self.stop)
        if self._own_workdir and not os.environ.get("WARMGATE_KUBE_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pids(self) -> dict[str, int | None]:
        return {p.name: p.pid for p in self._procs()}

    def logs(self, n: int = 30) -> str:
        return "\n".join(f"--- {p.name} ({p.log})\n{p.tail(n)}" for p in self._procs())

    def _wait(self, check: Any, proc: _Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not proc.alive():
                raise KubeClusterError(f"{proc.name} exited:\n{proc.tail()}")
            with contextlib.suppress(OSError, ValueError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise KubeClusterError(f"{proc.name} not ready after {timeout}s:\n{proc.tail()}")
            time.sleep(0.2)

    # -- plain HTTP against the API (admin) ------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def _http_ok(self, url: str, context: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return bool(200 <= r.status < 300)
        except (OSError, urllib.error.HTTPError):
            return False

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """(status, decoded JSON body) for one API request; HTTP errors are returned too."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
            e.close()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def _get_json(self, path: str) -> Any:
        status, body = self.request("GET", path)
        return body if status == 200 else None

    def ready(self) -> bool:
        """/readyz answers 200 (a 500 while RBAC bootstraps is *not* ready: curl -f)."""
        try:
            status, _ = self.request("GET", "/readyz")
        except OSError:
            return False
        return status == 200

    # -- discovery -------------------------------------------------------------------------

    @property
    def endpointslice_api_version(self) -> str:
        """'discovery.k8s.io/v1' where served (1.21+), else 'discovery.k8s.io/v1beta1'."""
        if self._endpointslice_version is None:
            group = self._get_json("/apis/discovery.k8s.io")
            if not group:
                raise KubeClusterError("discovery.k8s.io is not served")
            versions = [v["groupVersion"] for v in group.get("versions", [])]
            self._endpointslice_version = (
                "discovery.k8s.io/v1"
                if "discovery.k8s.io/v1" in versions
                else group["preferredVersion"]["groupVersion"]
            )
        return self._endpointslice_version

    # -- ServiceAccounts -------------------------------------------------------------------

    def service_account_token(
        self, namespace: str, name: str, create: bool = True, timeout: float = 30.0
    ) -> str:
        """A token of a ServiceAccount: from the TokenRequest API (served from 1.20 with the
        issuer flags set here), else from the Secret the controller-manager makes before 1.24.
        Creates the ServiceAccount if missing (and create is true)."""
        sa_path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        if create and self._get_json(sa_path) is None:
            status, body = self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            )
            if status not in (201, 409):
                raise KubeClusterError(f"creating ServiceAccount {namespace}/{name}: {body}")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 86400},
        }
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = self.request("POST", f"{sa_path}/token", request)
            if status == 201:
                return str(body["status"]["token"])
            if status == 404 and self._get_json(sa_path) is not None:
                break  # the ServiceAccount is there, the subresource is not: Secrets
            time.sleep(0.2)
        while makes_token_secrets(self.version) and time.monotonic() < deadline:
            sa = self._get_json(sa_path) or {}
            for ref in sa.get("secrets") or []:
                secret = self._get_json(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                token = ((secret or {}).get("data") or {}).get("token")
                if token:
                    return base64.b64decode(token).decode()
            time.sleep(0.2)
        raise KubeClusterError(f"no token for ServiceAccount {namespace}/{name}")

    def service_account_kubeconfig(
        self, namespace: str, name: str, create: bool = True, path: Path | None = None
    ) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount (only its RBAC applies)."""
        token = self.service_account_token(namespace, name, create=create)
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        path.write_text(json.dumps(kubeconfig_dict(self.base_url, self.ca_file, token, user)))
        return path

    def in_cluster_dir(self, namespace: str, name: str, create: bool = True) -> Path:
        """A directory laid out like /var/run/secrets/kubernetes.io/serviceaccount
        (token, ca.crt, namespace) for code that uses in-cluster config."""
        d = self.workdir / f"sa-{namespace}-{name}"
        d.mkdir(exist_ok=True)
        (d / "token").write_text(self.service_account_token(namespace, name, create=create))
        shutil.copyfile(self.ca_file, d / "ca.crt")
        (d / "namespace").write_text(namespace)
        return d


async def new_api_client(kubeconfig: Path | str) -> Any:
    """A kubernetes_asyncio ApiClient for a kubeconfig file (close it when done)."""
    from kubernetes_asyncio import config  # imported here: the core needs no client

    return await config.new_client_from_config(config_file=str(kubeconfig))
