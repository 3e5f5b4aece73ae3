// Partial rotate-half rotary position embedding with (interleaved) multimodal sections, as in Qwen3.5.
#pragma once

#include <array>
#include <cstdint>

namespace clef::ops {

struct RopeParams {
    int rotary_dim = 0;  // even; the first rotary_dim dims of a head rotate, pairs (i, i + rotary_dim/2)
    double theta = 1e7;  // inv_freq_i = theta^(-2i/rotary_dim), i < rotary_dim/2
    // Frequencies per position axis (T, H, W); all zero = plain 1-D RoPE on the T positions. Otherwise the
    // three must sum to rotary_dim/2.
    std::array<int, 3> mrope_section{0, 0, 0};
    // Interleaved (Qwen3-VL / Qwen3.5): frequency i takes H if i%3==1 and i < 3*sec[1], W if i%3==2 and
    // i < 3*sec[2], else T. Not interleaved (Qwen2-VL): the first sec[0] frequencies take T, the next sec[1]
    // H, the rest W.
    bool interleaved = true;
    // false: inv_freq and angles in fp32 as HF does (inv_freq = 1 / theta^(2i/d) with an fp32 exponent, angle
    // = fp32(pos * inv_freq)); true: all in double, rounded once to fp32 after cos/sin.
    bool fp64_angles = false;
};

// The position axis (0 = T, 1 = H, 2 = W) that frequency i uses. Throws clef::Error when the sections are
// invalid.
int rope_axis(const RopeParams& p, int i);

// cos and sin tables [T][rotary_dim/2] for positions [3][T] (axis a of token t at positions[a*T + t]).
void rope_tables(const RopeParams& p, const int32_t* positions, int64_t T, float* cos, float* sin);

// In place on x [T][heads][head_dim] (row stride `stride` floats between tokens): for each head and
// i < rotary_dim/2, with c = cos[t][i], s = sin[t][i] and h = rotary_dim/2:
//     x'[i] = x[i] c - x[i+h] s,   x'[i+h] = x[i+h] c + x[i] s.
// Dims rotary_dim..head_dim-1 are untouched.
void rope_apply(float* x, int64_t T, int heads, int head_dim, int64_t stride, int rotary_dim,
                const float* cos, const float* sin);

}  // namespace clef::ops
