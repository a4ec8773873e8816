"""The admin listener answers only to the names it is reached by: loopback names and
addresses, the address a request came in on, and ``admin.allowed_hosts``. A web page whose
name is rebound to 127.0.0.1 (DNS rebinding) gets 421 for /status, /events and /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.config import load_config
from router.errors import ConfigError
from tests.helpers import static_config, warmgate


async def status_for(port: int, host: bytes | None, path: bytes = b"/status") -> bytes:
    """The status code the admin listener gives ``path`` with ``Host: host`` (None: none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = b"GET %s HTTP/1.0\r\n" % path
        if host is not None:
            head += b"Host: %s\r\n" % host
        writer.write(head + b"\r\n")
        line = await reader.readline()
        await reader.read()
        return line.split(b" ")[1]
    finally:
        writer.close()


ALLOWED = [b"127.0.0.1", b"127.0.0.1:%d", b"localhost:%d", b"LOCALHOST", b"[::1]:%d", None]
REFUSED = [b"evil.example", b"evil.example:%d", b"127.0.0.1.evil.example", b"", b"warmgate.lan"]


async def test_only_loopback_and_its_own_address_by_default() -> None:
    async with warmgate(static_config("http://127.0.0.1:9")) as wg:
        port = wg.server.admin_port
        for host in ALLOWED:
            sent = host % port if host is not None and b"%d" in host else host
            assert await status_for(port, sent) == b"200", sent
        for host in REFUSED:
            sent = host % port if b"%d" in host else host
            for path in (b"/status", b"/events", b"/metrics", b"/", b"/targets"):
                assert await status_for(port, sent, path) == b"421", (sent, path)


async def test_configured_names_and_wildcards_are_allowed() -> None:
    config = static_config("http://127.0.0.1:9")
    config["admin"] = {"allowed_hosts": ["warmgate.lan", "*.svc.cluster.local"]}
    async with warmgate(config) as wg:
        port = wg.server.admin_port
        for host in (b"warmgate.lan", b"WARMGATE.LAN.:9090", b"admin.ns.svc.cluster.local"):
            assert await status_for(port, host) == b"200", host
        for host in (b"evil.example", b"svc.cluster.local", b".svc.cluster.local"):
            assert await status_for(port, host) == b"421", host


def test_a_bad_allowed_host_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "warmgate.yaml"
    path.write_text(
        "targets:\n  t:\n    backend: {kind: static, url: 'http://127.0.0.1:9'}\n"
        "admin:\n  allowed_hosts: ['http://warmgate.lan/']\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and "admin.allowed_hosts" in message
    assert "host name" in message
