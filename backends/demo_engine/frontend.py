"""ComfyUI's web page on the demo engine: the routes its frontend reads beyond the render API
(users, settings, user data, extensions, node definitions, ...) and its static files, from the
``comfyui-frontend-package`` that ComfyUI itself serves when it is installed.

User data and settings live in memory, for the life of the process, as a fresh ComfyUI's
single user would see them; nothing here touches the model, so none of it needs the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from .config import Frontend
from .nodes import CHECKPOINTS, object_info

PACKAGE: Final = "comfyui_frontend_package"

MODEL_FOLDERS: Final = ("checkpoints", "loras", "vae", "embeddings")


class FrontendMissing(RuntimeError):
    """``--frontend comfyui`` without the package installed."""


def web_root(choice: Frontend) -> Path | None:
    """The directory ComfyUI's frontend is served from, or ``None`` for the builtin page."""
    if choice == "builtin":
        return None
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        if choice == "comfyui":
            raise FrontendMissing(
                f"--frontend comfyui: the {PACKAGE!r} package is not installed "
                "(pip install comfyui-frontend-package)"
            )
        return None
    return Path(spec.origin).parent / "static"


@dataclass(slots=True)
class UserFile:
    data: bytes
    modified: int = field(default_factory=lambda: int(time.time() * 1000))

    def info(self, path: str) -> dict[str, Any]:
        return {"path": path, "size": len(self.data), "modified": self.modified}


class UserData:
    """One user's settings and files (workflows the page saves), as ComfyUI's user manager
    answers for them."""

    def __init__(self) -> None:
        # Past the first-visit tutorial: the page opens with ComfyUI's default graph (what the
        # demo renders) rather than a template browser that has no templates here.
        self.settings: dict[str, Any] = {"Comfy.TutorialCompleted": True}
        self.files: dict[str, UserFile] = {}

    async def users(self, request: web.Request) -> web.Response:
        return web.json_response({"storage": "server", "migrated": True})

    async def get_settings(self, request: web.Request) -> web.Response:
        key = request.match_info.get("id")
        return web.json_response(self.settings if key is None else self.settings.get(key))

    async def post_settings(self, request: web.Request) -> web.Response:
        value = await request.json()
        key = request.match_info.get("id")
        if key is not None:
            self.settings[key] = value
        elif isinstance(value, dict):
            self.settings.update(value)
        else:
            return web.json_response({"error": "expected an object"}, status=400)
        return web.Response(status=200)

    async def listing(self, request: web.Request) -> web.Response:
        """``GET /userdata?dir=workflows[&recurse][&full_info]``: 404 for a directory that does
        not exist, as ComfyUI answers (the page takes it as empty)."""
        directory = request.query.get("dir", "").strip("/")
        if not directory:
            return web.json_response({"error": "dir is required"}, status=400)
        prefix = directory + "/"
        found = {p[len(prefix) :]: f for p, f in self.files.items() if p.startswith(prefix)}
        if not found:
            raise web.HTTPNotFound()
        if "recurse" not in request.query:
            found = {p: f for p, f in found.items() if "/" not in p}
        full = request.query.get("full_info", "").lower() == "true"
        return web.json_response([f.info(p) if full else p for p, f in sorted(found.items())])

    async def listing_v2(self, request: web.Request) -> web.Response:
        """``GET /v2/userdata?path=``: the entries of one directory."""
        base = request.query.get("path", "").strip("/")
        prefix = base + "/" if base else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, file in self.files.items():
            if not path.startswith(prefix):
                continue
            head, _, rest = path[len(prefix) :].partition("/")
            if rest:
                entries[head] = {"name": head, "path": prefix + head, "type": "directory"}
            else:
                entries[head] = {"name": head, "type": "file", **file.info(path)}
        return web.json_response(list(entries.values()))

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        file = self.files.get(request.match_info["file"])
        if file is None:
            raise web.HTTPNotFound()
        return web.Response(body=file.data, content_type="application/octet-stream")

    async def post_file(self, request: web.Request) -> web.Response:
        path = request.match_info["file"]
        if ".." in path.split("/") or path.startswith("/"):
            return web.json_response({"error": "bad path"}, status=400)
        if path in self.files and request.query.get("overwrite", "true").lower() == "false":
            return web.json_response({"error": "file exists"}, status=409)
        file = self.files[path] = UserFile(await request.read())
        if request.query.get("full_info", "").lower() == "true":
            return web.json_response(file.info(path))
        return web.json_response(path)

    async def delete_file(self, request: web.Request) -> web.Response:
        if self.files.pop(request.match_info["file"], None) is None:
            raise web.HTTPNotFound()
        return web.Response(status=204)

    async def move_file(self, request: web.Request) -> web.Response:
        source, dest = request.match_info["file"], request.match_info["dest"]
        file = self.files.pop(source, None)
        if file is None:
            raise web.HTTPNotFound()
        self.files[dest] = file
        return web.json_response(file.info(dest))


