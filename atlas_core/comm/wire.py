"""Messages over a stream socket: a length-prefixed JSON header, then the raw bytes of NumPy arrays.

Nothing is unpickled: a peer can send only JSON values and arrays of plain dtypes (bf16 and fp8
through ``ml_dtypes`` included), so a rank never runs code another process sent it.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 names with NumPy's dtype parser)
import numpy as np

from atlas_core.comm import CommError

LENGTH = struct.Struct("<Q")
MAX_HEADER_BYTES = 64 * 2**20


class PeerLostError(CommError):
    """The other end closed the connection (its process ended) or the connection broke."""


class PeerTimeoutError(CommError):
    """The other end sent nothing within the time allowed."""


def send_message(sock: socket.socket, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
    """Send ``header`` (JSON-serialisable) and ``arrays`` as one message; `PeerLostError` if the peer is gone."""
    contiguous = [np.ascontiguousarray(array) for array in arrays]
    meta = {"header": header, "arrays": [[array.dtype.name, list(array.shape)] for array in contiguous]}
    encoded = json.dumps(meta).encode()
    try:
        sock.sendall(LENGTH.pack(len(encoded)) + encoded)
        for array in contiguous:
            if array.size:
                sock.sendall(array.reshape(-1).view(np.uint8).data)
    except TimeoutError as exc:
        raise PeerTimeoutError("timed out sending to a peer that stopped reading") from exc
    except OSError as exc:
        raise PeerLostError(f"the connection to a peer broke while sending ({exc})") from exc


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The next message: ``(header, arrays)``. `PeerLostError` at end of stream, `PeerTimeoutError`
    when the socket's timeout passes first."""
    (length,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise CommError(f"a peer sent a {length}-byte message header; is something else listening on this port?")
    try:
        meta = json.loads(_recv_exact(sock, length))
        layout = [(np.dtype(name), tuple(shape)) for name, shape in meta["arrays"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CommError(f"a peer sent a malformed message header ({exc})") from exc
    arrays = []
    for dtype, shape in layout:
        count = int(np.prod(shape, dtype=np.int64))
        data = _recv_exact(sock, count * dtype.itemsize)
        arrays.append(np.frombuffer(data, dtype=dtype, count=count).reshape(shape))
    return meta["header"], arrays


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
