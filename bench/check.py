#!/usr/bin/python3
"""bench/check.py: what the benchmark programs count and check, against this file's own
arithmetic (`make bench-check`; about a minute). Not timings: every figure here is a count.

- attn_bench: each case's FLOPs and bytes (from its RESULT line's GFLOP/s, GB/s and ms) against
  formulas written here from the shapes (projections 2*M*N*K, QK^T and PV 4*H*D per visible key,
  K/V bytes per dtype: f32 4, bf16 and f16 2, q8_0 34 per 32 values; a linear layer's state of
  head_dim^2 + head_dim doubles per KV head), on the small presets' short cases in every default
  dtype pair; each "KV capacity" line's bytes and sessions a GiB (a linear layer's cache is its
  state, the same at every length); the roofline time of three cases on 2 threads and on 1 from
  the limits the run printed (L3's bandwidth up to 32 MiB a call, DRAM's beyond); and
  deepseek-v3's prefill (MLA's counts) with its line setting the latent against expanded heads'
  K and V.
- peer_numpy.py (bench-compare's peer): its cases' FLOPs and bytes as attn_bench's f32/f32.
- attn_load: against a stand-in server whose answers have the right shapes and counts but wrong
  values (all zeros; random), it must fail naming the values; against attnd it must pass.

--bench, --load, --attnd name the binaries (default build/); --port the stand-in's (0: a free
one); --url an attnd already running for the load checks instead of one attn_load spawns.
"""
import argparse
import base64
import json
import os
import random
import re
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PRESETS = {  # the engine's small preset (engine/config.c), as attn_bench's small variants use it
    "small": dict(hid=512, H=8, Hkv=2, D=64, layers=4),
    "small-long": dict(hid=512, H=8, Hkv=2, D=64, layers=4),
    "small-linear": dict(hid=512, H=8, Hkv=2, D=64, layers=4, linear=True),
    # DeepSeek-V3's attention: q_lora 1536, the latent 512 + 64 rotated, heads' nope 128, v 128
    "deepseek-v3": dict(hid=7168, H=128, ql=1536, kvl=512, nope=128, rope=64, v=128, layers=32),
}
BLOCK_TOKENS = 128
FAILURES = []
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg)


