#!/usr/bin/env python3
"""bench/persist.py: issue 11's figures, against limits measured in the same run (`make
persist-bench`; not a test). Needs python3-numpy and curl.

1. The disk: sequential read speed of a file as large as --disk-mb in the state directory's
   filesystem, after fsync and posix_fadvise(DONTNEED) (so the page cache does not answer).
2. Restore: attnd (llama8b, one layer, bf16) with a KV pool that holds one 2048-token session;
   two sessions take turns, so every decode step restores one (from its file, dropped from the
   page cache first: a cold read) and spills the other. Restore time is the daemon's own
   attnd_restore_duration_seconds (request received to caches back in memory); compared with
   the file's bytes at the disk's speed and with the prefill that rebuilding it would cost.
3. Export and import through HTTP on loopback (curl, keep-alive off): bytes over wall time.
4. A checked load run: sessions whose working set is many times the KV pool, decode steps in a
   random order, every answer compared bit for bit with a second attnd that never evicts.

usage: bench/persist.py [--attnd build/attnd] [--reps N] [--sessions N] [--steps N]
"""
import argparse
import base64
import http.client
import json
import os
import random
import re
import shutil
import signal
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


class Daemon:
    def __init__(self, binary, args, log_dir, name):
        self.port = free_port()
        self.log = open(os.path.join(log_dir, name + ".log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port)] + args,
            stdout=self.log, stderr=subprocess.STDOUT)
        self.conn = None
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                self.conn = None
            if self.proc.poll() is not None:
                raise SystemExit(f"attnd exited ({self.proc.returncode}); see {self.log.name}")
            time.sleep(0.1)
        raise SystemExit("attnd not ready in 120 s")

    def request(self, method, path, body=None, headers=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        return r.status, r.read()

    def json(self, method, path, obj=None):
        status, body = self.request("POST" if obj is not None else method, path,
                                    json.dumps(obj) if obj is not None else None,
                                    {"Content-Type": "application/json"})
        return status, json.loads(body) if body else None

    def metric(self, name):
        text = self.request("GET", "/metrics")[1].decode()
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.log.close()


def tensor(x):
    x = np.ascontiguousarray(x, dtype="<f4")
    return {"shape": list(x.shape), "b64": base64.b64encode(x.tobytes()).decode()}


def attend(d, sid, x, n_past, layer=0):
    body = {"layer": layer, "x": tensor(x), "encoding_format": "base64"}
    if sid is not None:
        body["session_id"] = sid
        body["expect_n_past"] = n_past
    status, r = d.json("POST", "/v1/attend", body)
    if status != 200:
        raise SystemExit(f"attend {sid} at {n_past}: {status} {r}")
    return r


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read_speed(directory, mb):
    """Sequential read of a cold file: median of three reads, GB/s."""
    path = os.path.join(directory, "disk-probe.bin")
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    buf = bytearray(8 << 20)
    speeds = []
    for _ in range(3):
        drop_cache(path)
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
        speeds.append(mb * (1 << 20) / (time.perf_counter() - t0) / 1e9)
    os.unlink(path)
    return statistics.median(speeds)


def export(d, sid):
    status, body = d.request("GET", f"/v1/sessions/{sid}/export")
    assert status == 200, status
    return body


def curl_time(args):
    sink = [] if "-o" in args else ["-o", "/dev/null"]  # one -o per URL
    out = subprocess.run(["curl", "-sS"] + sink + ["-w", "%{http_code} %{time_total}"] + args,
                         check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), float(out[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnd", default="build/attnd")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--disk-mb", type=int, default=512)
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--dir", default=None, help="where the state directory goes (default: a temp dir)")
    o = ap.parse_args()
    work = tempfile.mkdtemp(prefix="attnd-persist-", dir=o.dir)
    state = os.path.join(work, "state")
    try:
        return run(o, work, state)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(o, work, state):
    disk = disk_read_speed(work, o.disk_mb)
    print(f"LIMIT disk_read_GBps={disk:.2f} ({o.disk_mb} MiB, cold, median of 3)")

    # ---- restore: a pool that holds one 2048-token session ----
    rng = np.random.default_rng(0)
    d = Daemon(o.attnd, ["--preset", "llama8b", "--layers", "0", "--kv-budget-mb", "12",
                         "--state-dir", state, "--max-body-mb", "256"], work, "restore")
    hidden = d.json("GET", "/v1/model")[1]["hidden_size"]
    xs = {s: rng.uniform(-1, 1, (o.tokens + 2 * o.reps + 2, hidden)).astype(np.float32)
          for s in "ab"}
    prefill_ms = []
    for s in "ab":
        r = attend(d, s, xs[s][:o.tokens], 0)  # b's prefill spills a
        prefill_ms.append(r["timing"]["compute_ms"])
    n = {s: o.tokens for s in "ab"}

    def settle():
        """Waits until every spill is on disk, so a restore's read queues behind nothing."""
        for _ in range(2000):
            if d.metric("attnd_spill_pending_bytes") == 0:
                return
            time.sleep(0.005)

    def restore_step(s):
        """One decode step on s (on disk, dropped from the page cache): the restore's ms."""
        settle()
        path = os.path.join(state, s + ".session")
        drop_cache(path)
        before_sum = d.metric("attnd_restore_duration_seconds_sum")
        before_n = d.metric("attnd_restores_total")
        attend(d, s, xs[s][n[s]:n[s] + 1], n[s])
        n[s] += 1
        assert d.metric("attnd_restores_total") == before_n + 1, "the step did not restore"
        return (d.metric("attnd_restore_duration_seconds_sum") - before_sum) * 1e3

    file_bytes = os.path.getsize(os.path.join(state, "a.session"))
    free_ms, spill_ms = [], []
    for i in range(o.reps):
        # a is on disk, b in memory. Into free room: b goes (exported, then DELETE), a comes
        # back; b is imported again, which spills a.
        b_file = export(d, "b")
        assert d.request("DELETE", "/v1/sessions/b")[0] == 204
        free_ms.append(restore_step("a"))
        assert d.request("PUT", "/v1/sessions/b", b_file)[0] == 201
        # Making room: a comes back and b is spilled for it in the same request, then back.
        spill_ms.append(restore_step("a"))
        spill_ms.append(restore_step("b"))
    # the same bytes read cold by a plain program, in the same minutes (a file this small pays
    # the device's latency and readahead ramp that the long probe above amortizes)
    probe = os.path.join(work, "probe-8.bin")
    shutil.copyfile(os.path.join(state, "b.session"), probe)
    with open(probe, "rb+") as f:
        os.fsync(f.fileno())
    plain = []
    buf = bytearray(file_bytes)
    for _ in range(o.reps):
        drop_cache(probe)
        t0 = time.perf_counter()
        with open(probe, "rb", buffering=0) as f:
            f.readinto(buf)
        plain.append((time.perf_counter() - t0) * 1e3)
    plain_ms = statistics.median(plain)
    read_ms = file_bytes / (disk * 1e9) * 1e3
    pre = statistics.median(prefill_ms)
    for name, ms in (("restore_into_free_room", free_ms), ("restore_evicting_another", spill_ms)):
        med = statistics.median(ms)
        print(f"RESULT {name} tokens={o.tokens} file_bytes={file_bytes} median_ms={med:.2f} "
              f"min_ms={min(ms):.2f} disk_read_ms={read_ms:.2f} ratio_to_disk={med / read_ms:.2f} "
              f"(target <= 1.5) cold_file_read_ms={plain_ms:.2f} "
              f"ratio_to_file_read={med / plain_ms:.2f} prefill_ms={pre:.1f} "
              f"prefill_over_restore={pre / med:.1f} (target >= 20)")
    b_file = export(d, "b")
    d.stop()

    # ---- export / import over HTTP, in a pool with room (no spill in the way) ----
    d = Daemon(o.attnd, ["--preset", "llama8b", "--layers", "0", "--kv-budget-mb", "64",
                         "--max-body-mb", "256"], work, "http")
    assert d.request("PUT", "/v1/sessions/a", b_file)[0] == 201
    blob = os.path.join(work, "a.bin")
    base = f"http://127.0.0.1:{d.port}"
    exp, imp = [], []
    with open(blob, "wb") as f:
        f.write(export(d, "a"))
    for i in range(o.reps + 1):
        st, t = curl_time([f"{base}/v1/sessions/a/export"])  # into /dev/null: the server's speed
        assert st == 200, st
        st, u = curl_time(["-X", "PUT", "--data-binary", "@" + blob,
                           "-H", "Content-Type: application/octet-stream", f"{base}/v1/sessions/copy"])
        assert st == 201, st
        d.request("DELETE", "/v1/sessions/copy")
        if i > 0:  # the first import touches the pool's pages for the first time
            exp.append(t)
            imp.append(u)
    size = os.path.getsize(blob)
    print(f"RESULT http_export bytes={size} median_ms={statistics.median(exp) * 1e3:.2f} "
          f"GBps={size / statistics.median(exp) / 1e9:.2f} (target >= 1)")
    print(f"RESULT http_import bytes={size} median_ms={statistics.median(imp) * 1e3:.2f} "
          f"GBps={size / statistics.median(imp) / 1e9:.2f} (target >= 1)")
    d.stop()

    # ---- a checked load run: the working set many times the pool ----
    shutil.rmtree(state, ignore_errors=True)
    small = ["--preset", "small", "--layers", "0", "--kv-dtype", "f32"]
    d = Daemon(o.attnd, small + ["--kv-budget-mb", "1", "--state-dir", state], work, "evicting")
    ref = Daemon(o.attnd, small + ["--kv-budget-mb", "1024"], work, "reference")
    hidden = d.json("GET", "/v1/model")[1]["hidden_size"]
    per_token = d.json("GET", "/v1/model")[1]["attnd"]["kv_bytes_per_token"]
    prompt = 256
    work_set = o.sessions * (prompt + o.steps // o.sessions + 1) * per_token
    pool = d.json("GET", "/v1/sessions")[1]["pool"]["bytes_limit"]
    lens = {}
    errors = gone = mismatches = 0
    t0 = time.perf_counter()
    pick = random.Random(1)
    order = list(range(o.sessions)) + [pick.randrange(o.sessions) for _ in range(o.steps)]
    for k, i in enumerate(order):
        sid = f"s{i}"
        t = prompt if sid not in lens else 1
        x = rng.uniform(-1, 1, (t, hidden)).astype(np.float32)
        got_st, got = d.json("POST", "/v1/attend", {"session_id": sid, "layer": 0, "x": tensor(x),
                                                     "expect_n_past": lens.get(sid, 0),
                                                     "encoding_format": "base64"})
        want_st, want = ref.json("POST", "/v1/attend", {"session_id": sid, "layer": 0,
                                                        "x": tensor(x), "encoding_format": "base64"})
        lens[sid] = lens.get(sid, 0) + t
        if got_st == 410:
            gone += 1
        elif got_st != 200 or want_st != 200:
            errors += 1
        elif got["output"] != want["output"]:
            mismatches += 1
    elapsed = time.perf_counter() - t0
    print(f"RESULT checked_load sessions={o.sessions} steps={len(order)} working_set_bytes={work_set} "
          f"pool_bytes={pool} ratio={work_set / pool:.1f} spills={d.metric('attnd_spills_total'):.0f} "
          f"restores={d.metric('attnd_restores_total'):.0f} errors={errors} gone_410={gone} "
          f"mismatches={mismatches} (targets 0) seconds={elapsed:.1f}")
    d.stop()
    ref.stop()
    return 0 if errors == gone == mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
