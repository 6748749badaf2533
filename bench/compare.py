#!/usr/bin/python3
"""bench/compare.py: attnd's engine against the plain numpy peer, case by case.

Usage: compare.py ./build/attn_bench [--rounds N] [--quick] [--preset P] [--case LIST] [--threads T]
                  [--dtypes W/KV,...]

Runs build/attn_bench and bench/peer_numpy.py as whole runs, alternating them in ABBA order for
--rounds rounds (attnd first in even rounds, numpy first in odd ones) so that slow drifts of a shared
machine fall on both sides, and prints one table: per case the median over rounds of each program's
median ms, and the attnd/numpy ratio (below 1: attnd is faster). Both get the same OpenBLAS thread
count. Machine limits are not measured here (attn_bench --skip-limits): `make bench` does that.
"""
import argparse
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="path to the attn_bench binary")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="OpenBLAS threads for both (default 2)")
    ap.add_argument("--quick", action="store_true", help="fewer reps in both programs")
    ap.add_argument("--preset", default="all", choices=["all", "small", "llama8b"])
    ap.add_argument("--case", default=None, help="comma-separated substrings of case names")
    ap.add_argument("--reps", type=int, default=0, help="exactly N timed reps per case")
    ap.add_argument("--dtypes", default=None,
                    help="attn_bench's weights/KV dtype pairs (default: its own list)")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="interpreter with Debian's numpy (default /usr/bin/python3)")
    return ap.parse_args()


def parse_result(line):
    """'RESULT impl=x case=y ms=z ...' -> dict of the key=value fields."""
    fields = {}
    for tok in line.split()[1:]:
        key, sep, val = tok.partition("=")
        if sep:
            fields[key] = val
    return fields


def run(label, cmd, env):
    """Runs cmd, echoing its table to stderr, and returns {case: ms} from its RESULT lines."""
    print(f"== {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    out = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        for line in proc.stdout:
            if line.startswith("RESULT "):
                f = parse_result(line)
                if "case" not in f or "ms" not in f:
                    sys.exit(f"compare: malformed line from {label}: {line.strip()}")
                out[f["case"]] = float(f["ms"])
            elif line.strip():
                print(f"   {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        sys.exit(f"compare: {label} failed with exit status {proc.returncode}")
    if not out:
        sys.exit(f"compare: {label} printed no RESULT lines")
    return out


def main():
    args = parse_args()
    if args.rounds < 1:
        sys.exit("compare: --rounds must be >= 1")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads))
    # The peer has the engine's own presets only, not attn_bench's family variants.
    presets = "small,llama8b" if args.preset == "all" else args.preset
    common = ["--threads", str(args.threads), "--preset", presets]
    if args.quick:
        common.append("--quick")
    if args.case:
        common += ["--case", args.case]
    if args.reps > 0:
        common += ["--reps", str(args.reps)]
    dtypes = ["--dtypes", args.dtypes] if args.dtypes else []
    peer = os.path.join(HERE, "peer_numpy.py")
    cmds = {
        "attnd": [args.bench, "--skip-limits"] + common + dtypes,
        "numpy": [args.python, peer] + common,
    }

    # The peer is only worth comparing against if it computes attention correctly.
    subprocess.run([args.python, peer, "--self-check"], check=True, env=env,
                   stdout=sys.stderr)

    runs = {"attnd": [], "numpy": []}
    for r in range(args.rounds):
        order = ("attnd", "numpy") if r % 2 == 0 else ("numpy", "attnd")
        for impl in order:
            runs[impl].append(run(f"round {r + 1}/{args.rounds} {impl}", cmds[impl], env))

    # attnd names each case <case>@<weights dtype>/<KV dtype>; the peer computes in float32, so
    # every dtype's row is set against the same numpy case.
    def base(c):
        return c.split("@")[0]
    cases = [c for c in runs["attnd"][0] if all(base(c) in run_ for run_ in runs["numpy"])]
    missing = sorted(set(map(base, runs["attnd"][0])) ^ set(runs["numpy"][0]))
    print(f"\nattnd engine vs plain numpy (float32), OPENBLAS_NUM_THREADS={args.threads}, "
          f"{args.rounds} round(s) alternated ABBA; ms = median over rounds of each run's median")
    print(f"{'case @ weights/KV dtype':<36} {'attnd ms':>11} {'numpy ms':>11} {'attnd/numpy':>12}")
    logs = {}
    for c in cases:
        a = statistics.median(run_[c] for run_ in runs["attnd"] if c in run_)
        n = statistics.median(run_[base(c)] for run_ in runs["numpy"])
        logs.setdefault(c.partition("@")[2], []).append(math.log(a / n))
        print(f"{c:<36} {a:11.3f} {n:11.3f} {a / n:12.3f}")
    for dt, lg in logs.items():
        print(f"{'geometric mean @' + dt:<36} {'':>11} {'':>11} {math.exp(sum(lg) / len(lg)):12.3f}")
    if missing:
        print(f"cases only one side ran: {', '.join(missing)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
