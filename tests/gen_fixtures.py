#!/usr/bin/python3
"""tests/gen_fixtures.py: writes the golden fixtures under tests/data/ (run with /usr/bin/python3,
which has Debian's numpy; the output is deterministic, so re-running it must leave git clean).

It is an independent implementation of the attention layer in float64 numpy (sharing nothing with
engine/ or tests/ref.c) and a hand-written safetensors writer, so that the C loader and the C math
are checked against something not written in C. What it writes is described in tests/data/README.md.

Usage: /usr/bin/python3 tests/gen_fixtures.py [out_dir]   (default: tests/data next to this file)
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

# ---- safetensors, by hand ------------------------------------------------------------------------
# Format: 8-byte little-endian header length N, then N bytes of JSON
# {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
# offsets are relative to the first byte after the header. The header is padded with spaces so the
# data starts 8-byte aligned, as the reference implementation does.


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest, ties to even."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def bf16_round(a):
    """The float32 values that a bfloat16 file holds for a."""
    return (bf16_bits(a).astype(np.uint32) << 16).view("<f4")


def f16_round(a):
    return np.asarray(a, dtype="<f4").astype("<f2").astype("<f4")


def encode(a, dtype):
    """Returns the little-endian bytes of float32 array a stored as dtype."""
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f4").astype("<f2").tobytes()
    if dtype == "BF16":
        return bf16_bits(a).tobytes()
    if dtype == "I8":
        return np.clip(np.round(np.asarray(a) * 127), -127, 127).astype("i1").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype, dtypes=None):
    """tensors: list of (name, float32 array), all stored as dtype except the names that dtypes
    maps to another one (a bad fixture uses that)."""
    dtypes = dtypes or {}
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, a in tensors:
        blob = encode(a, dtypes.get(name, dtype))
        header[name] = {
            "dtype": dtypes.get(name, dtype),
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---- the model, in float64 -----------------------------------------------------------------------


def yarn_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_freqs(cfg, seq_len=None):
    """(inv_freq, attention_factor) for a forward call whose positions reach seq_len, as
    transformers' modeling_rope_utils computes them for each rope_type (default, linear, llama3,
    yarn, longrope, dynamic)."""
    rd, theta = cfg["rotary_dim"], cfg["rope_theta"]
    exps = np.arange(0, rd, 2, dtype=np.float64) / rd
    f = theta ** -exps
    sc = cfg.get("rope_scaling")
    if sc is None:
        return f, 1.0
    kind = sc["type"]
    if kind == "linear":
        return f / sc["factor"], 1.0
    if kind == "llama3":
        factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        orig = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        low_wl, high_wl = orig / low, orig / high
        out = np.where(wavelen > low_wl, f / factor, f)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":  # _compute_yarn_parameters
        factor, orig = sc["factor"], sc["original"]
        att = sc.get("attention_factor")
        if att is None:
            if sc.get("mscale") and sc.get("mscale_all_dim"):
                att = yarn_mscale(factor, sc["mscale"]) / yarn_mscale(factor, sc["mscale_all_dim"])
            else:
                att = yarn_mscale(factor)

        def correction_dim(n_rot):
            return rd * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = correction_dim(sc.get("beta_fast", 32)), correction_dim(sc.get("beta_slow", 1))
        if sc.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        return (f / factor) * (1 - extrapolation) + f * extrapolation, att
    if kind == "longrope":  # _compute_longrope_parameters, long factors past the original context
        orig = sc["original"]
        factor = sc["max_pos"] / orig
        att = sc.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = sc["long_factor"] if seq_len is not None and seq_len > orig else sc["short_factor"]
        return 1.0 / (np.asarray(ext, np.float64) * theta ** exps), att
    assert kind == "dynamic"  # _compute_dynamic_ntk_parameters with seq_len = max(pos) + 1
    max_pos, factor = sc["max_pos"], sc["factor"]
    length = max(seq_len or 0, max_pos)
    base = theta * (factor * length / max_pos - (factor - 1)) ** (rd / (rd - 2))
    return base ** -exps, 1.0


def inv_freq(cfg):
    return rope_freqs(cfg)[0]


def call_lengths(positions, calls):
    """Per token, max(position_ids) + 1 of the forward call it is in: calls lists the calls'
    token counts (None: one call)."""
    positions = np.asarray(positions)
    calls = calls or [len(positions)]
    out, at = [], 0
    for n in calls:
        out += [int(positions[at:at + n].max()) + 1] * n
        at += n
    assert at == len(positions)
    return out


def rope(x, positions, cfg):
    """x: (T, heads, head_dim). Rotates the first rotary_dim dims of every head; cos and sin
    carry the scaling's attention factor, as transformers' rotary embeddings return them."""
    rd = cfg["rotary_dim"]
    cos, sin = [], []
    for p, n in zip(positions, call_lengths(positions, cfg.get("calls"))):
        f, att = rope_freqs(cfg, n)
        cos.append(att * np.cos(p * f))
        sin.append(att * np.sin(p * f))
    cos, sin = np.array(cos)[:, None, :], np.array(sin)[:, None, :]
    rot, rest = x[..., :rd], x[..., rd:]
    if cfg["rope_style"] == "half":
        a, b = rot[..., : rd // 2], rot[..., rd // 2 :]
        rot = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = np.empty_like(rot)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        rot = out
    return np.concatenate([rot, rest], axis=-1)


def rms_norm(x, weight, eps):
    """Hugging Face's RMSNorm (Qwen3RMSNorm, Olmo2RMSNorm) over the last axis:
    weight * x / sqrt(mean(x^2) + eps)."""
    return weight.astype(np.float64) * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def layer_is_sliding(cfg, li):
    """Whether layer li slides: cfg["layer_sliding"] lists it per layer (Gemma, Qwen2's
    max_window_layers); without it every layer slides when there is a window."""
    return bool(cfg["sliding_window"]) and cfg.get("layer_sliding", [True] * (li + 1))[li]


def attention_layer(w, x, positions, cfg, li=0):
    """Returns out (T, hidden), probs (H, T, T), k and v (Hkv, T, D), all float64."""
    sliding = layer_is_sliding(cfg, li)
    if sliding and cfg.get("rope_theta_local"):
        # modeling_gemma3: local layers rotate with rope_local_base_freq, default RoPE.
        cfg = dict(cfg, rope_theta=cfg["rope_theta_local"], rope_scaling=None)
    t = x.shape[0]
    h, hkv, d = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    x = x.astype(np.float64)

    def proj(name):
        y = x @ w[name + ".weight"].astype(np.float64).T
        if name + ".bias" in w:
            y = y + w[name + ".bias"].astype(np.float64)
        return y

    qp, kp = proj("q_proj"), proj("k_proj")
    clip = cfg.get("clip_qkv")
    if clip is not None:  # modeling_olmo: q, k and v clamped to [-clip_qkv, clip_qkv] as projected
        qp, kp = np.clip(qp, -clip, clip), np.clip(kp, -clip, clip)
    norm, eps = cfg.get("qk_norm"), cfg.get("norm_eps")
    if norm == "width":  # modeling_olmo2: q_norm(q_proj(x)) over the whole width, then the heads
        qp, kp = rms_norm(qp, w["q_norm.weight"], eps), rms_norm(kp, w["k_norm.weight"], eps)
    q, k = qp.reshape(t, h, d), kp.reshape(t, hkv, d)
    if norm == "head":  # modeling_qwen3: q_norm(q_proj(x).view(..., head_dim)), per head
        q, k = rms_norm(q, w["q_norm.weight"], eps), rms_norm(k, w["k_norm.weight"], eps)
    if norm == "layernorm_head":
        # modeling_stablelm (StableLmLayerNormPerHead: one nn.LayerNorm(head_dim, bias=False) per
        # head) and modeling_cohere (CohereLayerNorm with a (heads, head_dim) weight): per head,
        # (x - mean) / sqrt(biased var + eps) times that head's weight.
        def layer_norm(y, wt):
            mu = y.mean(axis=-1, keepdims=True)
            var = ((y - mu) ** 2).mean(axis=-1, keepdims=True)
            return wt.astype(np.float64)[None] * (y - mu) / np.sqrt(var + eps)
        q, k = layer_norm(q, w["q_norm.weight"]), layer_norm(k, w["k_norm.weight"])
    if norm == "layernorm_bias":
        # modeling_phi (qk_layernorm): one nn.LayerNorm(head_dim) for q and one for k, with a weight
        # and a bias, applied to every head: (x - mean) / sqrt(biased var + eps) * w + b.
        def layer_norm_bias(y, wt, b):
            mu = y.mean(axis=-1, keepdims=True)
            var = ((y - mu) ** 2).mean(axis=-1, keepdims=True)
            return (y - mu) / np.sqrt(var + eps) * wt.astype(np.float64) + b.astype(np.float64)
        q = layer_norm_bias(q, w["q_layernorm.weight"], w["q_layernorm.bias"])
        k = layer_norm_bias(k, w["k_layernorm.weight"], w["k_layernorm.bias"])
    if norm == "gemma":  # modeling_gemma3: Gemma3RMSNorm per head, output * (1 + weight)
        one = np.float64(1.0)
        q = rms_norm(q, one + w["q_norm.weight"].astype(np.float64), eps)
        k = rms_norm(k, one + w["k_norm.weight"].astype(np.float64), eps)
    # modeling_smollm3: apply_rotary_pos_emb only `if self.use_rope` (no_rope_layers[i] == 1)
    nope = not cfg.get("rope_layers", [1] * (li + 1))[li]
    if not (cfg.get("rope_sliding_only") and not sliding) and not nope:
        # modeling_cohere2: apply_rotary_pos_emb only `if self.sliding_window is not None`
        q = rope(q, positions, cfg)
        k = rope(k, positions, cfg)
    v = proj("v_proj")
    if clip is not None:
        v = np.clip(v, -clip, clip)
    v = v.reshape(t, hkv, d)
    group = h // hkv
    kk = np.repeat(k, group, axis=1)  # (T, H, D): head i reads kv head i // group
    vv = np.repeat(v, group, axis=1)
    # Gemma: scaling = query_pre_attn_scalar ** -0.5; Granite: attention_multiplier; others
    # head_dim ** -0.5.
    scale = cfg.get("attention_multiplier", cfg.get("query_pre_attn_scalar", d) ** -0.5)
    scores = np.einsum("ihd,jhd->hij", q, kk) * scale
    if cfg.get("softcap"):  # modeling_gemma2: tanh soft-cap after scaling, before the mask
        scores = np.tanh(scores / cfg["softcap"]) * cfg["softcap"]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = j <= i
    if sliding:
        visible &= (i - j) < cfg["sliding_window"]
    scores = np.where(visible[None], scores, -np.inf)
    if "sinks" in w:
        # modeling_gpt_oss (eager_attention_forward): each head's sink logit is concatenated as
        # one more column (unscaled), the softmax runs over all, and the sink column is dropped.
        sinks = np.broadcast_to(w["sinks"].astype(np.float64)[:, None, None], (h, t, 1))
        combined = np.concatenate([scores, sinks], axis=-1)
        combined -= combined.max(axis=-1, keepdims=True)
        probs = np.exp(combined)
        probs = (probs / probs.sum(axis=-1, keepdims=True))[..., :-1]
    else:
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
    ctx = np.einsum("hij,jhd->ihd", probs, vv).reshape(t, h * d)
    out = ctx @ w["o_proj.weight"].astype(np.float64).T
    if "o_proj.bias" in w:
        out = out + w["o_proj.bias"].astype(np.float64)
    return out, probs, k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def random_layer(rng, cfg, qkv_bias, o_bias):
    """nn.Linear init: uniform in [-1/sqrt(in), 1/sqrt(in)), float32."""
    hidden, h, hkv, d = cfg["hidden"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]

    def uni(shape, fan_in):
        b = 1 / math.sqrt(fan_in)
        return rng.uniform(-b, b, size=shape).astype(np.float32)

    w = {
        "q_proj.weight": uni((h * d, hidden), hidden),
        "k_proj.weight": uni((hkv * d, hidden), hidden),
        "v_proj.weight": uni((hkv * d, hidden), hidden),
        "o_proj.weight": uni((hidden, h * d), h * d),
    }
    if qkv_bias:
        w["q_proj.bias"] = uni((h * d,), hidden)
        w["k_proj.bias"] = uni((hkv * d,), hidden)
        w["v_proj.bias"] = uni((hkv * d,), hidden)
    if o_bias:
        w["o_proj.bias"] = uni((hidden,), h * d)
    if cfg.get("qk_norm"):
        # Around their init (ones; Gemma's zeros, applied as 1 + w), spread so that a norm
        # applied wrong shows.
        width = {"head": (d, d), "gemma": (d, d), "width": (h * d, hkv * d),
                 "layernorm_head": ((h, d), (hkv, d))}[cfg["qk_norm"]]
        lo = -0.5 if cfg["qk_norm"] == "gemma" else 0.5
        w["q_norm.weight"] = rng.uniform(lo, lo + 1, size=width[0]).astype(np.float32)
        w["k_norm.weight"] = rng.uniform(lo, lo + 1, size=width[1]).astype(np.float32)
    return w


def layer_tensors(layers, extra, prefix="model.layers"):
    """The HF tensor names, plus non-attention tensors a real checkpoint has (to be ignored)."""
    out = list(extra)
    for li, w in enumerate(layers):
        for name, a in w.items():
            out.append((f"{prefix}.{li}.self_attn.{name}", a))
        hidden = w["q_proj.weight"].shape[1]
        out.append((f"{prefix}.{li}.input_layernorm.weight", np.ones(hidden, np.float32)))
    return out


# ---- writers -------------------------------------------------------------------------------------


def write_bin(path, a, dtype="<f4"):
    np.ascontiguousarray(a, dtype=dtype).tofile(path)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def write_folder(path, config, tensors, dtype, shards=None):
    """shards: None for one model.safetensors, else a list of tensor-name lists, one per shard."""
    fresh_dir(path)
    write_json(os.path.join(path, "config.json"), config)
    if shards is None:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors, dtype)
        return
    by_name = dict(tensors)
    weight_map = {}
    total = 0
    for si, names in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(path, fname), [(n, by_name[n]) for n in names], dtype)
        for n in names:
            weight_map[n] = fname
            total += len(encode(by_name[n], dtype))
    assert sorted(weight_map) == sorted(by_name)
    write_json(
        os.path.join(path, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def write_expected(out_dir, prefix, layers, x, positions, cfg):
    for li, w in enumerate(layers):
        out, probs, k, v = attention_layer(w, x, positions, cfg, li)
        write_bin(os.path.join(out_dir, f"{prefix}_l{li}_out.bin"), out)
        write_bin(os.path.join(out_dir, f"{prefix}_l{li}_weights.bin"), probs)
        write_bin(os.path.join(out_dir, f"{prefix}_l{li}_k.bin"), k)
        write_bin(os.path.join(out_dir, f"{prefix}_l{li}_v.bin"), v)


def rounded(layers, fn):
    return [{n: fn(a) for n, a in w.items()} for w in layers]


# ---- the fixtures --------------------------------------------------------------------------------

# tiny: Llama-3.1 style, GQA 4/2, head_dim 16, biases on q/k/v/o, llama3 scaling with an original
# context of 64 so that with these wavelengths (6.3 .. 2e4) all three llama3 regimes occur.
TINY = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "max_position_embeddings": 256, "attention_bias": True, "sliding_window": None,
    "rms_norm_eps": 1e-05, "vocab_size": 8,
}
# 7 prefill tokens then 3 decode tokens, at positions 60..69 (crossing the original context).
TINY_T, TINY_DECODE, TINY_POS0 = 7, 3, 60

# alt: attnd's own layout (model_type "attnd": the engine's generic attention, every field
# explicit): q/k/v biases only, MQA 4/1, head_dim from hidden/heads, interleaved RoPE on half of
# each head, linear scaling spelled with "type", theta 1000, a sliding window of 4 on every layer.
ALT = {
    "hidden": 32, "n_heads": 4, "n_kv_heads": 1, "head_dim": 8, "n_layers": 1,
    "rotary_dim": 4, "rope_theta": 1000.0, "rope_style": "interleaved", "sliding_window": 4,
    "rope_scaling": {"type": "linear", "factor": 2.0},
}
ALT_CONFIG = {
    "model_type": "attnd", "torch_dtype": "float16",
    "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1,
    "num_hidden_layers": 1, "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
    "rope_style": "interleaved", "rope_scaling": {"type": "linear", "factor": 2.0},
    "max_position_embeddings": 64, "sliding_window": 4,
}

# qwen2: the alt weights read by Qwen2's own rules (configuration_qwen2.py, modeling_qwen2.py):
# q/k/v biases and no o bias by construction, rotate-half RoPE on whole heads, and
# use_sliding_window with max_window_layers 0, so that every layer (i >= 0) slides with window 4.
QWEN2 = dict(ALT, rotary_dim=8, rope_style="half")
QWEN2_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "float16",
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 1, "num_hidden_layers": 1, "rope_theta": 1000.0,
    "rope_scaling": {"type": "linear", "factor": 2.0}, "max_position_embeddings": 64,
    "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 0,
    "rms_norm_eps": 1e-06,
}
ALT_T, ALT_DECODE = 9, 3

# qwen3: GQA 4/2 with head_dim 32 given apart from hidden / heads (64 / 4 = 16), no biases, q/k
# RMSNorm per head (eps 1e-6), theta 1e6, BF16 as Qwen3 ships, 2 layers, no sliding layers.
QWEN3 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "n_layers": 2,
    "rotary_dim": 32, "rope_theta": 1000000.0, "rope_style": "half", "sliding_window": 0,
    "qk_norm": "head", "norm_eps": 1e-6,
}
QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "rope_theta": 1000000.0,
    "rope_scaling": None, "rms_norm_eps": 1e-06, "attention_bias": False,
    "max_position_embeddings": 128, "use_sliding_window": False, "sliding_window": None,
    "max_window_layers": 2, "tie_word_embeddings": True, "vocab_size": 8,
}
QWEN3_T, QWEN3_DECODE = 8, 3

# olmo2: MHA 4/4, head_dim 16, q/k RMSNorm over the whole projection (eps 1e-6 here, to tell it
# from the default 1e-5 only through the config), theta 500000, F32, positions from 90.
OLMO2 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 500000.0, "rope_style": "half", "sliding_window": 0,
    "qk_norm": "width", "norm_eps": 1e-6,
}
OLMO2_CONFIG = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 1, "rope_theta": 500000.0,
    "rope_scaling": None, "rms_norm_eps": 1e-06, "attention_bias": False,
    "max_position_embeddings": 256, "vocab_size": 8,
}
OLMO2_T, OLMO2_DECODE, OLMO2_POS0 = 6, 3, 90

# gemma2: 3 layers, local (0, 2: window 4) and global (1), head_dim 32 apart from 64 / 4,
# query_pre_attn_scalar 24 (scale 24^-1/2, not 32^-1/2), scores soft-capped at 1.0 (small, so
# that the cap shows on these scores), F32, 14 tokens.
GEMMA2 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "n_layers": 3,
    "rotary_dim": 32, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 4,
    "layer_sliding": [True, False, True], "query_pre_attn_scalar": 24, "softcap": 1.0,
}
GEMMA2_CONFIG = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 3, "rope_theta": 10000.0,
    "query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.0, "final_logit_softcapping": 30.0,
    "sliding_window": 4, "max_position_embeddings": 64, "attention_bias": False,
    "rms_norm_eps": 1e-06, "hidden_activation": "gelu_pytorch_tanh", "vocab_size": 8,
}
GEMMA2_T, GEMMA2_DECODE = 11, 3

# gemma3 (text): MQA 4/1, head_dim 16, query_pre_attn_scalar 20, Gemma's q/k RMSNorm (1 + w,
# eps 1e-6) per head, sliding_window_pattern 2 (layer 0 local, window 4; layer 1 global),
# global RoPE theta 1e6 with linear scaling 8, local theta 10000 unscaled, BF16, positions from 20.
GEMMA3 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 1, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 1000000.0, "rope_style": "half", "sliding_window": 4,
    "rope_scaling": {"type": "linear", "factor": 8.0}, "rope_theta_local": 10000.0,
    "layer_sliding": [True, False], "query_pre_attn_scalar": 20, "qk_norm": "gemma",
    "norm_eps": 1e-6,
}
GEMMA3_TEXT_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "torch_dtype": "bfloat16", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "num_hidden_layers": 2,
    "rope_theta": 1000000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 20, "sliding_window": 4,
    "sliding_window_pattern": 2, "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-06, "attention_bias": False,
    "vocab_size": 8,
}
GEMMA3_T, GEMMA3_DECODE, GEMMA3_POS0 = 9, 3, 20

# qwen2 with layers of both kinds: use_sliding_window, max_window_layers 1 (layer 0 full, layer 1
# sliding with window 3), F32.
QWEN2M = {
    "hidden": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "n_layers": 2,
    "rotary_dim": 8, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 3,
    "layer_sliding": [False, True],
}
QWEN2M_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "float32",
    "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "rope_theta": 10000.0, "max_position_embeddings": 64,
    "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1, "vocab_size": 8,
}
QWEN2M_T, QWEN2M_DECODE = 8, 3

# granite: GQA 4/2, head_dim 16, attention_multiplier 0.05 as the softmax scale (not 16^-1/2),
# biases on q/k/v/o (attention_bias), theta 10000, F32.
GRANITE = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "attention_multiplier": 0.05,
}
GRANITE_CONFIG = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 1, "rope_theta": 10000.0,
    "attention_multiplier": 0.05, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
    "logits_scaling": 8.0, "attention_bias": True, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-05, "vocab_size": 8,
}
GRANITE_T, GRANITE_DECODE = 7, 3

# phi3: a fused qkv_proj (q | k | v rows), GQA 4/2, head_dim 16 with partial_rotary_factor 0.75
# (12 dims rotate), the window (4) on every layer, no biases, BF16, 2 layers, positions from 5.
PHI3 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 12, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 4,
}
PHI3_CONFIG = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "partial_rotary_factor": 0.75,
    "rope_theta": 10000.0, "rope_scaling": None, "sliding_window": 4,
    "max_position_embeddings": 64, "original_max_position_embeddings": 64, "rms_norm_eps": 1e-05,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "vocab_size": 8,
}
PHI3_T, PHI3_DECODE, PHI3_POS0 = 8, 3, 5

# gpt_neox (Pythia): query_key_value with each head's q, k, v rows together, biases (attention_bias
# absent: true), rotary_pct 0.25 of head_dim 16 (4 dims), rotary_emb_base 10000, MHA, F16, 2 layers;
# the old checkpoints' buffers (attention.bias, attention.masked_bias, rotary_emb.inv_freq) too.
NEOX = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 4, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
}
NEOX_CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "torch_dtype": "float16",
    "hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
    "num_hidden_layers": 2, "rotary_pct": 0.25, "rotary_emb_base": 10000,
    "max_position_embeddings": 64, "use_parallel_residual": True, "layer_norm_eps": 1e-05,
    "vocab_size": 8,
}
NEOX_T, NEOX_DECODE = 7, 3

# gpt2: Conv1D c_attn (64, 192) and c_proj (64, 64), stored (in, out); biases; no RoPE (the
# caller's input already holds the position embeddings); scale_attn_weights; F32, 2 layers; the
# attn.bias / attn.masked_bias buffers of old checkpoints.
GPT2 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 0, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
}
GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4,
    "n_layer": 2, "n_positions": 64, "n_ctx": 64, "n_inner": None, "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
    "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new", "vocab_size": 8,
}
GPT2_T, GPT2_DECODE = 8, 3

# stablelm (StableLM 2 12B's attention): partial_rotary_factor 0.25 of head_dim 16 (4 dims),
# use_qkv_bias, qk_layernorm (per-head LayerNorm, weights q_layernorm.norms.{h}.weight), GQA 4/2,
# layer_norm_eps 1e-5, BF16, 2 layers.
STABLELM = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 4, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "qk_norm": "layernorm_head", "norm_eps": 1e-5,
}
STABLELM_CONFIG = {
    "architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "partial_rotary_factor": 0.25,
    "rope_theta": 10000, "use_qkv_bias": True, "qk_layernorm": True, "layer_norm_eps": 1e-05,
    "use_parallel_residual": True, "max_position_embeddings": 64, "vocab_size": 8,
}
STABLELM_T, STABLELM_DECODE = 7, 3

# cohere (Command R+ style): interleaved rotary over the whole head, use_qk_norm (LayerNorm per head,
# weight (heads, head_dim)), no biases, GQA 4/2, theta 8e6, F32, 1 layer, positions from 30.
COHERE = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 8e6, "rope_style": "interleaved", "sliding_window": 0,
    "qk_norm": "layernorm_head", "norm_eps": 1e-5,
}
COHERE_CONFIG = {
    "architectures": ["CohereForCausalLM"], "model_type": "cohere", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 1, "rope_theta": 8000000.0,
    "use_qk_norm": True, "layer_norm_eps": 1e-05, "attention_bias": False, "logit_scale": 0.125,
    "max_position_embeddings": 64, "vocab_size": 8,
}
COHERE_T, COHERE_DECODE, COHERE_POS0 = 6, 3, 30

# glm4 (GLM-4-0414): head_dim 16 of which half rotates, interleaved; q/k/v biases (attention_bias),
# no o bias; GQA 4/2; BF16, 2 layers.
GLM4 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 8, "rope_theta": 10000.0, "rope_style": "interleaved", "sliding_window": 0,
}
GLM4_CONFIG = {
    "architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
    "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "attention_bias": True,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 64, "vocab_size": 8,
}
GLM4_T, GLM4_DECODE = 8, 3

# Rotary scalings whose frequencies depend on more than theta. Each fixture's calls (a prefill,
# then single-token decodes) are part of its reference: longrope and dynamic choose frequencies
# per call from max(position_ids) + 1, as transformers' dynamic_rope_update does.
#
# phi3 with longrope (Phi-3-mini-128k's shape, shrunk): original context 16 (top-level
# original_max_position_embeddings), max_position_embeddings 64, so attention_factor
# sqrt(1 + ln 4 / ln 16); the prefill reaches position 14 and the first decode 15 (short factors),
# the next two 16 and 17 (long factors). Partial rotary 0.75 (12 dims, 6 factors), F32.
_rng = np.random.default_rng(47)
PHI3L_SHORT = [round(float(v), 4) for v in _rng.uniform(1.0, 3.0, 6)]
PHI3L_LONG = [round(float(v), 4) for v in _rng.uniform(2.0, 8.0, 6)]
PHI3L = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 12, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "rope_scaling": {"type": "longrope", "original": 16, "max_pos": 64,
                     "short_factor": PHI3L_SHORT, "long_factor": PHI3L_LONG},
}
PHI3L_CONFIG = dict(PHI3_CONFIG, num_hidden_layers=1, sliding_window=None,
                    max_position_embeddings=64, original_max_position_embeddings=16,
                    torch_dtype="float32",
                    rope_scaling={"type": "longrope", "short_factor": PHI3L_SHORT,
                                  "long_factor": PHI3L_LONG})
PHI3L_T, PHI3L_DECODE, PHI3L_POS0 = 10, 3, 5
PHI3L["calls"] = [PHI3L_T] + [1] * PHI3L_DECODE

# qwen2 with yarn as Qwen2.5's long-context recipe writes it (factor 4 over an original 2048,
# max_position_embeddings 8192 = factor x original, default betas, truncated range): positions
# 3000.. (past the original); q/k/v biases; F32.
YARNQ = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original": 2048},
}
YARNQ_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "float32",
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "rope_theta": 10000.0, "max_position_embeddings": 8192,
    "use_sliding_window": False, "vocab_size": 8,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
}
YARNQ_T, YARNQ_DECODE, YARNQ_POS0 = 7, 3, 3000

# llama with yarn in DeepSeek's spelling: mscale and mscale_all_dim set the attention factor,
# beta_fast 16, beta_slow 2, truncate false (gpt-oss's unrounded ramp), no original (so
# max_position_embeddings 4096 is), factor 8; F32.
YARNL_SCALING = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                 "mscale": 1.0, "mscale_all_dim": 0.8, "truncate": False}
YARNL = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 1, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 50000.0, "rope_style": "half", "sliding_window": 0,
    "rope_scaling": dict(YARNL_SCALING, type="yarn", original=4096),
}
YARNL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
    "num_hidden_layers": 1, "rope_theta": 50000.0, "max_position_embeddings": 4096,
    "rope_scaling": YARNL_SCALING, "vocab_size": 8,
}
YARNL_T, YARNL_DECODE, YARNL_POS0 = 6, 3, 1000

# llama with dynamic NTK: max_position_embeddings 16, factor 2; the prefill reaches 13, the
# decodes 14, 15 (theta as is), 16, 17 (theta grown for lengths 17 and 18). Served with
# max_seq 32 (the daemon's --max-seq). F32.
DYN = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "rope_scaling": {"type": "dynamic", "factor": 2.0, "max_pos": 16},
}
DYN_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "rope_theta": 10000.0, "max_position_embeddings": 16,
    "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "vocab_size": 8,
}
DYN_T, DYN_DECODE = 14, 4
DYN["calls"] = [DYN_T] + [1] * DYN_DECODE

# gpt_oss: learned sinks per query head, layer_types alternating sliding (window 3) and full,
# q/k/v/o biases (attention_bias), head_dim 24 (not hidden / heads), GQA 4/2, theta 150000, yarn
# factor 32 over an original 64 (max_position_embeddings 2048) with truncate false as gpt-oss
# ships it; positions 100..; 3 layers, BF16 (sinks too).
GPTOSS_SCALING = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                  "truncate": False, "original_max_position_embeddings": 64}
GPTOSS = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 24, "n_layers": 3,
    "rotary_dim": 24, "rope_theta": 150000.0, "rope_style": "half", "sliding_window": 3,
    "layer_sliding": [True, False, True],
    "rope_scaling": dict(GPTOSS_SCALING, type="yarn", original=64),
}
GPTOSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
    "attention_bias": True, "attention_dropout": 0.0, "experts_per_token": 4, "head_dim": 24,
    "hidden_act": "silu", "hidden_size": 64, "initial_context_length": 64,
    "intermediate_size": 64,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 2048, "num_attention_heads": 4, "num_experts_per_tok": 4,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "num_local_experts": 4,
    "rms_norm_eps": 1e-05, "rope_scaling": GPTOSS_SCALING, "rope_theta": 150000,
    "router_aux_loss_coef": 0.9, "sliding_window": 3, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 8,
}
GPTOSS_T, GPTOSS_DECODE, GPTOSS_POS0 = 8, 3, 100

# cohere2 (Command R7B's attention): sliding_window_pattern 2 (layer 0 sliding with window 3 and
# interleaved RoPE, layer 1 full without RoPE), GQA 4/2, no biases, F32, positions 20...
COHERE2 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 50000.0, "rope_style": "interleaved", "sliding_window": 3,
    "layer_sliding": [True, False], "rope_sliding_only": True,
}
COHERE2_CONFIG = {
    "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "rope_theta": 50000.0,
    "sliding_window": 3, "sliding_window_pattern": 2, "order_of_interleaved_layers":
    "local_attn_first", "attention_bias": False, "layer_norm_eps": 1e-05, "logit_scale": 0.25,
    "max_position_embeddings": 128, "rope_scaling": None, "vocab_size": 8,
}
COHERE2_T, COHERE2_DECODE, COHERE2_POS0 = 8, 3, 20

# falcon: one fused query_key_value, 2 layers each, whole-head RoPE (half style), in its three
# attentions (modeling_falcon _split_heads): multi_query (falcon-7b: one K/V head, the original
# checkpoints' n_head / n_layer names, no biases, BF16); new_decoder_architecture (falcon-40b /
# Falcon2: 8 query heads in 2 KV groups, biases, a larger theta, F32); and neither (one K/V head
# per query head, biases, F16, positions from 30, the rotary buffer of RW checkpoints).
FALCON_MQ = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 1, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "falcon": "multi_query",
}
FALCON_MQ_CONFIG = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "torch_dtype": "bfloat16",
    "hidden_size": 64, "n_head": 4, "n_layer": 2, "multi_query": True,
    "new_decoder_architecture": False, "parallel_attn": True, "bias": False, "alibi": False,
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "layer_norm_epsilon": 1e-05, "vocab_size": 8,
}
FALCON_NEW = dict(FALCON_MQ, n_heads=8, n_kv_heads=2, head_dim=8, rotary_dim=8,
                  rope_theta=500042.0, falcon="new_decoder_architecture")
FALCON_NEW_CONFIG = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "torch_dtype": "float32",
    "hidden_size": 64, "num_attention_heads": 8, "num_kv_heads": 2, "num_hidden_layers": 2,
    "new_decoder_architecture": True, "multi_query": True, "parallel_attn": True, "bias": True,
    "alibi": False, "rope_theta": 500042.0, "max_position_embeddings": 128,
    "num_ln_in_parallel_attn": 2, "ffn_hidden_size": 256, "activation": "gelu",
    "layer_norm_epsilon": 1e-05, "rope_scaling": None, "vocab_size": 8,
}
FALCON_MHA = dict(FALCON_MQ, n_kv_heads=4, falcon="per_head")
FALCON_MHA_CONFIG = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "torch_dtype": "float16",
    "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "multi_query": False,
    "new_decoder_architecture": False, "parallel_attn": False, "bias": True, "alibi": False,
    "max_position_embeddings": 128, "layer_norm_epsilon": 1e-05, "vocab_size": 8,
}
FALCON_T, FALCON_DECODE, FALCON_MHA_POS0 = 7, 3, 30

# The MoE families: their attention is a dense family's, their experts are not attention and are
# not read, so each checkpoint also holds its MoE block's tensors under the real names (which the
# loader must accept, never read).
#
# mixtral (modeling_mixtral: MixtralAttention is MistralAttention): GQA 4/2, head_dim 16, no
# biases, the window (5) on every layer, theta 1e6 (MixtralConfig's), BF16, 2 layers;
# block_sparse_moe.gate and block_sparse_moe.experts.{e}.w1/w2/w3.
MIXTRAL = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 1000000.0, "rope_style": "half", "sliding_window": 5,
}
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 32,
    "max_position_embeddings": 128, "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 2,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "sliding_window": 5,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 8,
}
MIXTRAL_T, MIXTRAL_DECODE = 9, 3

# qwen2_moe (Qwen1.5-MoE / Qwen2-57B-A14B's attention, modeling_qwen2_moe): q/k/v biases, no o
# bias, GQA 4/2, head_dim 16; a sliding_window (4) and max_window_layers (1) written but
# use_sliding_window false, so no layer slides (the prefill is longer than the window); theta 1e6;
# F16, 2 layers (layer 1 in mlp_only_layers: a dense mlp.*_proj); mlp.gate, mlp.experts.{e}.*,
# mlp.shared_expert.* and mlp.shared_expert_gate.
QWEN2MOE = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 1000000.0, "rope_style": "half", "sliding_window": 0,
}
QWEN2MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "torch_dtype": "float16",
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 128, "max_window_layers": 1,
    "mlp_only_layers": [1], "moe_intermediate_size": 16, "norm_topk_prob": False,
    "num_attention_heads": 4, "num_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 48,
    "sliding_window": 4, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 8,
}
QWEN2MOE_T, QWEN2MOE_DECODE = 8, 3

# qwen3_moe (Qwen3-30B-A3B's attention, modeling_qwen3_moe: Qwen3's): head_dim 32 given apart from
# hidden / heads (64 / 4 = 16, what Qwen3MoeConfig takes when absent, as 30B-A3B's 128 is apart
# from 2048 / 32), MQA 4/1, q/k RMSNorm per head (eps 1e-6), no biases, theta 1e6, no window
# (use_sliding_window false, sliding_window null), BF16, 2 layers, positions from 50; mlp.gate and
# mlp.experts.{e}.*.
QWEN3MOE = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 1, "head_dim": 32, "n_layers": 2,
    "rotary_dim": 32, "rope_theta": 1000000.0, "rope_style": "half", "sliding_window": 0,
    "qk_norm": "head", "norm_eps": 1e-6,
}
QWEN3MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 32, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
    "max_position_embeddings": 128, "max_window_layers": 2, "mlp_only_layers": [],
    "moe_intermediate_size": 16, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "vocab_size": 8,
}
QWEN3MOE_T, QWEN3MOE_DECODE, QWEN3MOE_POS0 = 8, 3, 50

# granitemoe (granite-3.0-1b-a400m's attention, modeling_granitemoe: Llama's with
# attention_multiplier as the scale): GQA 4/2, head_dim 16, attention_multiplier 0.0625 (not
# 16^-1/2 = 0.25), q/k/v/o biases (attention_bias), theta 10000, F32, 1 layer;
# block_sparse_moe.input_linear, output_linear (ParallelExperts: (experts, out, in)) and
# router.layer.
GRANITEMOE = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "attention_multiplier": 0.0625,
}
GRANITEMOE_CONFIG = {
    "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
    "torch_dtype": "float32", "attention_bias": True, "attention_dropout": 0.0,
    "attention_multiplier": 0.0625, "bos_token_id": 0, "embedding_multiplier": 12.0,
    "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 16, "logits_scaling": 6.0, "max_position_embeddings": 128,
    "num_attention_heads": 4, "num_experts_per_tok": 1, "num_hidden_layers": 1,
    "num_key_value_heads": 2, "num_local_experts": 2, "output_router_logits": False,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000, "router_aux_loss_coef": 0.01, "tie_word_embeddings": True,
    "use_cache": True, "vocab_size": 8,
}
GRANITEMOE_T, GRANITEMOE_DECODE = 7, 3
# starcoder2 (StarCoder2-3B's attention, shrunk): use_bias (q/k/v/o biases), GQA 4/2, head_dim 16,
# the window (3) on every layer, rope_theta as the real checkpoints write it, F16, 2 layers,
# positions from 10; the layers' LayerNorm biases and MLP (c_fc) to skip.
STARCODER2 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 999999.4420358813, "rope_style": "half", "sliding_window": 3,
}
STARCODER2_CONFIG = {
    "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2",
    "torch_dtype": "float16", "hidden_size": 64, "intermediate_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "rope_theta": 999999.4420358813, "sliding_window": 3, "use_bias": True,
    "max_position_embeddings": 128, "norm_epsilon": 1e-05, "norm_type": "layer_norm",
    "mlp_type": "default", "hidden_act": "gelu_pytorch_tanh", "attention_dropout": 0.1,
    "residual_dropout": 0.1, "embedding_dropout": 0.1, "vocab_size": 8,
}
STARCODER2_T, STARCODER2_DECODE, STARCODER2_POS0 = 8, 3, 10

# gemma (Gemma-2B's attention, shrunk): MQA 4/1, head_dim 32 apart from 64 / 4 (scale 32^-1/2), no
# biases, theta 10000, rope_scaling null as its config writes it, BF16, 2 layers, positions from 3.
GEMMA = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 1, "head_dim": 32, "n_layers": 2,
    "rotary_dim": 32, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
}
GEMMA_CONFIG = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2, "rope_theta": 10000.0,
    "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "gelu",
    "max_position_embeddings": 128, "rms_norm_eps": 1e-06, "vocab_size": 8,
}
GEMMA_T, GEMMA_DECODE, GEMMA_POS0 = 7, 3, 3

# smollm3: no_rope_layers [1, 0, 0] (layer 0 rotates, 1 and 2 do not), use_sliding_window with
# layer_types sliding, sliding, full (window 3): a sliding RoPE layer, a sliding NoPE layer and a
# full NoPE layer; GQA 4/2, head_dim 16, theta 5e6, no biases, BF16, positions from 40.
SMOLLM3 = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 3,
    "rotary_dim": 16, "rope_theta": 5000000.0, "rope_style": "half", "sliding_window": 3,
    "layer_sliding": [True, True, False], "rope_layers": [1, 0, 0],
}
SMOLLM3_CONFIG = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "torch_dtype": "bfloat16",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 3, "rope_theta": 5000000.0,
    "rope_scaling": None, "no_rope_layers": [1, 0, 0], "no_rope_layer_interval": 4,
    "use_sliding_window": True, "sliding_window": 3,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-06, "vocab_size": 8,
}
SMOLLM3_T, SMOLLM3_DECODE, SMOLLM3_POS0 = 8, 3, 40

# phi (Phi-2's attention, shrunk): q/k/v_proj and dense, all with biases, MHA, partial_rotary_factor
# 0.4 of head_dim 16 (int(6.4) = 6 dims rotate), no qk_layernorm, F16, 2 layers.
PHI = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 6, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
}
PHI_CONFIG = {
    "architectures": ["PhiForCausalLM"], "model_type": "phi", "torch_dtype": "float16",
    "hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 2, "partial_rotary_factor": 0.4,
    "qk_layernorm": False, "rope_theta": 10000.0, "rope_scaling": None, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 128, "hidden_act": "gelu_new", "resid_pdrop": 0.1,
    "embd_pdrop": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": False, "vocab_size": 8,
}
PHI_T, PHI_DECODE = 7, 3

# phi with qk_layernorm (no released Phi checkpoint sets it): one nn.LayerNorm(head_dim) with a
# weight and a bias for every head of q and one for k, before the partial rotary (0.5: 8 of 16
# dims), GQA 4/2, layer_norm_eps 1e-5, BF16, 1 layer, positions from 20.
PHIQ = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "n_layers": 1,
    "rotary_dim": 8, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "qk_norm": "layernorm_bias", "norm_eps": 1e-5,
}
PHIQ_CONFIG = dict(PHI_CONFIG, torch_dtype="bfloat16", num_key_value_heads=2,
                   num_hidden_layers=1, partial_rotary_factor=0.5, qk_layernorm=True)
PHIQ_T, PHIQ_DECODE, PHIQ_POS0 = 7, 3, 20

# olmo (OLMo-7B-0424's attention, shrunk): clip_qkv 0.25, which clamps about a third of these q, k
# and v values; MHA (num_key_value_heads absent), no biases, theta 10000, F32, 2 layers, positions
# from 50.
OLMO = {
    "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_layers": 2,
    "rotary_dim": 16, "rope_theta": 10000.0, "rope_style": "half", "sliding_window": 0,
    "clip_qkv": 0.25,
}
OLMO_CONFIG = {
    "architectures": ["OlmoForCausalLM"], "model_type": "olmo", "torch_dtype": "float32",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
    "clip_qkv": 0.25, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0, "hidden_act": "silu", "max_position_embeddings": 128,
    "pad_token_id": 1, "eos_token_id": 50279, "tie_word_embeddings": False, "vocab_size": 8,
}
OLMO_T, OLMO_DECODE, OLMO_POS0 = 7, 3, 50

# bad: a minimal valid model (hidden 8, 2 heads, 1 kv head) that each bad folder breaks once.
BAD = {"hidden": 8, "n_heads": 2, "n_kv_heads": 1, "head_dim": 4}
BAD_CONFIG = {
    "model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
    "max_position_embeddings": 32, "rope_theta": 10000.0,
}


def gen_tiny(out, exp):
    rng = np.random.default_rng(20241122)
    layers = [random_layer(rng, TINY, True, True) for _ in range(TINY["n_layers"])]
    n = TINY_T + TINY_DECODE
    x = rng.uniform(-1, 1, size=(n, TINY["hidden"])).astype(np.float32)
    positions = np.arange(TINY_POS0, TINY_POS0 + n, dtype=np.int32)
    write_bin(os.path.join(exp, "tiny_x.bin"), x)
    write_bin(os.path.join(exp, "tiny_pos.bin"), positions, "<i4")

    extra = [("model.embed_tokens.weight", np.zeros((8, 64), np.float32)),
             ("model.norm.weight", np.ones(64, np.float32))]
    tensors = layer_tensors(layers, extra)
    write_folder(os.path.join(out, "hf_tiny_f32"), TINY_CONFIG, tensors, "F32")
    write_expected(exp, "tiny_f32", layers, x, positions, TINY)

    # BF16, sharded so that layer 1 straddles the two files.
    cfg = dict(TINY_CONFIG, torch_dtype="bfloat16")
    names = [n for n, _ in tensors]
    split = names.index("model.layers.1.self_attn.v_proj.weight")
    write_folder(os.path.join(out, "hf_tiny_bf16"), cfg, tensors, "BF16",
                 shards=[names[:split], names[split:]])
    write_expected(exp, "tiny_bf16", rounded(layers, bf16_round), x, positions, TINY)


def gen_alt(out, exp):
    rng = np.random.default_rng(7)
    layers = [random_layer(rng, ALT, True, False)]
    n = ALT_T + ALT_DECODE
    x = rng.uniform(-1, 1, size=(n, ALT["hidden"])).astype(np.float32)
    positions = np.arange(n, dtype=np.int32)
    write_bin(os.path.join(exp, "alt_x.bin"), x)
    write_bin(os.path.join(exp, "alt_pos.bin"), positions, "<i4")
    tensors = layer_tensors(layers, [])
    write_folder(os.path.join(out, "hf_alt_f16"), ALT_CONFIG, tensors, "F16")
    write_expected(exp, "alt_f16", rounded(layers, f16_round), x, positions, ALT)

    # The same weights with the window switched off (null), and "default" RoPE.
    cfg = dict(ALT_CONFIG, sliding_window=None, rope_scaling={"rope_type": "default"})
    write_folder(os.path.join(out, "hf_alt_nowindow"), cfg, tensors, "F16")

    # The same weights as a Qwen2 checkpoint, with Qwen2's attention as the reference.
    write_folder(os.path.join(out, "hf_qwen2_f16"), QWEN2_CONFIG, tensors, "F16")
    write_expected(exp, "qwen2_f16", rounded(layers, f16_round), x, positions, QWEN2)


def gen_norms(out, exp):
    """The q/k-norm families: qwen3 (per head, BF16) and olmo2 (whole width, F32)."""
    rng = np.random.default_rng(33)
    layers = [random_layer(rng, QWEN3, False, False) for _ in range(QWEN3["n_layers"])]
    n = QWEN3_T + QWEN3_DECODE
    x = rng.uniform(-1, 1, size=(n, QWEN3["hidden"])).astype(np.float32)
    positions = np.arange(n, dtype=np.int32)
    write_bin(os.path.join(exp, "qwen3_x.bin"), x)
    write_bin(os.path.join(exp, "qwen3_pos.bin"), positions, "<i4")
    write_folder(os.path.join(out, "hf_qwen3_bf16"), QWEN3_CONFIG, layer_tensors(layers, []),
                 "BF16")
    write_expected(exp, "qwen3_bf16", rounded(layers, bf16_round), x, positions, QWEN3)

    layers = [random_layer(rng, OLMO2, False, False)]
    n = OLMO2_T + OLMO2_DECODE
    x = rng.uniform(-1, 1, size=(n, OLMO2["hidden"])).astype(np.float32)
    positions = np.arange(OLMO2_POS0, OLMO2_POS0 + n, dtype=np.int32)
    write_bin(os.path.join(exp, "olmo2_x.bin"), x)
    write_bin(os.path.join(exp, "olmo2_pos.bin"), positions, "<i4")
    write_folder(os.path.join(out, "hf_olmo2_f32"), OLMO2_CONFIG, layer_tensors(layers, []), "F32")
    write_expected(exp, "olmo2_f32", layers, x, positions, OLMO2)


def gen_inputs(exp, name, rng, n, hidden, pos0=0):
    x = rng.uniform(-1, 1, size=(n, hidden)).astype(np.float32)
    positions = np.arange(pos0, pos0 + n, dtype=np.int32)
    write_bin(os.path.join(exp, f"{name}_x.bin"), x)
    write_bin(os.path.join(exp, f"{name}_pos.bin"), positions, "<i4")
    return x, positions


def gen_windows(out, exp):
    """Families with local and global layers: gemma2, gemma3 (text and multimodal), qwen2."""
    rng = np.random.default_rng(44)
    layers = [random_layer(rng, GEMMA2, False, False) for _ in range(GEMMA2["n_layers"])]
    x, pos = gen_inputs(exp, "gemma2", rng, GEMMA2_T + GEMMA2_DECODE, GEMMA2["hidden"])
    write_folder(os.path.join(out, "hf_gemma2_f32"), GEMMA2_CONFIG, layer_tensors(layers, []),
                 "F32")
    write_expected(exp, "gemma2_f32", layers, x, pos, GEMMA2)

    layers = [random_layer(rng, GEMMA3, False, False) for _ in range(GEMMA3["n_layers"])]
    x, pos = gen_inputs(exp, "gemma3", rng, GEMMA3_T + GEMMA3_DECODE, GEMMA3["hidden"],
                        GEMMA3_POS0)
    write_folder(os.path.join(out, "hf_gemma3_bf16"), GEMMA3_TEXT_CONFIG,
                 layer_tensors(layers, []), "BF16")
    write_expected(exp, "gemma3_bf16", rounded(layers, bf16_round), x, pos, GEMMA3)
    # The same text model inside a multimodal (Gemma3ForConditionalGeneration) checkpoint.
    text = {k: v for k, v in GEMMA3_TEXT_CONFIG.items() if k != "architectures"}
    mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "torch_dtype": "bfloat16", "text_config": text,
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8}}
    vision = [("vision_tower.vision_model.post_layernorm.weight", np.ones(8, np.float32))]
    write_folder(os.path.join(out, "hf_gemma3_mm_bf16"), mm,
                 layer_tensors(layers, vision, "language_model.model.layers"), "BF16")

    layers = [random_layer(rng, GRANITE, True, True)]
    x, pos = gen_inputs(exp, "granite", rng, GRANITE_T + GRANITE_DECODE, GRANITE["hidden"])
    write_folder(os.path.join(out, "hf_granite_f32"), GRANITE_CONFIG, layer_tensors(layers, []),
                 "F32")
    write_expected(exp, "granite_f32", layers, x, pos, GRANITE)

    layers = [random_layer(rng, QWEN2M, True, False) for _ in range(QWEN2M["n_layers"])]
    x, pos = gen_inputs(exp, "qwen2m", rng, QWEN2M_T + QWEN2M_DECODE, QWEN2M["hidden"])
    write_folder(os.path.join(out, "hf_qwen2_mixed_f32"), QWEN2M_CONFIG,
                 layer_tensors(layers, []), "F32")
    write_expected(exp, "qwen2_mixed_f32", layers, x, pos, QWEN2M)


def uniform(rng, shape, fan_in):
    b = 1 / math.sqrt(fan_in)
    return rng.uniform(-b, b, size=shape).astype(np.float32)


def phi3_as_projections(w, cfg):
    """modeling_phi3: qkv = qkv_proj(x); q = qkv[..., :H*hd], k the next Hkv*hd, v the rest."""
    qkv = w["qkv_proj.weight"]
    qn, kn = cfg["n_heads"] * cfg["head_dim"], cfg["n_kv_heads"] * cfg["head_dim"]
    return {"q_proj.weight": qkv[:qn], "k_proj.weight": qkv[qn:qn + kn],
            "v_proj.weight": qkv[qn + kn:], "o_proj.weight": w["o_proj.weight"]}


def neox_as_projections(w, cfg):
    """modeling_gpt_neox: qkv.view(..., heads, 3 * head_size).chunk(3, dim=-1): output feature
    h * 3 * hd + part * hd + i is part (q, k, v) of head h, dim i."""
    h, d = cfg["n_heads"], cfg["head_dim"]
    wq = w["query_key_value.weight"].reshape(h, 3, d, -1)
    bq = w["query_key_value.bias"].reshape(h, 3, d)
    out = {"o_proj.weight": w["dense.weight"], "o_proj.bias": w["dense.bias"]}
    for part, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[name + ".weight"] = wq[:, part].reshape(h * d, -1)
        out[name + ".bias"] = bq[:, part].reshape(h * d)
    return out


def gpt2_as_projections(w, cfg):
    """modeling_gpt2: Conv1D computes x @ W + b with W stored (in, out); c_attn's output splits
    into q | k | v of n_embd each."""
    e = cfg["hidden"]
    ca, cb = w["c_attn.weight"], w["c_attn.bias"]
    out = {"o_proj.weight": w["c_proj.weight"].T, "o_proj.bias": w["c_proj.bias"]}
    for part, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[name + ".weight"] = ca[:, part * e:(part + 1) * e].T
        out[name + ".bias"] = cb[part * e:(part + 1) * e]
    return out


def stored_tensors(layers, prefix, module, extra=()):
    out = []
    for li, w in enumerate(layers):
        out += [(f"{prefix}.{li}.{module}.{n}", a) for n, a in w.items()]
        out += [(f"{prefix}.{li}.{module}.{n}", a) for n, a in extra]
    return out


def gen_layouts(out, exp):
    """Families whose projections are stored fused or transposed: phi3, gpt_neox, gpt2. The
    checkpoint holds their own layout; the reference splits it as their modeling code does."""
    rng = np.random.default_rng(45)
    hid, h, hkv, d = PHI3["hidden"], PHI3["n_heads"], PHI3["n_kv_heads"], PHI3["head_dim"]
    layers = [{"qkv_proj.weight": uniform(rng, ((h + 2 * hkv) * d, hid), hid),
               "o_proj.weight": uniform(rng, (hid, h * d), h * d)} for _ in range(2)]
    x, pos = gen_inputs(exp, "phi3", rng, PHI3_T + PHI3_DECODE, hid, PHI3_POS0)
    write_folder(os.path.join(out, "hf_phi3_bf16"), PHI3_CONFIG,
                 stored_tensors(layers, "model.layers", "self_attn"), "BF16")
    ref = [phi3_as_projections(w, PHI3) for w in rounded(layers, bf16_round)]
    write_expected(exp, "phi3_bf16", ref, x, pos, PHI3)

    hid, h, d = NEOX["hidden"], NEOX["n_heads"], NEOX["head_dim"]
    layers = [{"query_key_value.weight": uniform(rng, (3 * h * d, hid), hid),
               "query_key_value.bias": uniform(rng, (3 * h * d,), hid),
               "dense.weight": uniform(rng, (hid, h * d), h * d),
               "dense.bias": uniform(rng, (hid,), h * d)} for _ in range(2)]
    n_pos = NEOX_CONFIG["max_position_embeddings"]
    buffers = [("bias", np.tril(np.ones((1, 1, n_pos, n_pos), np.float32))),
               ("masked_bias", np.array(-1e4, np.float32)),
               ("rotary_emb.inv_freq", inv_freq(NEOX).astype(np.float32))]
    x, pos = gen_inputs(exp, "neox", rng, NEOX_T + NEOX_DECODE, hid)
    write_folder(os.path.join(out, "hf_gpt_neox_f16"), NEOX_CONFIG,
                 stored_tensors(layers, "gpt_neox.layers", "attention", buffers), "F16")
    ref = [neox_as_projections(w, NEOX) for w in rounded(layers, f16_round)]
    write_expected(exp, "gpt_neox_f16", ref, x, pos, NEOX)

    e = GPT2["hidden"]
    layers = [{"c_attn.weight": uniform(rng, (e, 3 * e), e),
               "c_attn.bias": uniform(rng, (3 * e,), e),
               "c_proj.weight": uniform(rng, (e, e), e),
               "c_proj.bias": uniform(rng, (e,), e)} for _ in range(2)]
    n_pos = GPT2_CONFIG["n_positions"]
    buffers = [("bias", np.tril(np.ones((1, 1, n_pos, n_pos), np.float32))),
               ("masked_bias", np.array(-1e4, np.float32))]
    x, pos = gen_inputs(exp, "gpt2", rng, GPT2_T + GPT2_DECODE, e)
    extra = [("transformer.wpe.weight", np.zeros((n_pos, e), np.float32)),
             ("transformer.ln_f.weight", np.ones(e, np.float32))]
    write_folder(os.path.join(out, "hf_gpt2_f32"), GPT2_CONFIG,
                 extra + stored_tensors(layers, "transformer.h", "attn", buffers), "F32")
    write_expected(exp, "gpt2_f32", [gpt2_as_projections(w, GPT2) for w in layers], x, pos, GPT2)


def gen_norms_and_rotary(out, exp):
    """stablelm and cohere (LayerNorm of each head), glm4 (partial interleaved rotary)."""
    rng = np.random.default_rng(46)
    layers = [random_layer(rng, STABLELM, True, False) for _ in range(STABLELM["n_layers"])]
    stored = []
    for w in layers:  # StableLmLayerNormPerHead: one LayerNorm module, one weight, per head
        sw = {n: a for n, a in w.items() if not n.endswith("_norm.weight")}
        for which in ("q", "k"):
            for h, row in enumerate(w[f"{which}_norm.weight"]):
                sw[f"{which}_layernorm.norms.{h}.weight"] = row
        stored.append(sw)
    x, pos = gen_inputs(exp, "stablelm", rng, STABLELM_T + STABLELM_DECODE, STABLELM["hidden"])
    write_folder(os.path.join(out, "hf_stablelm_bf16"), STABLELM_CONFIG,
                 stored_tensors(stored, "model.layers", "self_attn"), "BF16")
    write_expected(exp, "stablelm_bf16", rounded(layers, bf16_round), x, pos, STABLELM)

    layers = [random_layer(rng, COHERE, False, False)]
    x, pos = gen_inputs(exp, "cohere", rng, COHERE_T + COHERE_DECODE, COHERE["hidden"],
                        COHERE_POS0)
    write_folder(os.path.join(out, "hf_cohere_f32"), COHERE_CONFIG, layer_tensors(layers, []),
                 "F32")
    write_expected(exp, "cohere_f32", layers, x, pos, COHERE)

    layers = [random_layer(rng, GLM4, True, False) for _ in range(GLM4["n_layers"])]
    x, pos = gen_inputs(exp, "glm4", rng, GLM4_T + GLM4_DECODE, GLM4["hidden"])
    write_folder(os.path.join(out, "hf_glm4_bf16"), GLM4_CONFIG, layer_tensors(layers, []),
                 "BF16")
    write_expected(exp, "glm4_bf16", rounded(layers, bf16_round), x, pos, GLM4)


def falcon_as_projections(w, cfg):
    """modeling_falcon FalconAttention._split_heads, on query_key_value's output features:
    new_decoder_architecture views them (kv_heads, heads / kv_heads + 2, head_dim), each group's
    query heads then its key then its value; multi_query views (heads + 2, head_dim), the last two
    the one key and value; otherwise (heads, 3, head_dim)."""
    h, hkv, d = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    wq, bq = w["query_key_value.weight"], w.get("query_key_value.bias")
    parts = []
    for a in (wq, bq):
        if a is None:
            parts.append(None)
            continue
        tail = a.shape[1:]
        if cfg["falcon"] == "new_decoder_architecture":
            g = a.reshape((hkv, h // hkv + 2, d) + tail)
            q, k, v = g[:, :-2], g[:, -2], g[:, -1]
        elif cfg["falcon"] == "multi_query":
            g = a.reshape((h + 2, d) + tail)
            q, k, v = g[:-2], g[-2], g[-1]
        else:
            g = a.reshape((h, 3, d) + tail)
            q, k, v = g[:, 0], g[:, 1], g[:, 2]
        parts.append([q.reshape((h * d,) + tail), k.reshape((hkv * d,) + tail),
                      v.reshape((hkv * d,) + tail)])
    out = {"o_proj.weight": w["dense.weight"]}
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[name + ".weight"] = parts[0][i]
        if parts[1] is not None:
            out[name + ".bias"] = parts[1][i]
    if "dense.bias" in w:
        out["o_proj.bias"] = w["dense.bias"]
    return out


# deepseek: multi-head latent attention as modeling_deepseek_v3 computes it (V2's alike). V3:
# q_lora_rank 24 (q_a_proj, q_a_layernorm, q_b_proj), kv_lora_rank 16, qk_nope 8 + qk_rope 4, v 12,
# rope_interleave, no biases, 2 layers, BF16, the real config's head_dim (= qk_rope_head_dim) and
# MoE fields. V2 (Lite's shape): q_lora_rank null (q_proj), rope 8, v 8, attention_bias (kv_a and
# o biases; q_proj has none), yarn 40 over 64 with mscale = mscale_all_dim = 0.707 (the softmax
# scale grows by mscale(40, 0.707)^2 as DeepSeek's own modeling_deepseek.py computes it, so attnd
# loads it with --modeling-code checkpoint; transformers' port of V2 leaves that factor out), F32,
# 1 layer, positions 100.. Its rms_norm_eps (1e-2) is
# not the latent norms' (q_a_layernorm and kv_a_layernorm are built without it: 1e-6 always).
DSV3 = {"hidden": 64, "n_heads": 4, "q_lora": 24, "kv_lora": 16, "nope": 8, "rope": 4, "v": 12,
        "bias": False, "interleave": True, "rope_theta": 10000.0, "eps": 1e-6, "n_layers": 2,
        "rope_scaling": None}
DSV3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "torch_dtype": "bfloat16", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 2, "q_lora_rank": 24, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "head_dim": 4,
    "rope_interleave": True, "attention_bias": False, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "rope_scaling": None, "max_position_embeddings": 128, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "intermediate_size": 128, "vocab_size": 8,
}
DSV2 = {"hidden": 64, "n_heads": 4, "q_lora": 0, "kv_lora": 16, "nope": 8, "rope": 8, "v": 8,
        "bias": True, "interleave": True, "rope_theta": 10000.0, "eps": 1e-6, "n_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "original": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}}
DSV2_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "torch_dtype": "float32", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 1, "q_lora_rank": None, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "attention_bias": True,
    "rms_norm_eps": 1e-02, "rope_theta": 10000.0, "max_position_embeddings": 2560,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "vocab_size": 8,
}
DS_T, DS_DECODE, DSV2_POS0 = 8, 3, 100


def deepseek_layer(w, x, positions, cfg):
    """modeling_deepseek_v3 DeepseekV3Attention.forward, expanded (k and v per head), float64.
    Returns out (T, hidden) and probs (H, T, T)."""
    t, h = x.shape[0], cfg["n_heads"]
    nope, rope, kvl, vd = cfg["nope"], cfg["rope"], cfg["kv_lora"], cfg["v"]
    x = x.astype(np.float64)

    def lin(name, y):
        out = y @ w[name + ".weight"].astype(np.float64).T
        if name + ".bias" in w:
            out = out + w[name + ".bias"].astype(np.float64)
        return out

    def rms(y, weight):  # DeepseekV3RMSNorm
        return weight.astype(np.float64) * y / np.sqrt((y * y).mean(-1, keepdims=True) + cfg["eps"])

    if cfg["q_lora"]:
        q = lin("q_b_proj", rms(lin("q_a_proj", x), w["q_a_layernorm.weight"]))
    else:
        q = lin("q_proj", x)
    q = q.reshape(t, h, nope + rope)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    ckv = lin("kv_a_proj_with_mqa", x)
    k_pass = lin("kv_b_proj", rms(ckv[:, :kvl], w["kv_a_layernorm.weight"]))
    k_pass = k_pass.reshape(t, h, nope + vd)
    k_nope, v = k_pass[..., :nope], k_pass[..., nope:]
    k_rot = ckv[:, None, kvl:]  # (T, 1, rope)
    # the rotary embedding: cos = cat(freqs, freqs) times the attention factor
    f, att = rope_freqs(dict(rotary_dim=rope, rope_theta=cfg["rope_theta"],
                             rope_scaling=cfg["rope_scaling"]))
    ang = np.asarray(positions, np.float64)[:, None] * f[None]
    cos = (att * np.cos(np.concatenate([ang, ang], -1)))[:, None, :]
    sin = (att * np.sin(np.concatenate([ang, ang], -1)))[:, None, :]

    def rotate_half(y):
        return np.concatenate([-y[..., rope // 2:], y[..., :rope // 2]], -1)

    def deinterleave(y):  # apply_rotary_pos_emb_interleave's view(d // 2, 2).transpose
        return np.concatenate([y[..., 0::2], y[..., 1::2]], -1)

    if cfg["interleave"]:
        q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    query = np.concatenate([q_pass, q_rot], -1)
    key = np.concatenate([k_nope, np.broadcast_to(k_rot, (t, h, rope))], -1)
    scale = (nope + rope) ** -0.5
    sc = cfg["rope_scaling"]
    if sc is not None and sc.get("mscale_all_dim"):
        m = yarn_mscale(sc["factor"], sc["mscale_all_dim"])
        scale = scale * m * m
    scores = np.einsum("ihd,jhd->hij", query, key) * scale
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    scores = np.where((j <= i)[None], scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("hij,jhd->ihd", probs, v).reshape(t, h * vd)
    return lin("o_proj", ctx), probs


def gen_deepseek(out, exp):
    """deepseek_v3 and deepseek_v2 checkpoints in their own layout, and the expanded reference."""
    rng = np.random.default_rng(50)
    cases = [("dsv3", "hf_deepseek_v3_bf16", DSV3, DSV3_CONFIG, "BF16", bf16_round, 0),
             ("dsv2", "hf_deepseek_v2_f32", DSV2, DSV2_CONFIG, "F32", None, DSV2_POS0)]
    for name, folder, cfg, config, dtype, rounding, pos0 in cases:
        hid, h = cfg["hidden"], cfg["n_heads"]
        qk, kva = cfg["nope"] + cfg["rope"], cfg["kv_lora"] + cfg["rope"]
        layers = []
        for _ in range(cfg["n_layers"]):
            w = {}
            if cfg["q_lora"]:
                w["q_a_proj.weight"] = uniform(rng, (cfg["q_lora"], hid), hid)
                w["q_a_layernorm.weight"] = rng.uniform(0.5, 1.5, cfg["q_lora"]).astype(np.float32)
                w["q_b_proj.weight"] = uniform(rng, (h * qk, cfg["q_lora"]), cfg["q_lora"])
            else:
                w["q_proj.weight"] = uniform(rng, (h * qk, hid), hid)
            w["kv_a_proj_with_mqa.weight"] = uniform(rng, (kva, hid), hid)
            w["kv_a_layernorm.weight"] = rng.uniform(0.5, 1.5, cfg["kv_lora"]).astype(np.float32)
            w["kv_b_proj.weight"] = uniform(rng, (h * (cfg["nope"] + cfg["v"]), cfg["kv_lora"]),
                                            cfg["kv_lora"])
            w["o_proj.weight"] = uniform(rng, (hid, h * cfg["v"]), h * cfg["v"])
            if cfg["bias"]:
                w["kv_a_proj_with_mqa.bias"] = uniform(rng, (kva,), hid)
                w["o_proj.bias"] = uniform(rng, (hid,), h * cfg["v"])
            layers.append(w)
        x, pos = gen_inputs(exp, name, rng, DS_T + DS_DECODE, hid, pos0)
        extra = [("model.embed_tokens.weight", np.zeros((8, hid), np.float32))]
        write_folder(os.path.join(out, folder), config,
                     extra + stored_tensors(layers, "model.layers", "self_attn"), dtype)
        stored = rounded(layers, rounding) if rounding else layers
        for li, w in enumerate(stored):
            o, probs = deepseek_layer(w, x, pos, cfg)
            write_bin(os.path.join(exp, f"{name}_{dtype.lower()}_l{li}_out.bin"), o)
            write_bin(os.path.join(exp, f"{name}_{dtype.lower()}_l{li}_weights.bin"), probs)


def gen_falcon(out, exp):
    """falcon's three query_key_value layouts; the reference splits them as _split_heads does."""
    rng = np.random.default_rng(49)
    cases = [("falcon_mq", "hf_falcon_mq_bf16", FALCON_MQ, FALCON_MQ_CONFIG, "BF16", bf16_round,
              0, []),
             ("falcon_new", "hf_falcon_new_f32", FALCON_NEW, FALCON_NEW_CONFIG, "F32", None, 0,
              []),
             ("falcon_mha", "hf_falcon_mha_f16", FALCON_MHA, FALCON_MHA_CONFIG, "F16", f16_round,
              FALCON_MHA_POS0, [("maybe_rotary.inv_freq", inv_freq(FALCON_MHA).astype(np.float32))])]
    for name, folder, cfg, config, dtype, rounding, pos0, buffers in cases:
        hid, h, hkv, d = cfg["hidden"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        bias = config["bias"]
        layers = []
        for _ in range(cfg["n_layers"]):
            w = {"query_key_value.weight": uniform(rng, ((h + 2 * hkv) * d, hid), hid),
                 "dense.weight": uniform(rng, (hid, h * d), h * d)}
            if bias:
                w["query_key_value.bias"] = uniform(rng, ((h + 2 * hkv) * d,), hid)
                w["dense.bias"] = uniform(rng, (hid,), h * d)
            layers.append(w)
        x, pos = gen_inputs(exp, name, rng, FALCON_T + FALCON_DECODE, hid, pos0)
        extra = [("transformer.word_embeddings.weight", np.zeros((8, hid), np.float32))]
        write_folder(os.path.join(out, folder), config,
                     extra + stored_tensors(layers, "transformer.h", "self_attention", buffers),
                     dtype)
        stored = rounded(layers, rounding) if rounding else layers
        write_expected(exp, name + "_" + dtype.lower(),
                       [falcon_as_projections(w, cfg) for w in stored], x, pos, cfg)


def gen_rope_scalings(out, exp):
    """phi3 with longrope, qwen2 and llama with yarn, llama with dynamic NTK, gpt_oss (sinks,
    alternating layers, yarn with an unrounded ramp)."""
    rng = np.random.default_rng(48)
    hid, h, hkv, d = PHI3L["hidden"], PHI3L["n_heads"], PHI3L["n_kv_heads"], PHI3L["head_dim"]
    layers = [{"qkv_proj.weight": uniform(rng, ((h + 2 * hkv) * d, hid), hid),
               "o_proj.weight": uniform(rng, (hid, h * d), h * d)}]
    x, pos = gen_inputs(exp, "phi3l", rng, PHI3L_T + PHI3L_DECODE, hid, PHI3L_POS0)
    write_folder(os.path.join(out, "hf_phi3_longrope_f32"), PHI3L_CONFIG,
                 stored_tensors(layers, "model.layers", "self_attn"), "F32")
    write_expected(exp, "phi3_longrope_f32", [phi3_as_projections(w, PHI3L) for w in layers], x,
                   pos, PHI3L)

    for name, cfg, config, t, n, pos0, qkv_bias in (
            ("yarnq", YARNQ, YARNQ_CONFIG, YARNQ_T, YARNQ_DECODE, YARNQ_POS0, True),
            ("yarnl", YARNL, YARNL_CONFIG, YARNL_T, YARNL_DECODE, YARNL_POS0, False),
            ("dyn", DYN, DYN_CONFIG, DYN_T, DYN_DECODE, 0, False)):
        layers = [random_layer(rng, cfg, qkv_bias, False)]
        x, pos = gen_inputs(exp, name, rng, t + n, cfg["hidden"], pos0)
        folder = {"yarnq": "hf_qwen2_yarn_f32", "yarnl": "hf_llama_yarn_f32",
                  "dyn": "hf_llama_dynamic_f32"}[name]
        write_folder(os.path.join(out, folder), config, layer_tensors(layers, []), "F32")
        write_expected(exp, folder[3:], layers, x, pos, cfg)

    layers = [random_layer(rng, GPTOSS, True, True) for _ in range(GPTOSS["n_layers"])]
    for w in layers:  # sinks: a share of each row from small to most of it
        w["sinks"] = rng.uniform(-1.0, 3.0, GPTOSS["n_heads"]).astype(np.float32)
    x, pos = gen_inputs(exp, "gptoss", rng, GPTOSS_T + GPTOSS_DECODE, GPTOSS["hidden"],
                        GPTOSS_POS0)
    write_folder(os.path.join(out, "hf_gpt_oss_bf16"), GPTOSS_CONFIG, layer_tensors(layers, []),
                 "BF16")
    write_expected(exp, "gpt_oss_bf16", rounded(layers, bf16_round), x, pos, GPTOSS)

    layers = [random_layer(rng, COHERE2, False, False) for _ in range(COHERE2["n_layers"])]
    x, pos = gen_inputs(exp, "cohere2", rng, COHERE2_T + COHERE2_DECODE, COHERE2["hidden"],
                        COHERE2_POS0)
    write_folder(os.path.join(out, "hf_cohere2_f32"), COHERE2_CONFIG, layer_tensors(layers, []),
                 "F32")
    write_expected(exp, "cohere2_f32", layers, x, pos, COHERE2)


def moe_block(rng, family, hid, layer, config):
    """The tensors a real checkpoint of the family holds under model.layers.{layer} besides its
    attention (the loader must accept them and never read them): name suffix -> array."""
    e = config.get("num_experts", config.get("num_local_experts"))
    out = {"post_attention_layernorm.weight": np.ones(hid, np.float32)}
    if family == "mixtral":
        i = config["intermediate_size"]
        out["block_sparse_moe.gate.weight"] = uniform(rng, (e, hid), hid)
        for x in range(e):
            out[f"block_sparse_moe.experts.{x}.w1.weight"] = uniform(rng, (i, hid), hid)
            out[f"block_sparse_moe.experts.{x}.w2.weight"] = uniform(rng, (hid, i), i)
            out[f"block_sparse_moe.experts.{x}.w3.weight"] = uniform(rng, (i, hid), hid)
    elif family == "granitemoe":
        i = config["intermediate_size"]
        out["block_sparse_moe.input_linear.weight"] = uniform(rng, (e, 2 * i, hid), hid)
        out["block_sparse_moe.output_linear.weight"] = uniform(rng, (e, hid, i), i)
        out["block_sparse_moe.router.layer.weight"] = uniform(rng, (e, hid), hid)
    elif layer in config["mlp_only_layers"]:
        i = config["intermediate_size"]
        for n in ("gate_proj", "up_proj"):
            out[f"mlp.{n}.weight"] = uniform(rng, (i, hid), hid)
        out["mlp.down_proj.weight"] = uniform(rng, (hid, i), i)
    else:  # qwen2_moe, qwen3_moe
        i = config["moe_intermediate_size"]
        out["mlp.gate.weight"] = uniform(rng, (e, hid), hid)
        experts = [f"mlp.experts.{x}" for x in range(e)]
        if family == "qwen2_moe":
            experts.append("mlp.shared_expert")
            out["mlp.shared_expert_gate.weight"] = uniform(rng, (1, hid), hid)
        for m in experts:
            i_m = config["shared_expert_intermediate_size"] if "shared" in m else i
            out[f"{m}.gate_proj.weight"] = uniform(rng, (i_m, hid), hid)
            out[f"{m}.up_proj.weight"] = uniform(rng, (i_m, hid), hid)
            out[f"{m}.down_proj.weight"] = uniform(rng, (hid, i_m), i_m)
    return out


def gen_moe(out, exp):
    """mixtral, qwen2_moe, qwen3_moe, granitemoe: the attention of the dense family each one's
    modeling code inherits, beside its MoE block's tensors."""
    rng = np.random.default_rng(51)
    cases = [("mixtral", MIXTRAL, MIXTRAL_CONFIG, MIXTRAL_T, MIXTRAL_DECODE, 0, "BF16",
              bf16_round, False, False),
             ("qwen2_moe", QWEN2MOE, QWEN2MOE_CONFIG, QWEN2MOE_T, QWEN2MOE_DECODE, 0, "F16",
              f16_round, True, False),
             ("qwen3_moe", QWEN3MOE, QWEN3MOE_CONFIG, QWEN3MOE_T, QWEN3MOE_DECODE, QWEN3MOE_POS0,
              "BF16", bf16_round, False, False),
             ("granitemoe", GRANITEMOE, GRANITEMOE_CONFIG, GRANITEMOE_T, GRANITEMOE_DECODE, 0,
              "F32", None, True, True)]
    for family, cfg, config, t, n, pos0, dtype, rounding, qkv_bias, o_bias in cases:
        hid = cfg["hidden"]
        layers = [random_layer(rng, cfg, qkv_bias, o_bias) for _ in range(cfg["n_layers"])]
        x, pos = gen_inputs(exp, family, rng, t + n, hid, pos0)
        extra = [("model.embed_tokens.weight", np.zeros((8, hid), np.float32)),
                 ("model.norm.weight", np.ones(hid, np.float32))]
        for li in range(cfg["n_layers"]):
            extra += [(f"model.layers.{li}.{k}", a)
                      for k, a in moe_block(rng, family, hid, li, config).items()]
        name = f"{family}_{dtype.lower()}"
        write_folder(os.path.join(out, "hf_" + name), config, layer_tensors(layers, extra), dtype)
        write_expected(exp, name, rounded(layers, rounding) if rounding else layers, x, pos, cfg)
def gen_later_families(out, exp):
    """starcoder2, gemma, smollm3 (layers without RoPE), phi (dense as the output projection),
    olmo (clip_qkv) and phi with qk_layernorm (a LayerNorm with a bias)."""
    rng = np.random.default_rng(51)

    def skipped(hidden, n_layers, names):
        """Tensors of each layer outside its attention, which the loader must skip."""
        return [(f"model.layers.{li}.{n}", np.zeros(shape, np.float32))
                for li in range(n_layers) for n, shape in names(hidden)]

    layers = [random_layer(rng, STARCODER2, True, True) for _ in range(STARCODER2["n_layers"])]
    x, pos = gen_inputs(exp, "starcoder2", rng, STARCODER2_T + STARCODER2_DECODE,
                        STARCODER2["hidden"], STARCODER2_POS0)
    extra = skipped(64, 2, lambda h: [("input_layernorm.bias", (h,)),
                                      ("mlp.c_fc.weight", (4 * h, h))])
    write_folder(os.path.join(out, "hf_starcoder2_f16"), STARCODER2_CONFIG,
                 layer_tensors(layers, extra), "F16")
    write_expected(exp, "starcoder2_f16", rounded(layers, f16_round), x, pos, STARCODER2)

    layers = [random_layer(rng, GEMMA, False, False) for _ in range(GEMMA["n_layers"])]
    x, pos = gen_inputs(exp, "gemma", rng, GEMMA_T + GEMMA_DECODE, GEMMA["hidden"], GEMMA_POS0)
    write_folder(os.path.join(out, "hf_gemma_bf16"), GEMMA_CONFIG, layer_tensors(layers, []),
                 "BF16")
    write_expected(exp, "gemma_bf16", rounded(layers, bf16_round), x, pos, GEMMA)

    layers = [random_layer(rng, SMOLLM3, False, False) for _ in range(SMOLLM3["n_layers"])]
    x, pos = gen_inputs(exp, "smollm3", rng, SMOLLM3_T + SMOLLM3_DECODE, SMOLLM3["hidden"],
                        SMOLLM3_POS0)
    write_folder(os.path.join(out, "hf_smollm3_bf16"), SMOLLM3_CONFIG, layer_tensors(layers, []),
                 "BF16")
    write_expected(exp, "smollm3_bf16", rounded(layers, bf16_round), x, pos, SMOLLM3)

    # modeling_phi: PhiAttention's output projection is self.dense (o_proj deleted)
    layers = [random_layer(rng, PHI, True, True) for _ in range(PHI["n_layers"])]
    stored = [{n.replace("o_proj.", "dense."): a for n, a in w.items()} for w in layers]
    x, pos = gen_inputs(exp, "phi", rng, PHI_T + PHI_DECODE, PHI["hidden"])
    extra = [("model.final_layernorm.weight", np.ones(64, np.float32))] + skipped(
        64, 2, lambda h: [("input_layernorm.bias", (h,)), ("mlp.fc1.weight", (4 * h, h))])
    write_folder(os.path.join(out, "hf_phi_f16"), PHI_CONFIG,
                 extra + stored_tensors(stored, "model.layers", "self_attn"), "F16")
    write_expected(exp, "phi_f16", rounded(layers, f16_round), x, pos, PHI)

    layers = [random_layer(rng, OLMO, False, False) for _ in range(OLMO["n_layers"])]
    x, pos = gen_inputs(exp, "olmo", rng, OLMO_T + OLMO_DECODE, OLMO["hidden"], OLMO_POS0)
    q = x.astype(np.float64) @ layers[0]["q_proj.weight"].astype(np.float64).T
    assert 0.2 < np.mean(np.abs(q) > OLMO["clip_qkv"]) < 0.6, "clip_qkv must clip some, not all"
    write_folder(os.path.join(out, "hf_olmo_f32"), OLMO_CONFIG, layer_tensors(layers, []), "F32")
    write_expected(exp, "olmo_f32", layers, x, pos, OLMO)

    layers = [random_layer(rng, dict(PHIQ, qk_norm=None), True, True)]
    for w in layers:  # LayerNorm's init is weight 1, bias 0: spread around them
        for which in ("q", "k"):
            w[f"{which}_layernorm.weight"] = rng.uniform(0.5, 1.5, 16).astype(np.float32)
            w[f"{which}_layernorm.bias"] = rng.uniform(-0.5, 0.5, 16).astype(np.float32)
    stored = [{n.replace("o_proj.", "dense."): a for n, a in w.items()} for w in layers]
    x, pos = gen_inputs(exp, "phiq", rng, PHIQ_T + PHIQ_DECODE, PHIQ["hidden"], PHIQ_POS0)
    write_folder(os.path.join(out, "hf_phi_qk_layernorm_bf16"), PHIQ_CONFIG,
                 stored_tensors(stored, "model.layers", "self_attn"), "BF16")
    write_expected(exp, "phi_qk_layernorm_bf16", rounded(layers, bf16_round), x, pos, PHIQ)


def gen_bad(out):
    rng = np.random.default_rng(3)
    tensors = layer_tensors([random_layer(rng, BAD, False, False)], [])

    def folder(name, config=BAD_CONFIG, tensors=tensors, **kw):
        path = os.path.join(out, name)
        fresh_dir(path)
        write_json(os.path.join(path, "config.json"), config)
        write_safetensors(os.path.join(path, "model.safetensors"), tensors, "F32", **kw)
        return path

    # yarn whose factor disagrees with max_position_embeddings / original (transformers versions
    # differ on which applies), and Qwen2-VL's multimodal rotary, which attnd does not compute.
    folder("refuse_yarn_factor", dict(BAD_CONFIG, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}))
    folder("refuse_mrope", dict(BAD_CONFIG, rope_scaling={
        "type": "mrope", "mrope_section": [1, 1]}))
    folder("bad_dtype_i8", dtypes={"model.layers.0.self_attn.q_proj.weight": "I8"})
    wrong = "model.layers.0.self_attn.k_proj.weight"  # (4, 8) in a valid file
    folder("bad_shape", tensors=[(n, np.zeros((8, 8), np.float32) if n == wrong else a)
                                 for n, a in tensors])
    folder("bad_missing_tensor", tensors=[(n, a) for n, a in tensors if "v_proj" not in n])

    st = os.path.join(folder("bad_truncated"), "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(os.path.getsize(st) - 100)

    os.remove(os.path.join(folder("bad_no_config"), "config.json"))

    # Refused by name: attention tensors the family does not have (Qwen3's q/k norms and
    # gpt-oss's sinks in a llama-typed checkpoint, a bias Llama reads only with attention_bias),
    # and a family that is known but not served.
    hd = BAD["head_dim"]
    folder("refuse_qk_norm", tensors=tensors + [
        ("model.layers.0.self_attn.q_norm.weight", np.ones(hd, np.float32)),
        ("model.layers.0.self_attn.k_norm.weight", np.ones(hd, np.float32))])
    folder("refuse_sinks", tensors=tensors + [
        ("model.layers.0.self_attn.sinks", np.zeros(BAD["n_heads"], np.float32))])
    folder("refuse_o_bias", tensors=tensors + [
        ("model.layers.0.self_attn.o_proj.bias", np.zeros(BAD["hidden"], np.float32))])
    folder("refuse_llama4", dict(BAD_CONFIG, model_type="llama4"))
    # Read differently by transformers' releases or attention implementations: Gemma with a rope
    # scaling (4.38 ignores it, later releases apply it), SmolLM3 with a sliding layer but no
    # use_sliding_window (its eager and sdpa attention slide, flash attention does not).
    folder("refuse_gemma_scaling", dict(BAD_CONFIG, model_type="gemma", head_dim=4,
                                        rope_scaling={"rope_type": "linear", "factor": 2.0}))
    folder("refuse_smollm3_window", dict(BAD_CONFIG, model_type="smollm3", sliding_window=4,
                                         use_sliding_window=False,
                                         layer_types=["sliding_attention"]))
    # A model_type attnd does not know: refused, unless --trust-layout llama vouches for it.
    folder("unknown_family", dict(BAD_CONFIG, model_type="mystery"))

    path = folder("bad_missing_shard")
    os.remove(os.path.join(path, "model.safetensors"))
    write_json(os.path.join(path, "model.safetensors.index.json"),
               {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors"
                                               for n, _ in tensors}})

    def edit_header(path, edit):
        """Rewrites a safetensors file's header text through edit (str -> str), data unchanged."""
        with open(path, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        text = edit(raw[8:8 + n].decode().rstrip()).encode()
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + raw[8 + n:])

    # Bytes shared by two tensors (k_proj's range moved into q_proj's) and a name given twice
    # (a second q_proj on o_proj's bytes): which weights are read would depend on the reader.
    def overlap(text):
        h = json.loads(text)
        q = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
        k = h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"]
        h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"] = [q[0], q[0] + k[1] - k[0]]
        return json.dumps(h, separators=(",", ":"))

    def twice(text):
        h = json.loads(text)
        o = json.dumps(h["model.layers.0.self_attn.o_proj.weight"], separators=(",", ":"))
        return text[:-1] + ',"model.layers.0.self_attn.q_proj.weight":' + o + "}"

    edit_header(os.path.join(folder("bad_overlap"), "model.safetensors"), overlap)
    edit_header(os.path.join(folder("bad_name_twice"), "model.safetensors"), twice)

    # A NaN in an F32 k_proj and an infinity in an F16 o_proj: every answer would be null.
    def with_value(name, at, value):
        out = []
        for n, a in tensors:
            if n == name:
                a = a.copy()
                a[at] = value
            out.append((n, a))
        return out

    folder("bad_nan_weight", tensors=with_value("model.layers.0.self_attn.k_proj.weight",
                                                (1, 2), np.nan))
    path = folder("bad_inf_f16", tensors=with_value("model.layers.0.self_attn.o_proj.weight",
                                                    (0, 1), np.inf))
    write_safetensors(os.path.join(path, "model.safetensors"),
                      with_value("model.layers.0.self_attn.o_proj.weight", (0, 1), np.inf), "F16")
    # A v_proj weight past binary16's range (65504): served as F32 or BF16, refused as F16.
    folder("big_weight_f32", tensors=with_value("model.layers.0.self_attn.v_proj.weight",
                                                (3, 5), 1e5))

    # A shard holding a tensor its index leaves out (Qwen3's q norm in a llama checkpoint):
    # transformers loads whole shards, so it is part of the checkpoint and refused by name.
    path = folder("refuse_unlisted_qk_norm", tensors=tensors + [
        ("model.layers.0.self_attn.q_norm.weight", np.ones(hd, np.float32))])
    os.rename(os.path.join(path, "model.safetensors"),
              os.path.join(path, "model-00001-of-00001.safetensors"))
    write_json(os.path.join(path, "model.safetensors.index.json"),
               {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors"
                                               for n, _ in tensors}})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(here, "data")
    exp = os.path.join(out, "expected")
    fresh_dir(exp)
    gen_tiny(out, exp)
    gen_alt(out, exp)
    gen_norms(out, exp)
    gen_windows(out, exp)
    gen_layouts(out, exp)
    gen_norms_and_rotary(out, exp)
    gen_rope_scalings(out, exp)
    gen_falcon(out, exp)
    gen_deepseek(out, exp)
    gen_moe(out, exp)
    gen_later_families(out, exp)
    gen_bad(out)


if __name__ == "__main__":
    main()
