#!/usr/bin/env python3
"""Float64 RoPE tables for every rope scaling type a Qwen3.5 / Clef config can name, written for the tests from
transformers' documented formulas (its rope_parameters keys and defaults; docs/LONG_CONTEXT.md sums them up), not
from the engine's code. numpy only.

  rope_scaling_f64.py --out GOLDEN.json               # write the golden
  rope_scaling_f64.py --check GOLDEN.json             # regenerate and compare with a committed golden

Each case holds the rope_parameters (plus the text_config keys the types read: head_dim, max_position_embeddings),
the positions [3][T] of an interleaved-MRoPE prompt, the sequence length the length-dependent types decide on,
and the expected inverse frequencies, attention factor and cos / sin tables [T][rotary_dim/2] (attention factor
included). tests/test_rope_scaling.cpp compares the engine's tables with them.
"""
import argparse
import json
import math
import sys

import numpy as np

HEAD_DIM = 256  # Qwen3.5: head_dim 256, partial_rotary_factor 0.25 -> 64 rotary dims, sections [11, 11, 10]
PARTIAL = 0.25
SECTION = [11, 11, 10]


def base_inv_freq(theta, d):
    """theta^(-2i/d) for i < d/2."""
    return theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn(rp, theta, d):
    """Blend of the interpolated (inv / factor) and the original frequencies: a linear ramp in the frequency
    index between the dims where a wave turns beta_fast and beta_slow times over the original context."""
    factor = rp["factor"]
    omax = rp["original_max_position_embeddings"]
    beta_fast = rp.get("beta_fast") or 32
    beta_slow = rp.get("beta_slow") or 1

    def dim_of(turns):
        return d * math.log(omax / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if rp.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    inv = base_inv_freq(theta, d)
    inv = (inv / factor) * ramp + inv * (1 - ramp)
    if rp.get("attention_factor") is not None:
        att = rp["attention_factor"]
    elif rp.get("mscale") and rp.get("mscale_all_dim"):
        att = mscale(factor, rp["mscale"]) / mscale(factor, rp["mscale_all_dim"])
    else:
        att = mscale(factor)
    return inv, att


def llama3(rp, theta, d):
    """Long wavelengths (beyond original / low_freq_factor) divided by factor, short ones (below original /
    high_freq_factor) kept, a linear blend in original / wavelength between."""
    inv = base_inv_freq(theta, d)
    factor, omax = rp["factor"], rp["original_max_position_embeddings"]
    low, high = rp["low_freq_factor"], rp["high_freq_factor"]
    wl = 2 * math.pi / inv
    out = np.where(wl > omax / low, inv / factor, inv)
    mid = (wl >= omax / high) & (wl <= omax / low)
    s = (omax / wl - low) / (high - low)
    return np.where(mid, (1 - s) * out / factor + s * out, out), 1.0


def longrope(rp, theta, d, seq_len, max_pos):
    omax = rp["original_max_position_embeddings"]
    ext = np.array(rp["long_factor"] if seq_len > omax else rp["short_factor"], dtype=np.float64)
    factor = rp.get("factor", max_pos / omax)
    if rp.get("attention_factor") is not None:
        att = rp["attention_factor"]
    else:
        att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(omax))
    return base_inv_freq(theta, d) / ext, att


def inv_freq(case):
    rp, d = case["rope_parameters"], int(HEAD_DIM * PARTIAL)
    theta, kind, L = rp["rope_theta"], rp["rope_type"], case["seq_len"]
    if kind == "default":
        return base_inv_freq(theta, d), 1.0, theta
    if kind == "linear":
        return base_inv_freq(theta, d) / rp["factor"], 1.0, theta
    if kind == "dynamic":
        m, f = case["max_position_embeddings"], rp["factor"]
        base = theta * (f * max(L, m) / m - (f - 1)) ** (d / (d - 2))
        return base_inv_freq(base, d), 1.0, base
    if kind == "yarn":
        return (*yarn(rp, theta, d), theta)
    if kind == "llama3":
        return (*llama3(rp, theta, d), theta)
    if kind == "longrope":
        return (*longrope(rp, theta, d, L, case["max_position_embeddings"]), theta)
    raise SystemExit(f"unknown rope type {kind}")


def axis_of(i):
    """Interleaved MRoPE: frequency i reads H when i % 3 == 1 and i < 3 * sec[1], W when i % 3 == 2 and
    i < 3 * sec[2], else T."""
    if i % 3 == 1 and i < 3 * SECTION[1]:
        return 1
    if i % 3 == 2 and i < 3 * SECTION[2]:
        return 2
    return 0


def tables(case):
    inv, att, base = inv_freq(case)
    pos = np.array(case["positions"], dtype=np.float64)  # [3][T]
    half = len(inv)
    ang = np.stack([pos[axis_of(i)] * inv[i] for i in range(half)], axis=1)  # [T][half]
    return inv, att, base, att * np.cos(ang), att * np.sin(ang)


def positions(ts, image=None):
    """Text positions ts on all three axes, then (optionally) an image block: T fixed at image[0], H and W over
    an image[1] x image[2] grid."""
    p = [list(ts), list(ts), list(ts)]
    if image:
        t0, gh, gw = image
        for h in range(gh):
            for w in range(gw):
                p[0].append(t0)
                p[1].append(t0 + h)
                p[2].append(t0 + w)
    return p


LONG = [0, 1, 2, 7, 100, 4095, 4096, 8191, 8192, 32767, 65536, 131071, 200000, 262143, 262144, 300001, 524287,
        1048575]
SHORT = [0, 1, 5, 31, 64, 100, 1000, 2047, 3000, 4095]


