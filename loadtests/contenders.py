"""Start the upstream and the contenders (direct, minimal, nginx, warmgate) for a section."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.harness import PYTHON, Ctx, Procs, StartError, free_port, raise_nofile

HERE = Path(__file__).resolve().parent


@dataclass
class Contender:
    name: str
    port: int
    pid: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@dataclass
class Stack:
    upstream: Contender
    procs: Procs
    contenders: list[Contender] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


Starter = Callable[[Ctx, Procs, int], int]  # (ctx, procs, upstream port) -> listen port


def start_minimal(ctx: Ctx, procs: Procs, up_port: int) -> int:
    port = free_port()
    procs.start(
        "minimal",
        [
            PYTHON,
            "-m",
            "loadtests.minimal_proxy",
            "--port",
            str(port),
            "--upstream",
            f"http://127.0.0.1:{up_port}",
        ],
        cpus=ctx.proxy_cpus,
    )
    return port


def start_nginx(ctx: Ctx, procs: Procs, up_port: int) -> int:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(binary, os.X_OK):
        raise StartError("nginx not installed (apt-get install -y nginx wrk)")
    port, prefix = free_port(), ctx.workdir / "nginx"
    prefix.mkdir(exist_ok=True)
    conf = (
        (HERE / "nginx.conf.template")
        .read_text()
        .format(
            prefix=prefix,
            port=port,
            upstream_port=up_port,
            nofile=raise_nofile(),
            worker_connections=max(4096, 2 * ctx.opts.held + 1024),
            user_directive="user root;" if os.geteuid() == 0 else "",
        )
    )
    (prefix / "nginx.conf").write_text(conf)
    procs.start(
        "nginx",
        [
            binary,
            "-p",
            str(prefix),
            "-c",
            str(prefix / "nginx.conf"),
            "-e",
            str(prefix / "error.log"),
            "-g",
            "daemon off;",
        ],
        cpus=ctx.proxy_cpus,
    )
    return port


def warmgate_binary() -> Path:
    binary = Path(os.environ.get("WARMGATE_BIN") or Path(PYTHON).parent / "warmgate")
    if not binary.exists():
        raise StartError(f"{binary} not found (pip install -e . in the venv)")
    return binary


def start_warmgate_config(
    ctx: Ctx, procs: Procs, name: str, targets: str, access_log: bool = False
) -> tuple[int, int]:
    """warmgate serving ``targets`` (YAML of the targets mapping, indented two spaces);
    returns (public port, admin port). The access log is off like nginx's in this bench."""
    binary = warmgate_binary()
    port, admin = free_port(), free_port()
    cfg = ctx.workdir / f"{name}.yaml"
    cfg.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f"admin_listen: 127.0.0.1:{admin}\n"
        f"server: {{access_log: {str(access_log).lower()}}}\n"
        f"targets:\n{targets}"
    )
    procs.start(name, [str(binary), "serve", "--config", str(cfg)], cpus=ctx.proxy_cpus)
    return port, admin


def start_warmgate(ctx: Ctx, procs: Procs, up_port: int) -> int:
    targets = f"""\
  bench:
    engine: http
    routes: [{{path_prefix: /}}]
    backend: {{kind: static, url: "http://127.0.0.1:{up_port}"}}
    timeouts: {{connect: 5s, response_headers: 300s}}
"""
    access_log = os.environ.get("WARMGATE_ACCESS_LOG", "") == "1"
    return start_warmgate_config(ctx, procs, "warmgate", targets, access_log)[0]


STARTERS: dict[str, Starter] = {
    "minimal": start_minimal,
    "nginx": start_nginx,
    "warmgate": start_warmgate,
}
NAMES = ("direct", *STARTERS)


@contextlib.contextmanager
def stack(ctx: Ctx) -> Iterator[Stack]:
    """Upstream + every wanted contender that starts; a failing one is skipped with a reason."""
    with Procs(ctx.workdir) as procs:
        up_port = free_port()
        up = procs.start(
            "upstream",
            [PYTHON, "-m", "loadtests.upstream", "--port", str(up_port)],
            cpus=ctx.load_cpus,
        )
        procs.wait_http("upstream", up_port, "/small")
        st = Stack(Contender("direct", up_port, up.pid), procs)
        if ctx.opts.wants("direct"):
            st.contenders.append(st.upstream)
        for name, start in STARTERS.items():
            if not ctx.opts.wants(name):
                continue
            try:
                port = start(ctx, procs, up_port)
                procs.wait_http(name, port, "/small")
                st.contenders.append(Contender(name, port, procs.procs[name].pid))
            except StartError as e:
                st.skipped[name] = str(e).splitlines()[0]
                ctx.log(f"!! skipping {name}: {e}")
                procs.stop(name)
        yield st
