import os, subprocess, sys, tempfile, time
from mooncake.sparse.testing import start_mooncake_master
tmp = tempfile.mkdtemp()
def run(args, label):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", args], capture_output=True, text=True, timeout=60, env=env)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if not l[:5] in ("I1130", "W1130")]
    print(f"== {label}: rc={p.returncode}"); print("\n".join(lines[-25:]))
with start_mooncake_master(tmp) as m:
    url = m.url(local_hostname="127.0.0.2", segment_bytes=16 << 20)
    run("import mooncake.sparse._core as c; s=c._NodeServer('%s/a.sock'); print('ok'); s.stop()" % tmp, "node server alone")
    run("import mooncake.store; import mooncake.sparse._core as c; s=c._NodeServer('%s/b.sock'); print('ok'); s.stop()" % tmp, "node server after importing upstream")
    run("from mooncake.sparse._upstream import *; u=UpstreamObjectStore.connect(parse_mooncake_url('%s')); print('client ok'); import mooncake.sparse._core as c; s=c._NodeServer('%s/c.sock'); print('server ok'); s.stop()" % (url, tmp), "upstream client then node server (no adapter)")
    run("from mooncake.sparse._upstream import *; u=UpstreamObjectStore.connect(parse_mooncake_url('%s')); import mooncake.sparse._core as c; s=c._NodeServer('%s/d.sock', sparse_objects=u); print('server ok'); s.stop()" % (url, tmp), "with adapter")
