"""router.scale.persist's FileStore reads and writes ``state_dir`` like a careful daemon: a
regular file of at most MAX_DOCUMENT bytes is read (off the event loop, never through a link,
never a FIFO or a device), anything else is ignored with one warning; a save goes through a
fresh temporary file of its own (O_EXCL, no link followed, mode 0600), fsync'd and renamed."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from backends.documents import MAX_DOCUMENT
from router.scale.persist import FileStore

pytestmark = pytest.mark.timeout(20)  # a read that blocks the loop fails here, not the suite


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_document_at_the_limit_is_read_and_one_over_it_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path, "t.")
    head = '{"pad":"'
    at_limit = head + "x" * (MAX_DOCUMENT - len(head) - 2) + '"}'
    assert len(at_limit) == MAX_DOCUMENT
    store.path("timeline").write_text(at_limit)
    assert (await store.load("timeline")) == {"pad": "x" * (MAX_DOCUMENT - len(head) - 2)}
    store.path("timeline").write_text(at_limit + " ")
    assert await store.load("timeline") is None
    (line,) = warnings(caplog)
    assert str(store.path("timeline")) in line and "larger than" in line


async def test_a_fifo_is_not_read_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path, "t.")
    os.mkfifo(store.path("timeline"))
    assert await store.load("timeline") is None
    (line,) = warnings(caplog)
    assert str(store.path("timeline")) in line and "not a regular file" in line


async def test_a_link_a_directory_or_a_device_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text('{"version": 1, "starts": [5.0], "stages": {}}')
    state = tmp_path / "state"
    state.mkdir()
    store = FileStore(state, "t.")
    store.path("cold-start").symlink_to(outside)
    store.path("wake").mkdir()
    store.path("idle").symlink_to("/dev/zero")
    for key in ("cold-start", "wake", "idle"):
        assert await store.load(key) is None, key
    assert len(warnings(caplog)) == 3
    assert await store.load_all("") == {}


async def test_a_save_never_follows_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tmp_path / "state"
    state.mkdir()
    store = FileStore(state, "t.")
    path = store.path("timeline")
    # every name the temporary file could have had before: predictable from the pid
    (state / f".{path.name}.{os.getpid()}.tmp").symlink_to(victim)
    await store.save("timeline", {"v": 1})
    assert victim.read_text() == "precious"
    assert json.loads(path.read_text()) == {"v": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    leftovers = {p.name for p in state.iterdir()} - {path.name, f".{path.name}.{os.getpid()}.tmp"}
    assert leftovers == set(), "no temporary file is left behind"


async def test_a_save_over_a_link_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    store = FileStore(tmp_path / "state", "t.")
    store.path("timeline").parent.mkdir()
    store.path("timeline").symlink_to(victim)
    await store.save("timeline", {"v": 1})
    assert victim.read_text() == "precious"
    assert not store.path("timeline").is_symlink()


async def test_loads_do_not_block_the_loop(tmp_path: Path) -> None:
    """Reads go to a thread: the loop answers while a load is under way."""
    store = FileStore(tmp_path, "t.")
    store.path("timeline").write_text('{"v": 1}')
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        await store.load("timeline")
    finally:
        ticker.cancel()
    assert ticks > 0
