#!/usr/bin/python3
"""bench/peer_numpy.py: attn_bench's cases written plainly in numpy, as the peer to beat.

One random attention layer of the `small` or `llama8b` preset: projections as x @ W.T (matrix-vector
W @ x for a single decode token), RoPE (rotate_half), causal softmax attention with GQA, and a KV
cache kept in preallocated numpy arrays. Prints RESULT lines in attn_bench's format, so
bench/compare.py can join the two. Run with Debian's numpy (/usr/bin/python3), which calls the
same OpenBLAS; the thread count is set through OPENBLAS_NUM_THREADS before numpy is imported.
"""
import argparse
import os
import sys
import time

PRESETS = {
    "small": dict(hidden=512, n_heads=8, n_kv_heads=2, head_dim=64, rope_theta=10000.0),
    "llama8b": dict(hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, rope_theta=500000.0),
}
PREFILL_LENS = (128, 512, 2048)
DECODE_LENS = (512, 2048, 8192)  # ascending: one cache grows through them
BATCH_SIZES = (1, 8, 32)
BATCH_LEN = 2048
MAX_SEQ = 16384


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="OpenBLAS threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="fewer reps (smoke runs)")
    ap.add_argument("--preset", default="all",
                    help="all, small, llama8b, or small,llama8b (attn_bench's list form)")
    ap.add_argument("--case", default=None,
                    help="comma-separated substrings of case names, e.g. decode,_B32")
    ap.add_argument("--reps", type=int, default=0, help="exactly N timed reps per case")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--self-check", action="store_true",
                    help="check that prefill, chunked prefill, decode and batched decode agree "
                    "on the small preset, then exit")
    return ap.parse_args()


def case_name(preset, kind, n):
    if kind == "prefill":
        return f"{preset}.prefill_S{n}"
    if kind == "decode":
        return f"{preset}.decode_L{n}"
    if kind == "attend":
        return f"{preset}.attend_L{n}"
    return f"{preset}.batch_B{n}_L{BATCH_LEN}"


def selected(args, name):
    if args.case is None:
        return True
    return any(part and part in name for part in args.case.split(","))