def cases():
    q = {"rope_theta": 1e7, "partial_rotary_factor": PARTIAL, "mrope_section": SECTION, "mrope_interleaved": True}
    qwen_yarn = {**q, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
    rng = np.random.default_rng(7)
    short_f = [round(float(x), 4) for x in 1 + rng.random(32) * 0.5]
    long_f = [round(float(x), 4) for x in 1 + rng.random(32) * 30]
    longrope = {**q, "rope_type": "longrope", "original_max_position_embeddings": 4096, "short_factor": short_f,
                "long_factor": long_f}
    out = [
        ("default", {**q, "rope_type": "default"}, 262144, positions(LONG, (1000, 3, 4)), None),
        ("linear", {**q, "rope_type": "linear", "factor": 2.5}, 262144, positions(LONG, (1000, 3, 4)), None),
        # Dynamic below its max_position_embeddings: the plain frequencies; above: a larger base. The engine
        # decides on the whole prompt's length (seq_len), not on these positions' largest.
        ("dynamic_short", {**q, "rope_type": "dynamic", "factor": 2.0}, 8192, positions(SHORT), 4096),
        ("dynamic_long", {**q, "rope_type": "dynamic", "factor": 2.0}, 8192, positions(SHORT), 20000),
        ("yarn_qwen", qwen_yarn, 262144, positions(LONG, (5000, 2, 3)), None),
        # YaRN is not length dependent: positions all below the original context change as well.
        ("yarn_qwen_short", qwen_yarn, 262144, positions(SHORT, (10, 2, 2)), None),
        ("yarn_factor1", {**qwen_yarn, "factor": 1.0}, 262144, positions(LONG), None),
        ("yarn_options", {**q, "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32768,
                          "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False, "attention_factor": 0.9},
         262144, positions(LONG), None),
        ("yarn_mscale", {**q, "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                         "mscale": 1.0, "mscale_all_dim": 0.707}, 163840, positions(SHORT), None),
        ("llama3", {**q, "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 131072,
         positions(LONG[:12]), None),
        ("longrope_short", longrope, 131072, positions(SHORT), None),
        ("longrope_long", longrope, 131072, positions(SHORT), 100000),
    ]
    result = []
    for name, rp, max_pos, pos, seq_len in out:
        case = {"name": name, "rope_parameters": rp, "head_dim": HEAD_DIM, "max_position_embeddings": max_pos,
                "positions": pos, "seq_len": seq_len or (max(max(a) for a in pos) + 1)}
        inv, att, base, c, s = tables(case)
        case.update({"base": base, "inv_freq": inv.tolist(), "attention_factor": att, "cos": c.tolist(),
                     "sin": s.tolist()})
        result.append(case)
    return result


# The bound of the regenerated-vs-committed comparison, from the arithmetic rather than from one machine. numpy's
# vectorised power / sin / cos differ between its AVX-512 and AVX2 code paths (and between numpy builds) by a few
# ulp: each is within 4 ulp of the true value. An inverse frequency is that power followed by a few correctly
# rounded operations (a division by the factor, a blend with the ramp), so two runs agree to within ULPS units of
# EPS relative to it; the angle pos * inv_freq then inherits that relative error, which at positions up to 2^20 is
# far above an ulp of cos / sin (1e-10 absolute, measured), and cos / sin add their own few ulp of 1. So:
#   inv_freq, attention factor:  |a - b| <= ULPS * EPS * |b|
#   cos, sin (times att):        |a - b| <= ULPS * EPS * att * (|angle| + 1)
# ULPS = 16 leaves a factor of about 3 over the worst case of 4 + 0.5 + 0.5 + ... ulp per step. The C++ test
# (tests/test_rope_scaling.cpp) compares the engine's fp32 tables with the golden under its own bound.
EPS = 2.0**-52
ULPS = 16


def check(regenerated, committed):
    """Prints the worst difference and its ratio to the bound above; 0 when every value is within it."""
    worst, worst_ratio, where = 0.0, 0.0, ""
    for g, c in zip(regenerated, committed, strict=True):
        assert g["name"] == c["name"] and g["positions"] == c["positions"], g["name"]
        assert g["rope_parameters"] == c["rope_parameters"], g["name"]
        inv, att = np.array(c["inv_freq"]), c["attention_factor"]
        pos = np.array(c["positions"], dtype=np.float64)
        angle = np.stack([pos[axis_of(i)] * inv[i] for i in range(len(inv))], axis=1)
        bounds = {"inv_freq": ULPS * EPS * np.abs(inv), "cos": ULPS * EPS * abs(att) * (np.abs(angle) + 1)}
        bounds["sin"] = bounds["cos"]
        pairs = [(k, np.array(g[k]), np.array(c[k]), bounds[k]) for k in ("inv_freq", "cos", "sin")]
        pairs.append(("attention_factor", np.array(g["attention_factor"]), np.array(att),
                      np.array(ULPS * EPS * abs(att))))
        for key, a, b, bound in pairs:
            diff = np.abs(a - b)
            # A NaN on either side counts as over the bound (ratio inf).
            ratio = np.where(np.isnan(diff), np.inf, diff / np.maximum(bound, np.finfo(np.float64).tiny))
            if ratio.size and float(np.max(ratio)) > worst_ratio:
                worst_ratio, where = float(np.max(ratio)), f"{g['name']} {key}"
            worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
    print(f"regenerated rope golden vs committed: max abs {worst:.3e}, worst difference / bound {worst_ratio:.3f}"
          + (f" ({where})" if where else ""))
    return 0 if worst_ratio <= 1.0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check")
    a = ap.parse_args()
    golden = {"cases": cases()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(golden, f, indent=None, separators=(",", ":"))
            f.write("\n")
    if a.check:
        with open(a.check) as f:
            committed = json.load(f)
        return check(golden["cases"], committed["cases"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
