"""Child-process bodies of test_tensor_gpu.py (started with the 'spawn' context, so that each
child has its own CUDA context and talks to the node daemon as a separate DummyClient)."""

import hashlib
import os


def digest(t):
    """sha256 of a CUDA or CPU tensor's bytes."""
    import torch

    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def put_random_cuda(url, key, numel, dtype_name, queue):
    """Puts fresh random data from a CUDA tensor of this process; reports its digest."""
    try:
        import torch

        import mooncake.sparse as mcs

        torch.manual_seed(int.from_bytes(os.urandom(8), "little"))
        t = torch.randn(numel, device="cuda").to(getattr(torch, dtype_name))
        store = mcs.connect(url)
        store.put_tensor(key, t)
        queue.put(("ok", digest(t), store.capabilities()["cuda_ipc_available"]))
        store.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(e), False))


def get_into_cuda(url, key, numel, dtype_name, queue):
    """Reads `key` into a CUDA tensor of this process; reports its digest."""
    try:
        import torch

        import mooncake.sparse as mcs

        out = torch.full((numel,), 7, device="cuda").to(getattr(torch, dtype_name))
        store = mcs.connect(url)
        store.get_tensor_into(key, out)
        queue.put(("ok", digest(out), True))
        store.close()
    except BaseException as e:  # noqa: BLE001
        queue.put(("error", repr(e), False))
