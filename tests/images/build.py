"""Build deploy/images/* for the image tests, with no image registry and no GitHub:

- the base: Debian bookworm made with debootstrap from the machine's own Debian mirror (Python 3
  in a virtual environment at /usr/local, where the python image keeps its ``python``, ``pip``
  and site-packages; the machine's CA bundle, so pip trusts what the host trusts), imported as
  ``localhost/warmgate-test/debian:bookworm``; made once, then reused;
- the engines' sources: small stand-ins (tests/images/comfyui_standin with its ``main.py``,
  tests/images/wgp_standin.py as ``wgp.py``) packed as the release tarballs are (one top
  folder) and served from a file server on 127.0.0.1 for ``COMFYUI_SOURCE``/``WAN2GP_SOURCE``;
- each Dockerfile built as it is, with those as build arguments, tagged
  ``localhost/warmgate-test/<name>:test``; pip reaches PyPI as the host does (``--network
  host``).

    python -m tests.images.build [warmgate comfyui wan2gp]

prints one line per image (build seconds, size) and writes them to ``$WARMGATE_IMAGES_REPORT``
when set. The engine is ``$CONTAINER_ENGINE`` (podman, or docker where there is no podman);
podman runs with tools/images/containers.conf (runc, no default ulimits).
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BASE = "localhost/warmgate-test/debian:bookworm"
IMAGES = ("warmgate", "comfyui", "wan2gp")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
VENV_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def tag(name: str) -> str:
    return f"localhost/warmgate-test/{name}:test"


def engine() -> list[str]:
    """The container engine's command line (podman with the repository's containers.conf)."""
    chosen = os.environ.get("CONTAINER_ENGINE") or (
        "podman" if shutil.which("podman") else "docker"
    )
    if Path(chosen).name == "podman":
        os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "tools/images/containers.conf"))
    return [chosen]


def run(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def exists(image: str) -> bool:
    done = subprocess.run([*engine(), "image", "inspect", image], capture_output=True, check=False)
    return done.returncode == 0


def mirror() -> str:
    """The Debian mirror apt already uses (the machine's own; never written into the repo)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            if line.lower().startswith("uris:"):
                return line.split()[1]
    for line in Path("/etc/apt/sources.list").read_text().splitlines():
        words = line.split()
        if words[:1] == ["deb"] and "security" not in line:
            return next(w for w in words[1:] if "://" in w)
    raise SystemExit("no Debian mirror in the apt sources")


def make_base() -> None:
    """debootstrap's minbase with Python 3 (a venv at /usr/local, first on PATH) and useradd."""
    if exists(BASE):
        return
    with tempfile.TemporaryDirectory(prefix="warmgate-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,passwd,ca-certificates",
            "bookworm",
            str(rootfs),
            mirror(),
            capture_output=True,
        )
        run("chroot", str(rootfs), "python3", "-m", "venv", "/usr/local")
        # The machine's own trust store (it may hold a proxy's CA), for pip in the builds.
        shutil.copyfile(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(
            *engine(),
            "import",
            "--change",
            f"ENV PATH={VENV_PATH}",
            "--change",
            f"ENV PIP_CERT={CA_BUNDLE}",
            "--change",
            'CMD ["python3"]',
            "-",
            BASE,
            stdin=tar.stdout,
            capture_output=True,
        )
        tar.wait()


def tarball(top: str, files: dict[str, Path | bytes]) -> bytes:
    """A .tar.gz with one top folder, as GitHub's archives are."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.read_bytes() if isinstance(content, Path) else content
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(f"{top}/custom_nodes")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    return out.getvalue()


def sources() -> dict[str, bytes]:
    standin = HERE / "comfyui_standin"
    comfy = {
        str(p.relative_to(standin)): p
        for p in sorted(standin.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    return {
        "comfyui.tar.gz": tarball(
            "ComfyUI-standin", {**comfy, "requirements.txt": b"aiohttp>=3.9\n"}
        ),
        "wan2gp.tar.gz": tarball(
            "Wan2GP-standin", {"wgp.py": HERE / "wgp_standin.py", "requirements.txt": b""}
        ),
    }


@contextmanager
def serving(files: dict[str, bytes]) -> Iterator[str]:
    """A file server on 127.0.0.1 for the build's ADD; its base URL."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def build(name: str, url: str) -> dict[str, object]:
    args = {
        "warmgate": [
            "-f",
            "deploy/images/warmgate/Dockerfile",
            "--build-arg",
            f"PYTHON_IMAGE={BASE}",
        ],
        "comfyui": [
            "--build-arg",
            f"PYTORCH_IMAGE={BASE}",
            "--build-arg",
            f"COMFYUI_SOURCE={url}/comfyui.tar.gz",
        ],
        "wan2gp": [
            "--build-arg",
            f"PYTORCH_IMAGE={BASE}",
            "--build-arg",
            f"WAN2GP_SOURCE={url}/wan2gp.tar.gz",
        ],
    }[name]
    context = "." if name == "warmgate" else f"deploy/images/{name}"
    started = time.monotonic()
    run(*engine(), "build", "--network", "host", "-t", tag(name), *args, context, cwd=ROOT)
    seconds = time.monotonic() - started
    size = run(
        *engine(), "image", "inspect", "--format", "{{.Size}}", tag(name), capture_output=True
    ).stdout.strip()
    return {"image": name, "build_seconds": round(seconds, 1), "size_bytes": int(size)}


def main(names: list[str]) -> None:
    started = time.monotonic()
    made = not exists(BASE)
    make_base()
    base_seconds = time.monotonic() - started
    report: list[dict[str, object]] = []
    if made:
        report.append(
            {"image": "debian base (debootstrap)", "build_seconds": round(base_seconds, 1)}
        )
    with serving(sources()) as url:
        for name in names or IMAGES:
            report.append(build(name, url))
    for row in report:
        size = row.get("size_bytes")
        shown = f", {int(size) / 1e6:.0f} MB" if isinstance(size, int) else ""
        print(f"{row['image']}: built in {row['build_seconds']} s{shown}", flush=True)
    if os.environ.get("WARMGATE_IMAGES_REPORT"):
        Path(os.environ["WARMGATE_IMAGES_REPORT"]).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
