import os, subprocess, sys, tempfile
from mooncake.sparse.testing import start_mooncake_master
tmp = tempfile.mkdtemp()
B = os.environ["B"]
variants = [
    "import mooncake.store; import mooncake.sparse; ",
    "import importlib.util, sys; spec=importlib.util.find_spec('mooncake.sparse._errors'); ",
    "import mooncake.sparse._core; ",
    "import ctypes; ctypes.CDLL('libcudart.so.13', mode=ctypes.RTLD_GLOBAL); import mooncake.sparse; ",
    "import ctypes; ctypes.CDLL('libglog.so.1'); ctypes.CDLL('libgflags.so.2.2'); ",
    "import ctypes; ctypes.CDLL('libyaml-cpp.so.0.7'); ",
    "import ctypes; ctypes.CDLL('libglog.so.1', mode=ctypes.RTLD_GLOBAL); ",
    "import mooncake.store; import mooncake.sparse._core as c; ",
]
with start_mooncake_master(tmp) as m:
    for pre in variants:
        code = (pre + "from mooncake.store import MooncakeDistributedStore as S; s=S(); "
                f"print('rc', s.setup('127.0.0.1', '{m.metadata}', 16<<20, 16<<20, 'tcp', '', '{m.address}'))")
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=60)
        out = [l for l in p.stdout.splitlines() if l.startswith("rc")]
        err = [l for l in p.stderr.splitlines() if "Error" in l or "error" in l][:2]
        print(f"{pre!r:95} -> exit {p.returncode} {out} {err}")
print(subprocess.run(["bash", "-c", f"ldd {B}/pyroot/mooncake/sparse/_core*.so | grep -E 'glog|gflags|yaml|cuda|unwind'"], capture_output=True, text=True).stdout)
