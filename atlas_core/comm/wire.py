"""Messages over a stream socket: a length-prefixed JSON header, then the raw bytes of NumPy arrays.

Nothing is unpickled: a peer can send only JSON values and arrays of plain dtypes (bf16 and fp8
through ``ml_dtypes`` included), so a rank never runs code another process sent it.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import struct
from collections.abc import Sequence
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 names with NumPy's dtype parser)
import numpy as np

from atlas_core.comm import CommError

LENGTH = struct.Struct("<Q")
MAX_HEADER_BYTES = 64 * 2**20
MAX_ARRAY_BYTES = 2**40
"""More array bytes than this in one message means the stream is not Atlas's (a refusal, not an allocation)."""
ALIGN = 16
"""A message's arrays start at this multiple of bytes from its start."""


class PeerLostError(CommError):
    """The other end closed the connection (its process ended) or the connection broke."""


class PeerTimeoutError(CommError):
    """The other end sent nothing within the time allowed."""


def encode_message(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> list[memoryview]:
    """``header`` (JSON-serialisable) and ``arrays`` as the buffers of one message, in order (`decode_message`
    reads them back joined)."""
    contiguous = [np.ascontiguousarray(array) for array in arrays]
    meta = {"header": header, "arrays": [[_dtype_name(array.dtype), list(array.shape)] for array in contiguous]}
    encoded = json.dumps(meta).encode()
    encoded += b" " * (-(LENGTH.size + len(encoded)) % ALIGN)  # the arrays start aligned (JSON allows the spaces)
    parts = [memoryview(LENGTH.pack(len(encoded)) + encoded)]
    return parts + [array.reshape(-1).view(np.uint8).data for array in contiguous if array.size]


@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
    """``dtype.name`` (which NumPy works out anew on every access: 1.5 us, eight of them a posted step)."""
    return dtype.name


@functools.cache
def _dtype(name: str) -> np.dtype:
    """The dtype named ``name`` (parsed once per name)."""
    return np.dtype(name)


def send_message(sock: socket.socket, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
    """Send ``header`` (JSON-serialisable) and ``arrays`` as one message; `PeerLostError` if the peer is gone."""
    send_parts(sock, encode_message(header, arrays))


def send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """Send the buffers of an encoded message (`encode_message`); `PeerLostError` if the peer is gone."""
    try:
        _send_parts(sock, list(parts))
    except TimeoutError as exc:
        raise PeerTimeoutError("timed out sending to a peer that stopped reading") from exc
    except OSError as exc:
        raise PeerLostError(f"the connection to a peer broke while sending ({exc})") from exc


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The next message: ``(header, arrays)``. `PeerLostError` at end of stream, `PeerTimeoutError`
    when the socket's timeout passes first."""
    (length,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
    header, layout = _meta(length, lambda: _recv_exact(sock, length))
    return header, _arrays(layout, _recv_exact(sock, _array_bytes(layout)))


def decode_message(data: bytes | bytearray) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The ``(header, arrays)`` of one encoded message whose buffers are joined in ``data``; `CommError` when
    ``data`` is not such a message."""
    if len(data) < LENGTH.size:
        raise CommError(f"a peer sent a {len(data)}-byte message, shorter than its length field")
    (length,) = LENGTH.unpack_from(data)
    start = LENGTH.size + length
    header, layout = _meta(length, lambda: data[LENGTH.size : start])
    if len(data) - start != _array_bytes(layout):
        raise CommError("a peer sent a message whose arrays do not match its header")
    return header, _arrays(layout, memoryview(data)[start:])


def _meta(length: int, read: Any) -> tuple[dict[str, Any], list[tuple[np.dtype, tuple[int, ...], int]]]:
    """A message's header and its arrays' (dtype, shape, element count), from ``read()``: its ``length``-byte
    JSON. `CommError` for anything else (a malformed header, negative sizes, more than `MAX_ARRAY_BYTES`)."""
    if length > MAX_HEADER_BYTES:
        raise CommError(f"a peer sent a {length}-byte message header; is something else listening on this port?")
    try:
        meta = json.loads(read())
        header = meta["header"]
        layout = [(_dtype(name), tuple(int(size) for size in shape)) for name, shape in meta["arrays"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CommError(f"a peer sent a malformed message header ({exc})") from exc
    if any(size < 0 for _, shape in layout for size in shape):
        raise CommError("a peer sent an array of negative size")
    counted = [(dtype, shape, math.prod(shape)) for dtype, shape in layout]
    if _array_bytes(counted) > MAX_ARRAY_BYTES:
        raise CommError(f"a peer announced {_array_bytes(counted)} bytes of arrays; is something else on this port?")
    return header, counted


def _array_bytes(layout: list[tuple[np.dtype, tuple[int, ...], int]]) -> int:
    return sum(dtype.itemsize * count for dtype, _, count in layout)


def _arrays(layout: list[tuple[np.dtype, tuple[int, ...], int]], data: Any) -> list[np.ndarray]:
    """The arrays of ``layout`` over their bytes ``data`` (one after another); each aligned for its dtype."""
    arrays, offset = [], 0
    for dtype, shape, count in layout:
        array = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        arrays.append(array if offset % dtype.alignment == 0 else array.copy())
        offset += count * dtype.itemsize
    return arrays


def _send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """Send the buffers ``parts`` in order, with as few system calls as the socket takes (one for a step's batch)."""
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= parts[0].nbytes:
            sent -= parts[0].nbytes
            parts.pop(0)
        if sent:
            parts[0] = parts[0][sent:]


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, received = memoryview(buffer), 0
    while received < size:
        try:
            got = sock.recv_into(view[received:])
        except TimeoutError as exc:
            raise PeerTimeoutError(f"no message from the peer within {sock.gettimeout()} s") from exc
        except OSError as exc:
            raise PeerLostError(f"the connection to a peer broke ({exc})") from exc
        if got == 0:
            raise PeerLostError("the peer closed the connection (its process ended)")
        received += got
    return buffer
