// Partial rotate-half rotary position embedding with (interleaved) multimodal sections, as in Qwen3.5, and
// the RoPE scaling types of transformers' rope_parameters (linear, dynamic, yarn, llama3, longrope;
// docs/LONG_CONTEXT.md).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace clef::ops {

// transformers' rope_type values ("default" and the legacy "mrope" are Default).
enum class RopeType { Default, Linear, Dynamic, Yarn, Llama3, LongRope };

// The config spelling ("default", "linear", "dynamic", "yarn", "llama3", "longrope").
const char* rope_type_name(RopeType t);
// The type of a config spelling; false for anything else.
bool parse_rope_type(const char* name, RopeType& out);

// The scaling of the inverse frequencies inv_i = theta^(-2i/d), d = rotary_dim, i < d/2 (all in rotary_dim
// space), and the factor that multiplies cos and sin. With L the sequence length (RopeParams::seq_len):
//   Linear:   inv_i / factor.
//   Dynamic:  theta' = theta * (factor * L' / M - (factor - 1))^(d / (d - 2)), L' = max(L, M), M =
//   original_max
//             (transformers reads max_position_embeddings here); theta' in place of theta.
//   Yarn:     a ramp between inv_i / factor (low frequencies) and inv_i (high frequencies) over the dims
//             [lo, hi] where a wave turns beta_slow .. beta_fast times within original_max positions (floor /
//             ceil when truncate); the same at every length.
//   Llama3:   wavelength w_i = 2 pi / inv_i against original_max / low_freq_factor (beyond: inv_i / factor)
//   and
//             original_max / high_freq_factor (below: inv_i), smoothly in between.
//   LongRope: inv_i / ext_i with ext = long_factor when L > original_max, short_factor otherwise.
// attention_factor multiplies cos and sin (the resolved value: yarn and longrope's defaults are derived when
// the config is read, model/config.cpp).
struct RopeScaling {
    RopeType type = RopeType::Default;
    double factor = 1.0;
    int64_t original_max = 0;  // pre-training context length (Dynamic: max_position_embeddings)
    double attention_factor = 1.0;
    double beta_fast = 32.0, beta_slow = 1.0;              // Yarn
    bool truncate = true;                                  // Yarn
    double low_freq_factor = 1.0, high_freq_factor = 4.0;  // Llama3
    std::vector<double> short_factor, long_factor;         // LongRope, rotary_dim/2 entries each
};

// transformers' yarn magnitude scale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale = 1.0);

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
    RopeScaling scaling;
    // The sequence length the length-dependent types (Dynamic, LongRope) decide on; 0 = the largest position
    // in the table + 1 (transformers' rule: max(position_ids) + 1 of the forward call).
    int64_t seq_len = 0;
};

// The position axis (0 = T, 1 = H, 2 = W) that frequency i uses. Throws clef::Error when the sections are
// invalid.
int rope_axis(const RopeParams& p, int i);

// The rotary_dim/2 inverse frequencies for sequence length seq_len (> 0), in double (the formulas above
// exactly); rope_tables' fp32 path evaluates the same formulas in transformers' fp32 operation order. Throws
// clef::Error when the params or the scaling are invalid.
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t seq_len);

// cos and sin tables [T][rotary_dim/2] for positions [3][T] (axis a of token t at positions[a*T + t]), each
// multiplied by p.scaling.attention_factor.
void rope_tables(const RopeParams& p, const int32_t* positions, int64_t T, float* cos, float* sin);

// In place on x [T][heads][head_dim] (row stride `stride` floats between tokens): for each head and
// i < rotary_dim/2, with c = cos[t][i], s = sin[t][i] and h = rotary_dim/2:
//     x'[i] = x[i] c - x[i+h] s,   x'[i+h] = x[i+h] c + x[i] s.
// Dims rotary_dim..head_dim-1 are untouched.
void rope_apply(float* x, int64_t T, int heads, int head_dim, int64_t stride, int rotary_dim,
                const float* cos, const float* sin);

}  // namespace clef::ops
