#!/usr/bin/env python3
"""A whole Llama-style decoder whose attention runs in attnd, checked against numpy.

attnd serves only the attention block of each layer; a model runner keeps the rest (embeddings,
norms, the MLP, the head, sampling). This example is that runner at toy size:

1. it writes a random Llama checkpoint as a Hugging Face folder (config.json, and
   model.safetensors written with the standard library);
2. it starts attnd on the folder (or uses --url, an attnd already serving the folder, e.g. one
   started with `build/attnd --model DIR` after `--write-only DIR`);
3. it greedily generates --tokens tokens for two prompts at once: one attnd session per
   sequence, a prefill per session and layer, then each decode step goes through every layer
   as one batched call (`Client.attend_batch`) for both sequences;
4. it computes the same model entirely in numpy (float64; its own RoPE in Hugging Face's
   rotate_half convention, causal softmax attention, GQA) and checks that the generated tokens
   are identical and the logits within --tol; it exits 1 otherwise. The last decode step also
   asks attnd for a selection of its attention (the last layer's heads 0 and -1, as
   probabilities), which must match numpy's within --tol too.

usage: generate.py [--tokens N] [--seed S] [--dir DIR] [--url URL] [--attnd BIN]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
try:
    import attnd
except ImportError:  # run from the repository without installing the package
    sys.path.insert(0, os.path.join(HERE, ".."))
    import attnd

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 50,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 256,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

Weights = Dict[str, np.ndarray]


# ---- the checkpoint ------------------------------------------------------------------------------

def random_weights(cfg: dict, seed: int) -> Weights:
    """Hugging Face Llama's tensor names and (out, in) shapes. Scaled by 1/sqrt(fan_in) so the
    activations neither vanish nor blow up through the layers, which keeps the greedy choices far
    from ties (a tie would make the comparison depend on the last bit)."""
    r = np.random.default_rng(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def lin(out_dim: int, in_dim: int) -> np.ndarray:
        return (r.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * r.standard_normal(n)).astype(np.float32)

    w: Weights = {"model.embed_tokens.weight": r.standard_normal((v, h)).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = lin(nh * d, h)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * d, h)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * d, h)
        w[p + "self_attn.o_proj.weight"] = lin(h, nh * d)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = (4.0 * lin(v, h)).astype(np.float32)
    return w


def write_safetensors(path: str, tensors: Weights) -> None:
    """safetensors: an 8-byte little-endian header length, the JSON header naming each tensor's
    dtype, shape and byte range, then the raw little-endian bytes."""
    header: Dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: List[bytes] = []
    offset = 0
    for name, t in tensors.items():
        data = np.ascontiguousarray(t, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def write_checkpoint(directory: str, cfg: dict, w: Weights) -> None:
    # The whole model goes in: attnd reads the attention tensors of each layer and skips the rest
    # (embeddings, norms, MLP, head), as it does for a real checkpoint.
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(directory, "model.safetensors"), w)


# ---- the parts outside attention (the runner's side) ------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def mlp(x: np.ndarray, w: Weights, i: int) -> np.ndarray:
    p = f"model.layers.{i}.mlp."
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ \
        w[p + "down_proj.weight"].T


def logits_of(h_last: np.ndarray, w: Weights, eps: float) -> np.ndarray:
    return rms_norm(h_last, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


# ---- the same attention in numpy ---------------------------------------------------------------

def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Hugging Face Llama's RoPE: x (heads, T, d), frequencies repeated over the two halves."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def local_attention(x: np.ndarray, w: Weights, i: int, cfg: dict,
                    probs: Optional[List[np.ndarray]] = None) -> np.ndarray:
    """LlamaAttention.forward over a whole sequence x (T, hidden), positions 0..T-1, causal;
    the last token's probabilities (n_heads, T) appended to ``probs`` when given."""
    p = f"model.layers.{i}.self_attn."
    t_n = x.shape[0]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ w[p + "q_proj.weight"].T).reshape(t_n, nh, d).transpose(1, 0, 2)
    k = (x @ w[p + "k_proj.weight"].T).reshape(t_n, nkv, d).transpose(1, 0, 2)
    v = (x @ w[p + "v_proj.weight"].T).reshape(t_n, nkv, d).transpose(1, 0, 2)
    pos = np.arange(t_n)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    group = nh // nkv
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)  # repeat_kv
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    s = np.where(np.tril(np.ones((t_n, t_n), bool)), s, -np.inf)
    pr = np.exp(s - s.max(axis=-1, keepdims=True))
    pr /= pr.sum(axis=-1, keepdims=True)
    if probs is not None:
        probs.append(pr[:, -1, :])
    o = (pr @ v).transpose(1, 0, 2).reshape(t_n, nh * d)
    return o @ w[p + "o_proj.weight"].T