def _json(body: Any) -> Any:
    text = json.dumps(body)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="application/json")

    return handler


async def _models(request: web.Request) -> web.Response:
    folder = request.match_info["folder"]
    if folder not in MODEL_FOLDERS:
        raise web.HTTPNotFound()
    return web.json_response(list(CHECKPOINTS) if folder == "checkpoints" else [])


async def _experiment_models(request: web.Request) -> web.Response:
    folder = request.match_info["folder"]
    if folder not in MODEL_FOLDERS:
        raise web.HTTPNotFound()
    names = CHECKPOINTS if folder == "checkpoints" else ()
    return web.json_response([{"name": name, "pathIndex": 0} for name in names])


def api_routes(user: UserData) -> list[tuple[str, str, Any]]:
    """What the page asks of the engine besides rendering (served at ``/`` and ``/api/``)."""
    return [
        ("GET", "/object_info", _json(object_info())),
        ("GET", "/embeddings", _json([])),
        ("GET", "/extensions", _json([])),
        ("GET", "/i18n", _json({})),
        ("GET", "/features", _json({"supports_preview_metadata": False})),
        ("GET", "/models", _json(list(MODEL_FOLDERS))),
        ("GET", "/models/{folder}", _models),
        ("GET", "/experiment/models", _json([{"name": f, "folders": []} for f in MODEL_FOLDERS])),
        ("GET", "/experiment/models/{folder}", _experiment_models),
        ("GET", "/workflow_templates", _json({})),
        ("GET", "/users", user.users),
        ("GET", "/settings", user.get_settings),
        ("POST", "/settings", user.post_settings),
        ("GET", "/settings/{id}", user.get_settings),
        ("POST", "/settings/{id}", user.post_settings),
        ("GET", "/userdata", user.listing),
        ("GET", "/v2/userdata", user.listing_v2),
        ("GET", "/userdata/{file}", user.get_file),
        ("POST", "/userdata/{file}", user.post_file),
        ("DELETE", "/userdata/{file}", user.delete_file),
        ("POST", "/userdata/{file}/move/{dest}", user.move_file),
        ("GET", "/internal/logs", _json("")),
        ("GET", "/internal/logs/raw", _json({"entries": [], "size": {"cols": 80, "rows": 24}})),
        ("PATCH", "/internal/logs/subscribe", _json(None)),
        ("GET", "/internal/folder_paths", _json({f: [] for f in MODEL_FOLDERS})),
    ]


def page_routes(root: Path) -> list[web.AbstractRouteDef]:
    """ComfyUI's page itself: ``/`` is its ``index.html`` (never cached, as ComfyUI sends it),
    every other file from the package's directory."""

    async def index(request: web.Request) -> web.FileResponse:
        headers = {"Cache-Control": "no-cache", "Pragma": "no-cache", "Expires": "0"}
        return web.FileResponse(root / "index.html", headers=headers)

    return [web.get("/", index), web.static("/", root)]