def main():
    args = parse_args()
    if args.threads < 1:
        sys.exit("peer_numpy: --threads must be >= 1")
    # OpenBLAS reads this once, when numpy loads it.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import numpy as np

    if args.reps > 0:
        policy = (args.reps, args.reps, 0.0)
    elif args.quick:
        policy = (3, 20, 0.05)
    else:
        policy = (5, 200, 1.0)

    def measure(rep):
        """Median seconds of the timed reps after one warm-up; rep() returns its own time."""
        min_reps, max_reps, min_seconds = policy
        rep()
        samples = []
        while len(samples) < max_reps and (len(samples) < min_reps or sum(samples) < min_seconds):
            samples.append(rep())
        samples.sort()
        return float(np.median(samples)), samples[0], len(samples)

    class Layer:
        """One attention layer with nn.Linear-style random weights (out_features, in_features)."""

        def __init__(self, p, rng):
            self.p = p
            h, d = p["hidden"], p["head_dim"]
            self.r = p["n_heads"] // p["n_kv_heads"]
            bound = 1.0 / np.sqrt(h)

            def w(rows, cols, bnd):
                return (rng.random((rows, cols), dtype=np.float32) * 2 - 1) * np.float32(bnd)

            self.wq = w(p["n_heads"] * d, h, bound)
            self.wk = w(p["n_kv_heads"] * d, h, bound)
            self.wv = w(p["n_kv_heads"] * d, h, bound)
            self.wo = w(h, p["n_heads"] * d, 1.0 / np.sqrt(p["n_heads"] * d))
            # RoPE tables (MAX_SEQ, head_dim / 2): angle = pos * theta^(-2i / head_dim).
            inv_freq = p["rope_theta"] ** (-np.arange(0, d, 2, dtype=np.float64) / d)
            ang = np.arange(MAX_SEQ, dtype=np.float64)[:, None] * inv_freq[None, :]
            self.cos = np.cos(ang).astype(np.float32)
            self.sin = np.sin(ang).astype(np.float32)
            self.scale = np.float32(1.0 / np.sqrt(d))

        def rope(self, x, pos):
            """x (T, heads, head_dim) rotated in place at positions pos (T,), rotate_half style."""
            half = x.shape[-1] // 2
            c = self.cos[pos][:, None, :]
            s = self.sin[pos][:, None, :]
            x1 = x[..., :half].copy()
            x2 = x[..., half:]
            x[..., :half] = x1 * c - x2 * s
            x[..., half:] = x2 * c + x1 * s
            return x

        def attend_prefill(self, q, cache, n_past):
            """q (T, n_heads, D) after RoPE; keys 0 .. n_past + T - 1 of cache; causal."""
            t, d = q.shape[0], q.shape[2]
            n_keys = n_past + t
            out = np.empty((t, self.p["n_heads"], d), dtype=np.float32)
            # masked[i, j]: key j is later than query i (cache index n_past + i)
            masked = np.arange(n_keys)[None, :] > (n_past + np.arange(t))[:, None]
            for g in range(self.p["n_kv_heads"]):
                qg = q[:, g * self.r:(g + 1) * self.r, :].transpose(1, 0, 2).reshape(-1, d)
                s = (qg @ cache.k[g, :n_keys].T) * self.scale
                s = s.reshape(self.r, t, n_keys)
                s[:, masked] = -np.inf
                s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                s /= s.sum(axis=-1, keepdims=True)
                o = s.reshape(-1, n_keys) @ cache.v[g, :n_keys]
                out[:, g * self.r:(g + 1) * self.r, :] = o.reshape(self.r, t, d).transpose(1, 0, 2)
            return out

        def attend_one(self, q, cache, n_keys):
            """q (n_heads, D) of one new token that sees all n_keys keys: batched over kv heads."""
            d = q.shape[-1]
            qg = q.reshape(self.p["n_kv_heads"], self.r, d)
            s = np.matmul(qg, cache.k[:, :n_keys].transpose(0, 2, 1)) * self.scale
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            return np.matmul(s, cache.v[:, :n_keys]).reshape(-1)

        def prefill(self, x, cache):
            """x (T, hidden) appended to cache; returns (T, hidden)."""
            p, t = self.p, x.shape[0]
            n_past = cache.n
            pos = np.arange(n_past, n_past + t)
            q = (x @ self.wq.T).reshape(t, p["n_heads"], p["head_dim"])
            k = (x @ self.wk.T).reshape(t, p["n_kv_heads"], p["head_dim"])
            v = (x @ self.wv.T).reshape(t, p["n_kv_heads"], p["head_dim"])
            self.rope(q, pos)
            self.rope(k, pos)
            cache.k[:, n_past:n_past + t] = k.transpose(1, 0, 2)
            cache.v[:, n_past:n_past + t] = v.transpose(1, 0, 2)
            cache.n = n_past + t
            a = self.attend_prefill(q, cache, n_past)
            return a.reshape(t, -1) @ self.wo.T

        def decode(self, x, cache):
            """x (hidden,) one token appended to cache: matrix-vector products throughout."""
            p, n = self.p, cache.n
            pos = np.array([n])
            q = (self.wq @ x).reshape(1, p["n_heads"], p["head_dim"])
            k = (self.wk @ x).reshape(1, p["n_kv_heads"], p["head_dim"])
            v = (self.wv @ x).reshape(p["n_kv_heads"], p["head_dim"])
            self.rope(q, pos)
            self.rope(k, pos)
            cache.k[:, n] = k[0]
            cache.v[:, n] = v
            cache.n = n + 1
            return self.wo @ self.attend_one(q[0], cache, n + 1)

        def attend(self, q, k, v, cache):
            """One token's q (n_heads, D), k and v (n_kv_heads, D) appended: attention alone."""
            n = cache.n
            cache.k[:, n] = k
            cache.v[:, n] = v
            cache.n = n + 1
            return self.attend_one(q, cache, n + 1)

        def decode_batch(self, xs, caches):
            """xs (B, hidden), one token for each cache: one GEMM per projection."""
            p, b = self.p, xs.shape[0]
            pos = np.array([c.n for c in caches])
            q = (xs @ self.wq.T).reshape(b, p["n_heads"], p["head_dim"])
            k = (xs @ self.wk.T).reshape(b, p["n_kv_heads"], p["head_dim"])
            v = (xs @ self.wv.T).reshape(b, p["n_kv_heads"], p["head_dim"])
            self.rope(q, pos)
            self.rope(k, pos)
            a = np.empty((b, p["n_heads"] * p["head_dim"]), dtype=np.float32)
            for i, c in enumerate(caches):
                c.k[:, c.n] = k[i]
                c.v[:, c.n] = v[i]
                c.n += 1
                a[i] = self.attend_one(q[i], c, c.n)
            return a @ self.wo.T

    class Cache:
        """K and V (n_kv_heads, capacity, head_dim), preallocated; n tokens held."""

        def __init__(self, p, capacity):
            self.p = p
            shape = (p["n_kv_heads"], capacity, p["head_dim"])
            self.k = np.zeros(shape, dtype=np.float32)
            self.v = np.zeros(shape, dtype=np.float32)
            self.n = 0

        def fork(self, capacity):
            """A copy with its own arrays, holding the same tokens, of the given capacity."""
            c = Cache(self.p, capacity)
            c.k[:, :self.n] = self.k[:, :self.n]
            c.v[:, :self.n] = self.v[:, :self.n]
            c.n = self.n
            return c

    def cost(p, n_seq, n_past, n_new, attend_only=False):
        """FLOPs and bytes per call, counted as attn_bench states them (no sliding window)."""
        m = n_seq * n_new
        dq, dkv, h = p["n_heads"] * p["head_dim"], p["n_kv_heads"] * p["head_dim"], p["hidden"]
        if attend_only:  # one token's q, k and v given: the K/V read and written, q k v out
            flops = 4.0 * p["n_heads"] * p["head_dim"] * (n_past + 1)
            return flops, 2.0 * dkv * 4 * (n_past + 2) + 4.0 * (2 * dq + 2 * dkv)
        visible = sum(n_past + i + 1 for i in range(n_new))
        flops = 2.0 * m * (dq + 2 * dkv) * h + 2.0 * m * h * dq
        flops += 4.0 * p["n_heads"] * p["head_dim"] * visible * n_seq
        kv_tok = 2.0 * dkv * 4
        weights = 4.0 * (h * (dq + 2 * dkv) + dq * h)
        nbytes = weights + kv_tok * n_seq * ((n_past + n_new) + n_new) + 2.0 * m * h * 4
        return flops, nbytes

    def report(name, p, n_seq, n_past, n_new, timing, attend_only=False):
        med, best, reps = timing
        flops, nbytes = cost(p, n_seq, n_past, n_new, attend_only)
        line = (f"RESULT impl=numpy case={name} ms={med * 1e3:.4f} min_ms={best * 1e3:.4f} "
                f"reps={reps} tok_s={n_seq * n_new / med:.2f} gflops={flops / med * 1e-9:.2f} "
                f"gbs={nbytes / med * 1e-9:.3f}")
        results.append(line)
        print(f"{name:<26} {reps:5d} {med * 1e3:10.3f} {n_seq * n_new / med:11.1f} "
              f"{flops / med * 1e-9:9.1f} {nbytes / med * 1e-9:8.2f}", flush=True)

    def run_preset(name):
        p = PRESETS[name]
        rng = np.random.default_rng(args.seed)
        layer = Layer(p, rng)
        x = (rng.random((max(PREFILL_LENS), p["hidden"]), dtype=np.float32) * 2 - 1)

        for s in PREFILL_LENS:
            cname = case_name(name, "prefill", s)
            if not selected(args, cname):
                continue
            cache = Cache(p, s)

            def rep():
                cache.n = 0
                t0 = time.perf_counter()
                layer.prefill(x[:s], cache)
                return time.perf_counter() - t0

            report(cname, p, 1, 0, s, measure(rep))

        need_batch = any(selected(args, case_name(name, "batch", b)) for b in BATCH_SIZES)
        cache = None
        for length in DECODE_LENS:
            cname = case_name(name, "decode", length)
            need_decode = selected(args, cname)
            need_attend = selected(args, case_name(name, "attend", length))
            at_batch = need_batch and length == BATCH_LEN
            if not (need_decode or at_batch or need_attend):
                continue
            if cache is None:
                longest = max(n for n in DECODE_LENS if selected(args, case_name(name, "decode", n))
                              or selected(args, case_name(name, "attend", n))
                              or (need_batch and n == BATCH_LEN))
                cache = Cache(p, longest + 1)
            while cache.n < length:  # chunked prefill, as attn_bench fills its cache
                n = min(length - cache.n, max(PREFILL_LENS))
                layer.prefill(x[:n], cache)
            if need_decode:
                def rep():
                    t0 = time.perf_counter()
                    layer.decode(x[0], cache)
                    dt = time.perf_counter() - t0
                    cache.n = length
                    return dt

                report(cname, p, 1, length, 1, measure(rep))
            if need_attend:
                dq, dkv = p["n_heads"] * p["head_dim"], p["n_kv_heads"] * p["head_dim"]
                q = x[0, :dq].reshape(p["n_heads"], p["head_dim"])
                k = x[1, :dkv].reshape(p["n_kv_heads"], p["head_dim"])
                v = x[2, :dkv].reshape(p["n_kv_heads"], p["head_dim"])

                def rep():
                    t0 = time.perf_counter()
                    layer.attend(q, k, v, cache)
                    dt = time.perf_counter() - t0
                    cache.n = length
                    return dt

                report(case_name(name, "attend", length), p, 1, length, 1, measure(rep),
                       attend_only=True)
            if at_batch:
                run_batch(name, p, layer, x, cache)

    def run_batch(name, p, layer, x, cache0):
        forks = [cache0]
        for b in BATCH_SIZES:
            cname = case_name(name, "batch", b)
            if not selected(args, cname):
                continue
            while len(forks) < b:
                forks.append(cache0.fork(BATCH_LEN + 1))
            caches = forks[:b]

            def rep():
                t0 = time.perf_counter()
                layer.decode_batch(x[:b], caches)
                dt = time.perf_counter() - t0
                for c in caches:
                    c.n = BATCH_LEN
                return dt

            report(cname, p, b, BATCH_LEN, 1, measure(rep))

    def self_check():
        """The decode and batch paths must give what one prefill over all tokens gives."""
        p = PRESETS["small"]
        rng = np.random.default_rng(args.seed)
        layer = Layer(p, rng)
        x = rng.random((40, p["hidden"]), dtype=np.float32) * 2 - 1
        full = layer.prefill(x, Cache(p, 40))
        chunked, c = Cache(p, 40), None
        parts = [layer.prefill(x[:17], chunked), layer.prefill(x[17:37], chunked)]
        parts += [layer.decode(x[i], chunked)[None, :] for i in range(37, 40)]
        worst = float(np.max(np.abs(np.concatenate(parts) - full)))
        caches = []
        for n in (5, 23, 39):
            c = Cache(p, 40)
            layer.prefill(x[:n], c)
            caches.append(c)
        batch = layer.decode_batch(np.stack([x[5], x[23], x[39]]), caches)
        expect = full[[5, 23, 39]]
        worst = max(worst, float(np.max(np.abs(batch - expect))))
        scale = float(np.max(np.abs(full)))
        print(f"peer_numpy self-check: max |difference| {worst:.2e} (outputs up to {scale:.2e})")
        if not worst <= 1e-4 * max(scale, 1.0):
            sys.exit("peer_numpy: self-check FAILED")

    if args.self_check:
        self_check()
        return

    results = []
    print(f"peer_numpy: numpy {np.__version__}, OPENBLAS_NUM_THREADS={args.threads}; "
          "ms is the median of the timed reps after one warm-up")
    print(f"{'case':<26} {'reps':>5} {'ms':>10} {'tokens/s':>11} {'GFLOP/s':>9} {'GB/s':>8}")
    wanted = args.preset.split(",")
    if args.preset != "all" and not set(wanted) <= {"small", "llama8b"}:
        sys.exit(f"peer_numpy: --preset {args.preset}: the peer has small and llama8b only")
    for name in ("small", "llama8b"):
        if args.preset == "all" or name in wanted:
            run_preset(name)
    if not results:
        sys.exit(f"peer_numpy: no case matches --case {args.case}")
    print()
    for line in results:
        print(line)


if __name__ == "__main__":
    main()