def local_forward(tokens: List[int], w: Weights, cfg: dict,
                  probs: Optional[List[np.ndarray]] = None) -> np.ndarray:
    """The whole model on the whole sequence in float64; the last token's logits (and its
    attention probabilities per layer in ``probs``)."""
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    eps = cfg["rms_norm_eps"]
    h = w64["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + local_attention(rms_norm(h, w64[p + "input_layernorm.weight"], eps), w64, i, cfg,
                                probs)
        h = h + mlp(rms_norm(h, w64[p + "post_attention_layernorm.weight"], eps), w64, i)
    return logits_of(h[-1], w64, eps)


def generate_local(
    prompt: List[int], n: int, w: Weights, cfg: dict
) -> Tuple[List[int], List[np.ndarray], List[np.ndarray]]:
    """The tokens, every step's logits, and the last step's attention probabilities per layer."""
    tokens, all_logits = list(prompt), []
    probs: List[np.ndarray] = []
    for _ in range(n):
        probs = []
        lg = local_forward(tokens, w, cfg, probs)
        all_logits.append(lg)
        tokens.append(int(np.argmax(lg)))
    return tokens[len(prompt):], all_logits, probs


# ---- the model with attnd's attention ----------------------------------------------------------

def generate_attnd(
    client: "attnd.Client", prompts: List[List[int]], n: int, w: Weights, cfg: dict, tag: str
) -> Tuple[List[List[int]], List[List[np.ndarray]], List[Optional[np.ndarray]]]:
    """Every sequence gets a session; its prefill runs layer by layer per session, and each
    decode step runs every layer as one batched call for all sequences (how a runner keeps
    attnd's engine busy with one GEMM per layer instead of one per sequence). The last decode
    step's last layer also returns a selection of each sequence's attention: heads 0 and -1,
    (2, n_tokens) probabilities (None with a single token, which has no decode step)."""
    eps, layers = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    emb = w["model.embed_tokens.weight"]
    sessions = [client.session(f"{tag}-{j}") for j in range(len(prompts))]
    for s in sessions:  # a rerun against the same --url starts clean
        try:
            s.delete()
        except attnd.NotFound:
            pass

    def block(h: np.ndarray, i: int, attend) -> np.ndarray:
        p = f"model.layers.{i}."
        h = h + attend(rms_norm(h, w[p + "input_layernorm.weight"], eps))
        return h + mlp(rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, i)

    logits: List[List[np.ndarray]] = [[] for _ in prompts]
    last: List[int] = []
    for j, (s, prompt) in enumerate(zip(sessions, prompts)):  # prefill
        h = emb[prompt]
        for i in range(layers):
            h = block(h, i, lambda x, i=i: s.attend(i, x, expect_n_past=0).output)
        lg = logits_of(h[-1], w, eps)
        logits[j].append(lg)
        last.append(int(np.argmax(lg)))
    outs: List[List[int]] = [[t] for t in last]
    n_past = [len(p) for p in prompts]
    attention: List[Optional[np.ndarray]] = [None for _ in prompts]
    look = attnd.Selection(heads=[0, -1])  # only these heads' probabilities are computed
    for step in range(n - 1):  # decode: one batched call per layer for every sequence
        h_all = emb[[o[-1] for o in outs]]  # (sequences, hidden)

        def attend_all(x: np.ndarray, i: int) -> np.ndarray:
            inspect = step == n - 2 and i == layers - 1
            res = client.attend_batch(i, [
                {"session_id": s.id, "x": x[j], "expect_n_past": n_past[j],
                 "weights": look if inspect else False}
                for j, s in enumerate(sessions)])
            for j, r in enumerate(res):
                if isinstance(r, attnd.AttndError):
                    raise r  # a runner would retry or resync that sequence alone
                if inspect:
                    attention[j] = r.weights[:, 0, :]  # (heads, rows, keys): its one row
            return np.concatenate([r.output for r in res])

        for i in range(layers):
            h_all = block(h_all, i, lambda x, i=i: attend_all(x, i))
        for j in range(len(prompts)):
            lg = logits_of(h_all[j], w, eps)
            logits[j].append(lg)
            outs[j].append(int(np.argmax(lg)))
            n_past[j] += 1
    for s in sessions:
        s.delete()
    return outs, logits, attention


