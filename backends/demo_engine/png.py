"""A minimal PNG encoder (8-bit RGB, no filtering) built on zlib and struct; no Pillow."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(kind)) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def encode_rgb(width: int, height: int, rows: Iterable[bytes], *, level: int = 6) -> bytes:
    """Encode `height` rows of `width * 3` RGB bytes as a PNG file."""
    if width < 1 or height < 1:
        raise ValueError(f"PNG size must be positive, got {width}x{height}")
    stride = width * 3
    compressor = zlib.compressobj(level)
    parts: list[bytes] = []
    count = 0
    for row in rows:
        if len(row) != stride:
            raise ValueError(f"row {count} has {len(row)} bytes, expected {stride}")
        parts.append(compressor.compress(b"\x00" + row))  # filter type 0: None
        count += 1
    if count != height:
        raise ValueError(f"got {count} rows, expected {height}")
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour
    return b"".join(
        (SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", b"".join(parts)), _chunk(b"IEND", b""))
    )


def decode_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; raises ValueError if `data` is not a PNG."""
    if data[:8] != SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)
