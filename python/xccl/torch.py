"""The PyTorch process-group backend ``"xccl"``, native: ``ProcessGroupXCCL`` (C++,
``xccl/csrc/``) on xccl's C API, compiled against the installed torch the first time it is
needed (about a minute; cached by PyTorch's extension builder, ``TORCH_EXTENSIONS_DIR``; or
ahead of time with ``python -m xccl.torch``).

Importing this module registers the backend with
``torch.distributed.Backend.register_backend`` for CPU tensors, so that an unmodified
program runs on xccl::

    import torch.distributed as dist
    import xccl.torch  # noqa: F401  (registers "xccl" and "xccl_cpu")

    dist.init_process_group("xccl")  # under torchrun, `xccl run`, or with MASTER_ADDR/PORT set
    dist.all_reduce(tensor)

Each process group (the default one and every ``dist.new_group``) is one xccl communicator,
bootstrapped through the key-value store PyTorch hands to the backend, so no other variables
are needed. Links between ranks prove ``XCCL_SECRET`` where it is set; without it each group
draws its own secret and shares it through its store (so joining a group needs its store).
Every call starts one xccl operation and returns a ``Work`` whose ``wait(timeout)`` waits for
it (on expiry the group's communicator is aborted and the error says so) and whose future
completes when it does, which is what DistributedDataParallel overlaps backward with. No
Python runs per call.

**Names.** PyTorch has a built-in backend called ``"xccl"`` for Intel GPUs, present in its XPU
builds. Where that one is available (``torch.distributed.is_xccl_available()``), this package
leaves the name to it and registers only ``"xccl_cpu"`` (use ``"cpu:xccl_cpu,xpu:xccl"`` for
both); elsewhere it registers both names for the same backend. ``"xccl_cpu"`` is also the name
PyTorch's own test suite does not special-case.

Calls xccl does not provide (bitwise and pre-multiplied reductions, sparse tensors,
receiving from any source, tensors off the CPU) raise ``RuntimeError`` naming the call.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from . import _xccl

__all__ = ["BACKEND", "ALIAS", "native", "register"]

#: The name programs pass to ``torch.distributed.init_process_group``.
BACKEND = "xccl"
#: The name that is always this package's backend (PyTorch's XPU builds own ``"xccl"``).
ALIAS = "xccl_cpu"

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ["ProcessGroupXCCL.cpp", "WorkXCCL.cpp", "init.cpp"]
_module = None


def native():
    """The compiled backend module, built against the installed torch on first use."""
    global _module
    if _module is not None:
        return _module
    from torch.utils import cpp_extension

    try:  # the ninja of the `ninja` package, when the environment's bin/ is not on PATH
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    files = sorted(_CSRC.iterdir())
    digest = hashlib.sha256(torch.__version__.encode())
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    name = f"xccl_c10d_{digest.hexdigest()[:16]}"
    lib = Path(_xccl.__file__).resolve()
    build = Path(cpp_extension._get_build_directory(name, verbose=False))
    # Sources and the library to link against at paths inside the build directory, which
    # depends on the sources only: PyTorch rebuilds when any build argument changes, and the
    # package's own path differs between installs and test directories. At run time the
    # library is found as the module Python already loaded (its soname), wherever it is.
    src, link = build / "src", build / "lib"
    src.mkdir(parents=True, exist_ok=True)
    link.mkdir(parents=True, exist_ok=True)
    for f in files:  # rewritten only when changed: ninja rebuilds what is newer
        if not (src / f.name).exists() or (src / f.name).read_bytes() != f.read_bytes():
            _replace(src / f.name, lambda tmp, f=f: tmp.write_bytes(f.read_bytes()))
    _replace(link / lib.name, lambda tmp: tmp.symlink_to(lib))
    if not any(build.glob(f"{name}*.so")):
        print(
            f"xccl: compiling the native PyTorch backend against torch {torch.__version__} "
            f"(once; cached in {build})",
            file=sys.stderr,
        )
    try:
        _module = cpp_extension.load(
            name=name,
            sources=[str(src / s) for s in _SOURCES],
            extra_include_paths=[str(src)],
            extra_cflags=["-O2"],
            extra_ldflags=[f"-L{link}", f"-l:{lib.name}"],
            verbose=os.environ.get("XCCL_BUILD_VERBOSE") == "1",
        )
    except Exception as e:  # the compiler's or ninja's failure, said with what is needed
        raise RuntimeError(
            f"xccl: building the native PyTorch backend failed ({e}). It needs a C++17 compiler "
            "(apt-get install g++) and ninja (pip install ninja); XCCL_BUILD_VERBOSE=1 shows the "
            "compiler's output"
        ) from e
    return _module


def _replace(path: Path, make) -> None:
    """Makes `path` anew with `make(tmp)`, atomically (ranks of one host may race here)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    make(tmp)
    os.replace(tmp, path)


def _create(store, rank: int, size: int, timeout: timedelta, name: str = BACKEND):
    """The backend's constructor, called by ``init_process_group`` and ``new_group`` on the
    members of each group with the group's store; `name` is the name it was registered under
    (what ``getBackendName`` says)."""
    return native().create(store, rank, size, timeout, name)


def register() -> None:
    """Registers the backend (idempotent; importing this module does it): as ``"xccl"`` and
    ``"xccl_cpu"``, or only as ``"xccl_cpu"`` where PyTorch's own XCCL backend (Intel GPUs)
    is available."""
    plugins = getattr(dist.Backend, "_plugins", {})
    names = [ALIAS]
    if dist.is_xccl_available():
        warnings.warn(
            "xccl: PyTorch's built-in 'xccl' backend (Intel GPUs) is available, so this package "
            f"registers its CPU backend as '{ALIAS}' only (e.g. init_process_group('cpu:{ALIAS},xpu:xccl'))",
            stacklevel=2,
        )
    else:
        names.insert(0, BACKEND)
    for name in names:
        plugin = plugins.get(name.upper())
        if plugin is not None and getattr(getattr(plugin, "creator_fn", None), "func", None) is _create:
            continue
        dist.Backend.register_backend(name, functools.partial(_create, name=name), devices=["cpu"])


register()

if __name__ == "__main__":
    native()
    print(f"xccl: native PyTorch backend ready for torch {torch.__version__}")