# ---- running attnd ------------------------------------------------------------------------------

def start_attnd(binary: str, model_dir: str) -> Tuple[subprocess.Popen, str, str]:
    log = tempfile.NamedTemporaryFile(prefix="attnd-generate-", suffix=".log", delete=False)
    proc = subprocess.Popen([binary, "--model", model_dir, "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=log)
    end = time.monotonic() + 15
    while time.monotonic() < end:
        with open(log.name, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        for line in text.splitlines():
            if " listening " in line and "port=" in line:
                port = int(line.split("port=", 1)[1].split()[0])
                return proc, f"http://127.0.0.1:{port}", log.name
        if proc.poll() is not None:
            sys.exit(f"attnd exited ({proc.returncode}):\n{text}")
        time.sleep(0.02)
    proc.kill()
    sys.exit("attnd did not start within 15 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=12, help="tokens to generate per prompt")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--dir", help="where to write the checkpoint (default: a temporary folder)")
    ap.add_argument("--url", help="an attnd serving --dir's checkpoint (else one is started)")
    ap.add_argument("--attnd",
                    default=os.environ.get("ATTND_BIN") or os.path.join(REPO, "build", "attnd"),
                    help="the attnd binary to start (default $ATTND_BIN, else build/attnd)")
    ap.add_argument("--write-only", action="store_true",
                    help="write the checkpoint to --dir and stop")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest logit difference accepted")
    args = ap.parse_args()

    cfg = dict(CONFIG)
    w = random_weights(cfg, args.seed)
    tmp: Optional[tempfile.TemporaryDirectory] = None
    model_dir = args.dir
    if model_dir is None:
        if args.write_only or args.url:
            ap.error("--write-only and --url need --dir (the checkpoint attnd serves)")
        tmp = tempfile.TemporaryDirectory(prefix="attnd-llama-")
        model_dir = tmp.name
    write_checkpoint(model_dir, cfg, w)
    print(f"checkpoint: {model_dir} (llama, hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads, "
          f"{cfg['num_key_value_heads']} kv heads, vocab {cfg['vocab_size']}, seed {args.seed})")
    if args.write_only:
        return 0

    proc = None
    log_path = None
    url = args.url
    if url is None:
        proc, url, log_path = start_attnd(args.attnd, model_dir)
        print(f"attnd: {os.path.relpath(args.attnd)} --model {model_dir} on {url}")
    try:
        client = attnd.Client(url)
        m = client.model()
        for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "num_hidden_layers"):
            if m[key] != cfg[key]:
                sys.exit(f"{url} serves another model: {key} {m[key]}, expected {cfg[key]}")
        print(f"served: family {m['attnd']['family']}, weights {m['attnd'].get('weights_dtype')}, "
              f"kv {m['attnd'].get('kv_dtype')}")
        prompts = [[1, 7, 3, 12, 5], [42, 0, 9]]
        t0 = time.monotonic()
        got, got_logits, got_attention = generate_attnd(client, prompts, args.tokens, w, cfg,
                                                        f"generate-{os.getpid()}")
        t_attnd = time.monotonic() - t0
        client.close()
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            if proc.wait(10) == 0 and log_path is not None:
                os.unlink(log_path)  # kept only when attnd did not stop cleanly

    ok = True
    worst = 0.0
    for j, prompt in enumerate(prompts):
        want, want_logits, want_probs = generate_local(prompt, args.tokens, w, cfg)
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(got_logits[j], want_logits))
        worst = max(worst, diff)
        same = got[j] == want
        ok = ok and same
        print(f"prompt {prompt}")
        print(f"  attnd + numpy : {got[j]}")
        print(f"  numpy alone   : {want}")
        print(f"  tokens {'identical' if same else 'DIFFER'}, max |logit difference| {diff:.3g}")
        a = got_attention[j]
        if a is not None:  # the last layer's heads 0 and -1, the last token's row
            b = want_probs[-1][[0, -1]]
            d = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
            ok = ok and d <= args.tol
            print(f"  last token's attention, layer {cfg['num_hidden_layers'] - 1}, heads 0 and "
                  f"-1 over {b.shape[1]} keys: max |difference| {d:.3g}")
    ok = ok and worst <= args.tol
    print(f"{len(prompts)} sequences x {args.tokens} tokens through attnd in "
          f"{t_attnd * 1000:.0f} ms; max |logit difference| {worst:.3g} (tolerance {args.tol:g}): "
          f"{'OK' if ok else 'MISMATCH'}")
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
