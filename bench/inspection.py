#!/usr/bin/env python3
"""bench/inspection.py: what a selection of a call's attention costs (`make inspect-bench`; not a
test). Needs python3-numpy.

One attnd per mode (the small preset, so its peak RSS is the mode's own), each prefilling a
fresh session with T tokens (base64 x), reps times, then one decode step at length T:
  none        no weights
  one-cell    return_weights {heads: [0], rows: [-1]}: one head's last row, every key
  lse         return_weights {kind: lse}: every head and row's log-sum-exp
  decode-all  the decode step with return_weights true (every head, every key: n_heads x (T+1))
Reported: the daemon's own compute_ms (median), and its peak RSS (VmHWM). The full matrix of
the prefill, n_heads x T x T floats, is what the selection must not build: printed for scale.

usage: bench/inspection.py [--attnd build/attnd] [--tokens 8191] [--reps 3]
"""
import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def run_mode(attnd, mode, tokens, reps, hidden, log_dir):
    port = free_port()
    log = open(os.path.join(log_dir, mode + ".log"), "w")
    proc = subprocess.Popen([attnd, "--host", "127.0.0.1", "--port", str(port),
                             "--kv-budget-mb", "512", "--max-body-mb", "256"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            try:
                if request(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        rng = np.random.default_rng(1)
        x = rng.uniform(-1, 1, (tokens + 1, hidden)).astype("<f4")
        x_pre = {"shape": [tokens, hidden], "b64": base64.b64encode(x[:tokens].tobytes()).decode()}
        x_dec = {"shape": [1, hidden], "b64": base64.b64encode(x[tokens:].tobytes()).decode()}
        sel = {"one-cell": {"heads": [0], "rows": [-1]}, "lse": {"kind": "lse"}}.get(mode)
        times, values = [], 0
        for rep in range(reps):
            body = {"session_id": f"s{rep}", "x": x_pre, "encoding_format": "base64"}
            if sel is not None:
                body["return_weights"] = sel
            status, data = request(port, "POST", "/v1/attend", json.dumps(body))
            if status != 200:
                sys.exit(f"{mode}: {status} {data[:300]!r}")
            doc = json.loads(data)
            times.append(doc["timing"]["compute_ms"])
            for name in ("weights", "lse"):
                if name in doc:
                    values = int(np.prod(doc[name]["shape"]))
        dec = {"session_id": "s0", "x": x_dec, "encoding_format": "base64"}
        if mode == "decode-all":
            dec["return_weights"] = True
        status, data = request(port, "POST", "/v1/attend", json.dumps(dec))
        if status != 200:
            sys.exit(f"{mode}: decode {status} {data[:300]!r}")
        doc = json.loads(data)
        if mode == "decode-all":
            values = int(np.prod(doc["weights"]["shape"]))
        return statistics.median(times), doc["timing"]["compute_ms"], values, peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnd", default="build/attnd")
    ap.add_argument("--tokens", type=int, default=8191)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    probe = subprocess.Popen([a.attnd, "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                status, data = request(port, "GET", "/v1/model")
                if status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        model = json.loads(data)
    finally:
        probe.terminate()
        probe.wait()
    hidden, heads = model["hidden_size"], model["num_attention_heads"]
    full = heads * a.tokens * a.tokens * 4 / 2**20
    print(f"small preset: {heads} heads, hidden {hidden}; prefill T={a.tokens} "
          f"(its full probability matrix would be {full:.0f} MiB), {a.reps} reps, 2 threads")
    print(f"{'mode':<11} {'prefill ms':>11} {'vs none':>8} {'decode ms':>10} {'values':>9} "
          f"{'peak RSS MiB':>13}")
    with tempfile.TemporaryDirectory() as logs:
        base = None
        for mode in ("none", "one-cell", "lse", "decode-all"):
            pre, dec, values, rss = run_mode(a.attnd, mode, a.tokens, a.reps, hidden, logs)
            base = pre if base is None else base
            print(f"{mode:<11} {pre:>11.1f} {pre / base:>8.3f} {dec:>10.2f} {values:>9} "
                  f"{rss:>13.0f}")


if __name__ == "__main__":
    main()
