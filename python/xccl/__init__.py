"""xccl: collective communication between processes or threads, on Python buffers.

A :class:`Communicator` is one rank's handle on a group of ranks; every rank calls the same
collectives in the same order. Buffers are NumPy arrays, memoryviews or bytearrays
(C-contiguous), used in place: results land in the caller's own arrays. Every operation has
an ``_async`` twin (``isend`` / ``irecv`` for ``send`` / ``recv``) that returns a
:class:`Work`. See ``python/README.md``.
"""

from ._xccl import (
    Communicator,
    InvalidArgumentError,
    MismatchError,
    PeerLostError,
    TimeoutError,
    Work,
    XcclError,
    __version__,
)

__all__ = [
    "Communicator",
    "Work",
    "XcclError",
    "PeerLostError",
    "MismatchError",
    "TimeoutError",
    "InvalidArgumentError",
    "__version__",
]
