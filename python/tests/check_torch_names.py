"""The names the backend takes: "xccl" and "xccl_cpu" where PyTorch's own XCCL (Intel GPUs) is
not built in, only "xccl_cpu" (with a warning, PyTorch's "xccl" left alone) where it is.

    python check_torch_names.py plain        # this torch: both names, one-rank group works
    python check_torch_names.py xpu-build    # as in an XPU build: is_xccl_available() true

Prints "rank 0: ok names <mode>"; any failure raises.
"""

import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist


def main(mode):
    if mode == "xpu-build":
        # What PyTorch's XPU builds report; their own "xccl" is registered lazily by its entry
        # point, and must stay theirs.
        dist.is_xccl_available = lambda: True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import xccl.torch
    plugins = dist.Backend._plugins
    def ours(p):
        return p is not None and getattr(p.creator_fn, "func", None) is xccl.torch._create

    assert ours(plugins.get("XCCL_CPU")), "xccl_cpu is registered"
    mine = ours(plugins.get("XCCL"))
    said = [str(w.message) for w in caught if "xccl_cpu" in str(w.message)]
    if mode == "xpu-build":
        assert not mine, "PyTorch's own 'xccl' was replaced"
        assert said, "no warning that only 'xccl_cpu' was registered"
        assert dist.Backend.backend_capability.get("xccl") == ["xpu"], dist.Backend.backend_capability.get("xccl")
    else:
        assert mine and not said, "both names are this backend's"
        # A one-rank group on each name, through a FileStore.
        for name in ("xccl", "xccl_cpu"):
            with tempfile.TemporaryDirectory() as d:
                store = dist.FileStore(os.path.join(d, "store"), 1)
                dist.init_process_group(name, store=store, rank=0, world_size=1)
                t = torch.arange(4.0)
                dist.all_reduce(t)
                assert torch.equal(t, torch.arange(4.0)) and dist.get_backend() == name
                # The backend says the name it was registered under (DDP's logging reads it).
                assert dist.group.WORLD._get_backend(torch.device("cpu")).name() == name
                dist.destroy_process_group()
    print(f"rank 0: ok names {mode}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
