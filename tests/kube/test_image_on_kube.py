"""The warmgate image (built by ``make test-images``) run as deploy/'s Deployment runs it, against
the suite's real API server: uid 10001, a read-only root filesystem, its config mounted at
/etc/warmgate and the ServiceAccount's token, CA and namespace where a pod has them, the
in-cluster variables set. It serves: /healthz, then a browser's request held while it scales
the engine Deployment from zero (the test kubelet runs the pod), answered from the pod.
Run by ``make test-images`` (``WARMGATE_IMAGES=1``), skipped otherwise."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import yaml

from tests.images.test_images_built import Container, image, podman

from .cluster import free_port
from .test_warmgate_on_kube import (  # noqa: F401  # lab: the fixture
    Lab,
    lab,
)

SERVICEACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


async def test_the_warmgate_image_serves_and_scales_from_zero(
    lab: Lab,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    warmgate = image("warmgate")
    public, admin = free_port(), free_port()
    config = lab.config()
    config["listen"], config["admin_listen"] = f"127.0.0.1:{public}", f"127.0.0.1:{admin}"
    (tmp_path / "config").mkdir()
    (tmp_path / "config/warmgate.yaml").write_text(yaml.safe_dump(config))
    account = await asyncio.to_thread(lab.cluster.in_cluster_dir, lab.namespace, "warmgate", False)
    c = Container(
        "--network",
        "host",
        "--read-only",
        "-v",
        f"{tmp_path / 'config'}:/etc/warmgate:ro",
        "-v",
        f"{account}:{SERVICEACCOUNT}:ro",
        "-e",
        "KUBERNETES_SERVICE_HOST=127.0.0.1",
        "-e",
        f"KUBERNETES_SERVICE_PORT={lab.cluster.port}",
        "-e",
        "POD_NAME=warmgate-0",
        warmgate,
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while True:
                    try:
                        async with http.get(f"http://127.0.0.1:{admin}/healthz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)
            assert await lab.replicas() == 0
            started = time.monotonic()
            page = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}
            async with http.get(f"http://127.0.0.1:{public}/hello", headers=page) as r:
                first = r.status, await r.text()
            # A browser gets the waiting page (it reloads itself) or, when the start was quick
            # enough, the engine itself; an API client is held until the pod is ready.
            async with http.get(f"http://127.0.0.1:{public}/hello") as r:
                status, body = r.status, await r.text()
                cold = r.headers.get("X-Warmgate-Cold-Start")
            answered = time.monotonic() - started
        assert first[0] in (200, 503), first
        assert status == 200 and body.startswith("pid "), (status, body, c.logs())
        assert await lab.replicas() == 1
        print(
            f"\nthe warmgate image scaled the engine from zero: answered {answered:.1f}s after "
            f"the first request (cold start {cold} s as warmgate measured it)"
        )
        user = podman("exec", c.name, "id", "-u").strip()
        assert user == "10001"
    finally:
        logs = c.logs()
        c.remove()
    assert "Traceback" not in logs, logs