def kv_bytes(dt, n_values):
    """Bytes of n_values K or V values (a multiple of 32) as the cache holds them."""
    return {"f32": 4 * n_values, "bf16": 2 * n_values, "f16": 2 * n_values,
            "q8_0": n_values // 32 * 34}[dt]


def state_bytes(p, kv_dt):
    """One session's linear-layer cache: each KV head's state in whole 128-token blocks."""
    block = p["Hkv"] * BLOCK_TOKENS * 2 * kv_bytes(kv_dt, p["D"])
    per = block // ((p["D"] ** 2 + p["D"]) * 8)
    return -(-p["Hkv"] // per) * block


def cost(preset, kind, n, w_dt, kv_dt):
    """FLOPs and bytes of one call: n_seq sequences, n_new tokens each after n_past."""
    p = PRESETS[preset]
    n_seq, n_past, n_new = {"prefill": (1, 0, n), "decode": (1, n, 1), "attend": (1, n, 1),
                            "batch": (n, 2048, 1)}[kind]
    hid, h = p["hid"], p["H"]
    m = n_seq * n_new
    visible = sum(n_past + i + 1 for i in range(n_new))  # causal, no window here
    kv_read = n_past + n_new  # every cached key and the new ones, read once
    if "kvl" in p:  # absorbed: W_UK into each head's query, W_UV after the latents' weighted sum
        ql, kvl, nope, rope, v = p["ql"], p["kvl"], p["nope"], p["rope"], p["v"]
        params = (hid * ql + ql * h * (nope + rope) + hid * (kvl + rope) + h * (nope + v) * kvl
                  + h * v * hid)
        flops = 2 * m * params + 2 * h * ((kvl + rope) + kvl) * visible * n_seq
        norms = ql + kvl  # the q_a and kv_a RMSNorms' weights
        return flops, (4 * (params + norms) + kv_bytes(kv_dt, kvl + rope) * n_seq
                       * (kv_read + n_new) + 2 * m * hid * 4)
    hid, h, hkv, d = p["hid"], p["H"], p["Hkv"], p["D"]
    if kind == "attend":
        return (4 * h * d * visible,
                kv_bytes(kv_dt, 2 * hkv * d) * (kv_read + 1) + 4 * (2 * h * d + 2 * hkv * d))
    proj_params = hid * (h + 2 * hkv) * d + h * d * hid
    flops = 2 * m * proj_params
    nbytes = (4 if w_dt == "f32" else 2) * proj_params + 2 * m * hid * 4  # weights, x and out
    if p.get("linear"):
        flops += m * 2 * (hkv + h) * d * d  # the state's update per KV head, its read per head
        nbytes += 2 * n_seq * hkv * (d * d + d) * 8  # the states read and written once
    else:
        flops += 4 * h * d * visible * n_seq
        nbytes += kv_bytes(kv_dt, 2 * hkv * d) * n_seq * (kv_read + n_new)
    return flops, nbytes


def counted(f):
    """A RESULT line's FLOPs and bytes (its GFLOP/s and GB/s times its ms), each with the relative
    error its printed digits allow (ms to 4 decimals, GFLOP/s to 2, GB/s to 3)."""
    ms, gf, gb = float(f["ms"]), float(f["gflops"]), float(f["gbs"])
    return (("FLOPs", gf * ms * 1e6, 0.002 + 5e-5 / ms + 5e-3 / max(gf, 1e-9)),
            ("bytes", gb * ms * 1e6, 0.002 + 5e-5 / ms + 5e-4 / max(gb, 1e-9)))


def check_bench(bench):
    cmd = [bench, "--skip-limits", "--reps", "1", "--preset", "small,small-long,small-linear",
           "--case", "prefill_S128,decode_L512,attend_L512,batch_B8"]
    print("== " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    n_cases = 0
    for line in out.splitlines():
        if line.startswith("RESULT "):
            f = dict(t.split("=", 1) for t in line.split()[1:])
            m = re.match(r"([\w-]+)\.(prefill_S|decode_L|attend_L|batch_B)(\d+)(?:_L2048)?"
                         r"@(\w+)/(\w+)$", f["case"])
            preset, kind, n, w_dt, kv_dt = m.groups()
            kind = {"prefill_S": "prefill", "decode_L": "decode", "attend_L": "attend",
                    "batch_B": "batch"}[kind]
            flops, nbytes = cost(preset, kind, int(n), w_dt, kv_dt)
            for (what, got, tol), want in zip(counted(f), (flops, nbytes)):
                if abs(got - want) > tol * want:
                    fail(f"{f['case']}: {what} {got:.6g}, expected {want:.6g}")
            n_cases += 1
        m = re.match(r"([\w-]+)@(\w+)/(\w+): KV capacity: (.*)$", line)
        if m:
            preset, _, kv_dt, text = m.groups()
            p = PRESETS[preset]
            if p.get("linear"):
                per, unit = state_bytes(p, kv_dt), "bytes/session/layer"
                sessions = 2 ** 30 / (per * p["layers"])
                ratio = state_bytes(p, "f32") / per
            else:
                per, unit = kv_bytes(kv_dt, 2 * p["Hkv"] * p["D"]), "bytes/token/layer"
                sessions = 2 ** 30 / (per * 2048 * p["layers"])
                ratio = kv_bytes("f32", 32) / kv_bytes(kv_dt, 32)
            want = (f"{per:.0f} {unit}", f"{sessions:.2f} sessions", f"{ratio:.2f}x f32's")
            if not all(w in text for w in want):
                fail(f"{line.strip()}: expected {', '.join(want)}")
            n_cases += 1
    if n_cases != 48:  # 36 cases (small 4, small-long 3, small-linear 2; 4 dtype pairs), 12 lines
        fail(f"attn_bench printed {n_cases} cases and capacity lines, expected 48")
    print(f"attn_bench: {n_cases} cases and capacity lines checked")


def check_peer(python):
    """peer_numpy.py's cases in float32 counted as attn_bench's f32/f32 (the same shapes), for a
    case filter whose batch needs a longer cache than its decode (it stopped there before)."""
    cmd = [python, os.path.join(HERE, "peer_numpy.py"), "--reps", "1", "--preset", "small",
           "--case", "prefill_S128,decode_L512,attend_L512,batch_B8"]
    print("== " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    n = 0
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            f = dict(t.split("=", 1) for t in line.split()[1:])
            m = re.match(r"small\.(prefill_S|decode_L|attend_L|batch_B)(\d+)", f["case"])
            kind = {"prefill_S": "prefill", "decode_L": "decode", "attend_L": "attend",
                    "batch_B": "batch"}[m[1]]
            flops, nbytes = cost("small", kind, int(m[2]), "f32", "f32")
            for (what, got, tol), want in zip(counted(f), (flops, nbytes)):
                if abs(got - want) > tol * want:
                    fail(f"peer {f['case']}: {what} {got:.6g}, expected {want:.6g}")
            n += 1
    if r.returncode != 0 or n != 4:
        fail(f"peer_numpy.py: exit {r.returncode}, {n} cases, expected 0 and 4:\n{r.stdout}")
    print(f"peer_numpy: {n} cases checked")


def check_roofline(bench):
    """roof_ms = max(bytes at the bandwidth, FLOPs at the sgemm peak), the higher of each limit
    measured before and after; the bandwidth L3's for a call of 32 MiB or less (not paired: its
    reps read the same bytes back to back, which fit the L3), DRAM's sweep beyond, each on the
    run's threads (2, or 1 with --threads 1)."""
    for threads in (2, 1):
        cmd = [bench, "--quick", "--no-paired", "--bw-mib", "256", "--reps", "1", "--threads",
               str(threads), "--preset", "small", "--case", "decode_L512,batch_B8,batch_B32",
               "--dtypes", "f32/f32"]
        print("== " + " ".join(cmd), flush=True)
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"peak ([\d.]+) / ([\d.]+) GFLOP/s; read bandwidth over \d+ MiB ([\d.]+) / "
                      r"([\d.]+) GB/s with 1 thread, ([\d.]+) / ([\d.]+) GB/s with 2; over 16 MiB "
                      r"\(L3\) ([\d.]+) / ([\d.]+) GB/s with 1 thread, ([\d.]+) / ([\d.]+) GB/s "
                      r"with 2", out)
        if m is None:
            fail(f"attn_bench --threads {threads}: no limits line with L3's 1 and 2 threads")
            continue
        sgemm, dram1, dram2, l3_1, l3_2 = (max(float(m[i]), float(m[i + 1]))
                                           for i in (1, 3, 5, 7, 9))
        dram, l3 = (dram2, l3_2) if threads == 2 else (dram1, l3_1)
        n = 0
        for line in out.splitlines():
            if line.startswith("RESULT "):
                f = dict(t.split("=", 1) for t in line.split()[1:])
                (_, flops, _), (_, nbytes, _) = counted(f)
                bw = l3 if nbytes <= 32 * 2 ** 20 else dram
                want = max(nbytes / (bw * 1e9), flops / (sgemm * 1e9)) * 1e3
                if abs(float(f["roof_ms"]) - want) > 0.02 * want:
                    fail(f"{f['case']} --threads {threads}: roof_ms {f['roof_ms']}, expected "
                         f"{want:.4f} ({nbytes:.4g} bytes at {bw} GB/s, {flops:.4g} FLOPs at "
                         f"{sgemm} GFLOP/s)")
                n += 1
        if n != 3:
            fail(f"attn_bench --threads {threads} printed {n} cases, expected 3")
    print("attn_bench: 6 rooflines checked (2 threads and 1)")


def check_mla(bench):
    """deepseek-v3's prefill of 128 tokens counted as MLA's (the model: 748 MB of float32), and
    its line setting the latent's bytes a token against expanded heads' and 8 KV heads of 128."""
    cmd = [bench, "--skip-limits", "--reps", "1", "--preset", "deepseek-v3", "--case",
           "prefill_S128", "--dtypes", "f32/f32"]
    print("== " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    f = dict(t.split("=", 1) for t in re.search(r"^RESULT (.*)$", out, re.M)[1].split())
    flops, nbytes = cost("deepseek-v3", "prefill", 128, "f32", "f32")
    for (what, got, tol), want in zip(counted(f), (flops, nbytes)):
        if abs(got - want) > tol * want:
            fail(f"{f['case']}: {what} {got:.6g}, expected {want:.6g}")
    p = PRESETS["deepseek-v3"]
    latent = 4 * (p["kvl"] + p["rope"])
    expanded = 4 * p["H"] * ((p["nope"] + p["rope"]) + p["v"])  # each head's key and value
    want = (f"holds {latent} bytes a token", f"expanded heads would hold {expanded} "
            f"({expanded / latent:.0f}x)", f"8 KV heads of 128 {2 * 8 * 128 * 4} "
            f"({2 * 8 * 128 * 4 / latent:.1f}x)")
    line = re.search(r"^deepseek-v3: the cache holds .*$", out, re.M)
    if line is None or not all(w in line[0] for w in want):
        fail(f"{line[0] if line else 'no MLA line'}: expected {', '.join(want)}")
    print("attn_bench: MLA's case and cache line checked")


class StandIn(BaseHTTPRequestHandler):
    """attnd's answers to attn_load's calls with the right shapes and counts, values by mode."""
    protocol_version = "HTTP/1.1"
    hidden = 64
    mode = "zeros"

    def log_message(self, *args):
        pass

    def reply(self, code, body, ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/model":
            body = {"hidden_size": self.hidden, "max_position_embeddings": 4096}
            return self.reply(200, json.dumps(body).encode() + b"\n")
        self.reply(200 if self.path == "/readyz" else 404, b"{}\n")

    def do_DELETE(self):
        self.reply(204, b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/truncate"):
            return self.reply(200, b"{}\n")
        n_json = self.headers.get("Inference-Header-Content-Length")
        req = json.loads(body[:int(n_json)] if n_json else body)
        is_binary = req.get("binary_output", False)
        answers, raws = [], []
        for i, step in enumerate(req.get("steps") or [req]):
            rows = step["x"]["shape"][0]
            n = rows * self.hidden
            # "steps": the same values for every call's first step (prefills agree), others'
            # differ from it (a batch whose sessions got each other's answers)
            same = self.mode == "steps" and i == 0
            gen = random.Random(rows) if same else random
            vals = [0.0] * n if self.mode == "zeros" else [gen.uniform(-1, 1) for _ in range(n)]
            raw = struct.pack(f"<{n}f", *vals)
            out = {"shape": [rows, self.hidden]}
            if is_binary:
                out.update(datatype="FP32", binary_data_size=len(raw))
                raws.append(raw)
            else:
                out["b64"] = base64.b64encode(raw).decode()
            answers.append({"session_id": step["session_id"], "layer": 0,
                            "n_past": step["expect_n_past"],
                            "n_tokens": step["expect_n_past"] + rows, "output": out,
                            "timing": {"queue_ms": 0.0, "compute_ms": 0.01}})
        doc = {"layer": 0, "results": answers} if "steps" in req else answers[0]
        text = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
        if is_binary:
            return self.reply(200, text + b"".join(raws), "application/octet-stream",
                              [("Inference-Header-Content-Length", str(len(text)))])
        self.reply(200, text)


def check_load(load, attnd, port, url):
    server = ThreadingHTTPServer(("127.0.0.1", port), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stand_in = f"http://127.0.0.1:{server.server_address[1]}"
    common = ["--clients", "2", "--duration", "0.5", "--prefill", "8", "--max-tokens", "20"]
    modes = [[], ["--binary"], ["--batch", "4"], ["--batch", "4", "--binary"]]
    for values, reason in (("zeros", "every output value is 0"), ("random", "output differs")):
        StandIn.mode = values
        for mode in modes:
            cmd = [load, "--url", stand_in] + common + mode
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace")
            if r.returncode != 1 or reason not in r.stdout:
                fail(f"{' '.join(cmd)} against {values}: exit {r.returncode}, expected 1 and "
                     f"'{reason}':\n{r.stdout}")
    # a batch's later steps against its first: framed, read where they lie in the answer
    StandIn.mode = "steps"
    for mode in modes[2:]:
        cmd = [load, "--url", stand_in] + common + mode
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
        if r.returncode != 1 or "output differs" not in r.stdout or "decode" not in r.stdout:
            fail(f"{' '.join(cmd)} against unequal steps: exit {r.returncode}, expected 1 and "
                 f"'output differs' in a decode:\n{r.stdout}")
    server.shutdown()
    target = ["--url", url] if url else ["--spawn", attnd]
    after = [] if url else ["--", "--preset", "small", "--log-level", "warn"]
    for mode in modes + [["--json-floats", "--batch", "3"]]:
        cmd = [load] + target + common + ["--duration", "1", "--prefill", "16"] + mode + after
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
        if r.returncode != 0 or "errors: none" not in r.stdout:
            fail(f"{' '.join(cmd)}: exit {r.returncode}, expected 0:\n{r.stdout}")
    print("attn_load: wrong values refused (2 kinds x 4 modes, and a batch's unequal steps x 2), "
          "attnd's answers accepted (5 modes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/attn_bench")
    ap.add_argument("--python", default=sys.executable, help="the peer's (Debian's numpy)")
    ap.add_argument("--load", default="build/attn_load")
    ap.add_argument("--attnd", default="build/attnd")
    ap.add_argument("--port", type=int, default=0, help="the stand-in server's (0: a free one)")
    ap.add_argument("--url", default=None, help="a running attnd (preset small) to load instead")
    args = ap.parse_args()
    check_bench(args.bench)
    check_peer(args.python)
    check_roofline(args.bench)
    check_mla(args.bench)
    check_load(args.load, args.attnd, args.port, args.url)
    if FAILURES:
        sys.exit(f"bench/check.py: {len(FAILURES)} failed")
    print("bench/check.py: all passed")


if __name__ == "__main__":
    main()
