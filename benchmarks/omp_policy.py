"""OpenMP wait policies for torch's intra-op threads, idle and with one busy process per core: a tiny
MLP training step (128→256→128, batch 64, fwd + bwd + AdamW), as in the measurement that motivated the
platform's thread policy.

    python benchmarks/omp_policy.py [--steps 400] [--threads 2] [--out results.json]

Each (policy, load) cell is a fresh process (the policy is read when OpenMP starts), interleaved. Policies:
  default       OMP_WAIT_POLICY unset (libgomp spins ~300k iterations before sleeping)
  passive       OMP_WAIT_POLICY=PASSIVE (never spin)
  spin<N>       OMP_WAIT_POLICY unset, GOMP_SPINCOUNT=N (spin briefly, then sleep)
  1thread       torch.set_num_threads(1)
Prints the median and the 90th percentile milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import os, sys, time, json
import torch
torch.set_num_threads(int(sys.argv[1]))
steps = int(sys.argv[2])
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
x, y = torch.randn(64, 128), torch.randn(64, 128)
out = []
for i in range(steps + 20):
    t0 = time.perf_counter()
    loss = torch.nn.functional.mse_loss(net(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if i >= 20:
        out.append((time.perf_counter() - t0) * 1e3)
out.sort()
print(json.dumps({"median_ms": out[len(out) // 2], "p90_ms": out[int(len(out) * 0.9)]}))
"""

POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin100k": {"GOMP_SPINCOUNT": "100000"},
    "1thread": {"_threads": "1"},
}


def cell(policy: str, loaded: bool, threads: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    spec = dict(POLICIES[policy])
    n = int(spec.pop("_threads", threads))
    env.update(spec)
    burners = []
    if loaded:
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(os.sched_getaffinity(0)))
        ]
        time.sleep(0.3)
    try:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), str(steps)], env=env, capture_output=True, text=True, check=True
        )
    finally:
        for b in burners:
            b.kill()
            b.wait()
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = []
    for r in range(args.rounds):
        for loaded in (False, True):
            for policy in POLICIES:
                res = cell(policy, loaded, args.threads, args.steps)
                rows.append({"round": r, "policy": policy, "loaded": loaded, **res})
                print(
                    f"round {r} {'loaded' if loaded else 'idle':6s} {policy:9s} median {res['median_ms']:8.2f} ms"
                    f"  p90 {res['p90_ms']:8.2f} ms",
                    flush=True,
                )
    print("\n| policy | idle median ms | loaded median ms | loaded p90 ms |\n|---|---|---|---|")
    for policy in POLICIES:

        def med(loaded: bool, key: str = "median_ms") -> float:
            v = sorted(x[key] for x in rows if x["policy"] == policy and x["loaded"] == loaded)
            return v[len(v) // 2]

        print(f"| {policy} | {med(False):.2f} | {med(True):.2f} | {med(True, 'p90_ms'):.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
