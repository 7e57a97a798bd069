import os, subprocess, sys, tempfile
from mooncake.sparse.testing import start_mooncake_master
tmp = tempfile.mkdtemp()
with start_mooncake_master(tmp) as m:
    for pre in ("", "import mooncake.sparse; ", "import torch; import mooncake.sparse; "):
        for host, seg in (("127.0.0.1", 16 << 20), ("127.0.0.2", 16 << 20), ("127.0.0.2", 64 << 20), ("127.0.0.2", 0), ("127.0.0.1", 64 << 20)):
            code = (pre + "from mooncake.store import MooncakeDistributedStore as S; s=S(); "
                    f"print('rc', s.setup('{host}', '{m.metadata}', {seg}, 16<<20, 'tcp', '', '{m.address}'))")
            p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=60)
            out = [l for l in (p.stdout).splitlines() if l.startswith("rc")]
            print(f"pre={pre!r:45} host={host} seg={seg>>20:3d}MiB -> exit {p.returncode} {out}")
