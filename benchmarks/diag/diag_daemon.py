import os, sys, tempfile, time
import mooncake.sparse as mcs
from mooncake.sparse.testing import start_mooncake_master, start_python_node_daemon
tmp = tempfile.mkdtemp()
with start_mooncake_master(tmp + "/m") as m:
    url = m.url(local_hostname="127.0.0.2", segment_bytes=16 << 20)
    for label, env in (("default", {}), ("no cuda", {"CUDA_VISIBLE_DEVICES": ""}),
                       ("no preload", {"MOONCAKE_SPARSE_NO_UPSTREAM_PRELOAD": "1"}),
                       ("no store", None)):
        try:
            with start_python_node_daemon(f"{tmp}/{len(label)}{label[:2]}", url if env is not None else None,
                                          node_id="nodeB", env=env or {}) as d:
                steps = []
                try:
                    s = mcs.connect(d.url); steps.append("connect")
                    s.metrics(); steps.append("metrics")
                    s.manifest((0, 1)); steps.append("manifest")
                    s.capabilities(); steps.append("caps")
                except Exception as e:  # noqa
                    steps.append(f"{type(e).__name__}: {str(e)[:120]}")
                time.sleep(0.5)
                alive = d.process.poll() is None
                print(f"== {label}: steps={steps} alive={alive}")
                if not alive:
                    print("\n".join(l for l in d.log().splitlines() if not l[:5] in ("I1130", "W1130"))[-3000:])
        except Exception as e:  # noqa
            print(f"== {label}: start failed {type(e).__name__}: {str(e)[-1500:]}")
