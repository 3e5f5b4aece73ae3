#!/usr/bin/env python3
"""An independent float64 forward of the Qwen3.5 text backbone (numpy only), written for the tests from the math in
the fixture README (tests/data/tiny-clef27/README.md) and the model's config, not from the engine's code.

It gives the last hidden state (after the final norm) of a list of token ids, for text positions. The GDN gated
norm's activation follows `text_config.output_gate_type` ("swish"/"silu": z * sigmoid(z); "sigmoid": sigmoid(z));
the attention output gate is sigmoid(gate) always.

  qwen35_f64.py MODEL_DIR --case CASES.json NAME [--tokens N] [--gate swish|sigmoid] --out OUT.json
  qwen35_f64.py MODEL_DIR --case CASES.json NAME --check-golden   # compare with the case's own float64 golden

--check-golden validates this oracle against the publisher-code goldens (last_hidden_state of the case), so the
oracle's output for a config the goldens do not cover (the sigmoid gate) can be trusted.
"""
import argparse
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        else:
            raise SystemExit(f"{name}: dtype {info['dtype']} not handled")
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def rms_zero_centred(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def l2n(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def gdn_mixer(x, W, p, cfg, gate):
    T = x.shape[0]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    K = cfg.get("linear_conv_kernel_dim", 4)
    qkv = x @ W[p + "in_proj_qkv.weight"].T  # [T, C]
    w = W[p + "conv1d.weight"][:, 0, :]  # [C, K]
    pad = np.vstack([np.zeros((K - 1, qkv.shape[1])), qkv])
    conv = sum(w[:, j] * pad[j : j + T] for j in range(K))  # tap K-1 on the current token
    conv = conv * sigmoid(conv)
    q = conv[:, : hk * dk].reshape(T, hk, dk)
    k = conv[:, hk * dk : 2 * hk * dk].reshape(T, hk, dk)
    v = conv[:, 2 * hk * dk :].reshape(T, hv, dv)
    z = (x @ W[p + "in_proj_z.weight"].T).reshape(T, hv, dv)
    beta = sigmoid(x @ W[p + "in_proj_b.weight"].T)  # [T, hv]
    g = -np.exp(W[p + "A_log"]) * softplus(x @ W[p + "in_proj_a.weight"].T + W[p + "dt_bias"])
    q = l2n(q) / np.sqrt(dk)
    k = l2n(k)
    r = hv // hk
    o = np.zeros((T, hv, dv))
    for h in range(hv):
        kh = h // r  # value head h reads key head h // r (repeat_interleave)
        S = np.zeros((dk, dv))
        for t in range(T):
            S *= np.exp(g[t, h])
            u = beta[t, h] * (v[t, h] - S.T @ k[t, kh])
            S += np.outer(k[t, kh], u)
            o[t, h] = S.T @ q[t, kh]
    on = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + cfg["rms_norm_eps"]) * W[p + "norm.weight"]
    act = z * sigmoid(z) if gate in ("swish", "silu") else sigmoid(z)
    y = (on * act).reshape(T, hv * dv)
    return y @ W[p + "out_proj.weight"].T


def rope(x, pos, rd, theta):
    half = rd // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rd)
    ang = pos[:, None] * inv[None, :]  # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    a, b = x[..., :half], x[..., half:rd]
    out[..., :half] = a * c - b * s
    out[..., half:rd] = b * c + a * s
    return out


def attention_mixer(x, W, p, cfg):
    T = x.shape[0]
    H, Hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    qg = (x @ W[p + "q_proj.weight"].T).reshape(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (x @ W[p + "k_proj.weight"].T).reshape(T, Hkv, hd)
    v = (x @ W[p + "v_proj.weight"].T).reshape(T, Hkv, hd)
    q = rms_zero_centred(q, W[p + "q_norm.weight"], eps)
    k = rms_zero_centred(k, W[p + "k_norm.weight"], eps)
    rp = cfg.get("rope_parameters", {})
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    theta = rp.get("rope_theta", cfg.get("rope_theta", 1e7))
    rd = int(round(hd * prf))
    pos = np.arange(T, dtype=np.float64)
    q, k = rope(q, pos, rd, theta), rope(k, pos, rd, theta)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    out = np.zeros((T, H, hd))
    for h in range(H):
        kv = h // (H // Hkv)  # query head h reads KV head h // (H / Hkv)
        s = q[:, h] @ k[:, kv].T / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv]
    out = out * sigmoid(gate)
    return out.reshape(T, H * hd) @ W[p + "o_proj.weight"].T


def forward(model_dir, ids, gate=None):
    full = json.load(open(f"{model_dir}/config.json"))
    cfg = full.get("text_config", full)
    gate = gate or cfg.get("output_gate_type", "swish")
    W = read_safetensors(f"{model_dir}/model.safetensors")
    pre = "model.language_model."
    eps = cfg["rms_norm_eps"]
    x = W[pre + "embed_tokens.weight"][np.asarray(ids)]
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"{pre}layers.{i}."
        h = rms_zero_centred(x, W[p + "input_layernorm.weight"], eps)
        if kind == "linear_attention":
            x = x + gdn_mixer(h, W, p + "linear_attn.", cfg, gate)
        else:
            x = x + attention_mixer(h, W, p + "self_attn.", cfg)
        h = rms_zero_centred(x, W[p + "post_attention_layernorm.weight"], eps)
        gp, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (gp * sigmoid(gp) * up) @ W[p + "mlp.down_proj.weight"].T
    return rms_zero_centred(x, W[pre + "norm.weight"], eps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--case", nargs=2, metavar=("CASES", "NAME"), required=True)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--gate", choices=["swish", "silu", "sigmoid"])
    ap.add_argument("--out")
    ap.add_argument("--check-golden", action="store_true")
    a = ap.parse_args()
    cases = json.load(open(a.case[0]))["cases"]
    case = next(c for c in cases if c["name"] == a.case[1])
    ids = case["input_ids"][: a.tokens or None]
    hidden = forward(a.model_dir, ids, a.gate)
    if a.check_golden:
        want = np.asarray(case["last_hidden_state"])[: len(ids)]
        err = float(np.max(np.abs(hidden - want)))
        print(f"oracle vs golden ({a.case[1]}, {len(ids)} tokens): max abs {err:.3e}")
        return 0 if err < 1e-9 else 1
    json.dump({"generator": "tests/oracle/qwen35_f64.py", "case": a.case[1], "gate": a.gate or "config",
               "input_ids": ids, "last_hidden_state": hidden.tolist()}, open(a.out, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
