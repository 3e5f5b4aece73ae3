#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include "util/error.h"

namespace clef::ops {

namespace {

constexpr struct {
    RopeType type;
    const char* name;
} kRopeTypes[] = {{RopeType::Default, "default"}, {RopeType::Linear, "linear"},
                  {RopeType::Dynamic, "dynamic"}, {RopeType::Yarn, "yarn"},
                  {RopeType::Llama3, "llama3"},   {RopeType::LongRope, "longrope"}};

void check_scaling(const RopeScaling& s, int rotary_dim) {
    auto fail = [&](const std::string& what) {
        throw Error(std::string("rope: ") + rope_type_name(s.type) + " scaling: " + what);
    };
    if (s.type == RopeType::Default) return;
    if (!(s.factor > 0) || !std::isfinite(s.factor)) fail("factor must be positive");
    if (!(s.attention_factor > 0) || !std::isfinite(s.attention_factor))
        fail("attention_factor must be positive");
    if (s.type != RopeType::Linear && s.original_max <= 0)
        fail("the original context length must be positive");
    if (s.type == RopeType::Dynamic && rotary_dim <= 2) fail("rotary_dim must be more than 2");
    if (s.type == RopeType::Yarn && !(s.beta_fast > 0 && s.beta_slow > 0))
        fail("beta_fast and beta_slow must be positive");
    if (s.type == RopeType::Llama3 && !(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor))
        fail("high_freq_factor must exceed low_freq_factor > 0");
    if (s.type == RopeType::LongRope) {
        for (const auto* f : {&s.short_factor, &s.long_factor}) {
            if (static_cast<int>(f->size()) != rotary_dim / 2)
                fail("short_factor and long_factor need rotary_dim/2 = " + std::to_string(rotary_dim / 2) +
                     " entries, got " + std::to_string(f->size()));
            for (double v : *f)
                if (!(v > 0) || !std::isfinite(v))
                    fail("short_factor and long_factor entries must be positive");
        }
    }
}

void check_params(const RopeParams& p) {
    if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0)
        throw Error("rope: rotary_dim must be positive and even, got " + std::to_string(p.rotary_dim));
    const auto& s = p.mrope_section;
    const bool plain = s[0] == 0 && s[1] == 0 && s[2] == 0;
    if (!plain && (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[0] + s[1] + s[2] != p.rotary_dim / 2))
        throw Error("rope: mrope_section must sum to rotary_dim/2 = " + std::to_string(p.rotary_dim / 2));
    check_scaling(p.scaling, p.rotary_dim);
}

int axis_unchecked(const RopeParams& p, int i) {
    const auto& s = p.mrope_section;
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) return 0;
    if (p.interleaved) {
        if (i % 3 == 1 && i < 3 * s[1]) return 1;
        if (i % 3 == 2 && i < 3 * s[2]) return 2;
        return 0;
    }
    if (i < s[0]) return 0;
    if (i < s[0] + s[1]) return 1;
    return 2;
}

// YaRN's correction range: the dims [lo, hi] (of rotary_dim) whose waves turn beta_fast .. beta_slow times
// within the original context; floored / ceiled when truncating, clamped to [0, rotary_dim - 1].
std::pair<double, double> yarn_range(const RopeScaling& s, double theta, int d) {
    auto dim_for = [&](double rotations) {
        return d * std::log(static_cast<double>(s.original_max) / (rotations * 2 * std::numbers::pi)) /
               (2 * std::log(theta));
    };
    double lo = dim_for(s.beta_fast), hi = dim_for(s.beta_slow);
    if (s.truncate) {
        lo = std::floor(lo);
        hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, static_cast<double>(d - 1));
    if (lo == hi) hi += 0.001;  // as transformers: no zero-width ramp
    return {lo, hi};
}

// Llama 3.1's frequency for the unscaled inv (transformers' order of fp32 operations for F = float).
template <class F>
F llama3_freq(const RopeScaling& s, F inv) {
    const F one = 1, factor = static_cast<F>(s.factor);
    const double old_ctx = static_cast<double>(s.original_max);
    const F low_wl = static_cast<F>(old_ctx / s.low_freq_factor),
            high_wl = static_cast<F>(old_ctx / s.high_freq_factor);
    const F wl = one / inv * static_cast<F>(2 * std::numbers::pi);
    const F scaled = wl > low_wl ? inv / factor : inv;
    if (wl < high_wl || wl > low_wl) return scaled;
    const F smooth = (one / wl * static_cast<F>(old_ctx) - static_cast<F>(s.low_freq_factor)) /
                     static_cast<F>(s.high_freq_factor - s.low_freq_factor);
    return (one - smooth) * scaled / factor + smooth * scaled;
}

// The base of the frequencies: theta, or Dynamic's theta' for sequence length L (in F arithmetic:
// transformers evaluates it on fp32 tensors).
template <class F>
F rope_base(const RopeParams& p, int64_t L) {
    const RopeScaling& s = p.scaling;
    if (s.type != RopeType::Dynamic || L <= s.original_max) return static_cast<F>(p.theta);
    const F f = static_cast<F>(s.factor), ratio = f * static_cast<F>(L) / static_cast<F>(s.original_max);
    const F expo = static_cast<F>(static_cast<double>(p.rotary_dim) / (p.rotary_dim - 2));
    return static_cast<F>(p.theta) * std::pow(ratio - static_cast<F>(s.factor - 1), expo);
}

// The inverse frequencies in F arithmetic. For F = float the operations follow transformers' order on fp32
// tensors (its Python scalars, double, are rounded where they meet a tensor; scalar / tensor is the
// reciprocal times the scalar), so the engine's tables match transformers' to the last bits; for F = double
// the formulas are exact.
template <class F>
std::vector<F> inv_freqs(const RopeParams& p, int64_t seq_len) {
    const RopeScaling& s = p.scaling;
    const int d = p.rotary_dim, half = d / 2;
    const F base = rope_base<F>(p, seq_len), one = 1;
    const auto [lo, hi] = s.type == RopeType::Yarn ? yarn_range(s, p.theta, d) : std::pair<double, double>{};
    const std::vector<double>& ext = seq_len > s.original_max ? s.long_factor : s.short_factor;
    std::vector<F> inv(half);
    for (int i = 0; i < half; ++i) {
        const F pw = std::pow(base, static_cast<F>(2 * i) / static_cast<F>(d));
        inv[i] = one / pw;
        if constexpr (std::is_same_v<F, double>)  // the fp64 reference as it always was
            if (s.type == RopeType::Default) inv[i] = std::pow(p.theta, -2.0 * i / d);
        switch (s.type) {
            case RopeType::Default:
            case RopeType::Dynamic:
                break;
            case RopeType::Linear:
                inv[i] /= static_cast<F>(s.factor);
                break;
            case RopeType::LongRope:
                inv[i] = one / (static_cast<F>(ext[i]) * pw);
                break;
            case RopeType::Yarn: {
                const F ramp =
                    std::clamp((static_cast<F>(i) - static_cast<F>(lo)) / static_cast<F>(hi - lo), F(0), one);
                const F keep = one - ramp;  // the weight of the unscaled frequency
                const F interp = one / (static_cast<F>(s.factor) * pw);
                inv[i] = interp * (one - keep) + inv[i] * keep;
                break;
            }
            case RopeType::Llama3:
                inv[i] = llama3_freq(s, inv[i]);
                break;
        }
    }
    return inv;
}

int64_t table_seq_len(const RopeParams& p, const int32_t* positions, int64_t T) {
    if (p.seq_len > 0 || T == 0) return p.seq_len;
    const int32_t mx = *std::max_element(positions, positions + 3 * T);
    return static_cast<int64_t>(mx) + 1;
}

}  // namespace

const char* rope_type_name(RopeType t) {
    for (const auto& r : kRopeTypes)
        if (r.type == t) return r.name;
    return "?";
}

bool parse_rope_type(const char* name, RopeType& out) {
    for (const auto& r : kRopeTypes)
        if (std::strcmp(r.name, name) == 0) {
            out = r.type;
            return true;
        }
    return false;
}

double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

int rope_axis(const RopeParams& p, int i) {
    check_params(p);
    return axis_unchecked(p, i);
}

std::vector<double> rope_inv_freq(const RopeParams& p, int64_t seq_len) {
    check_params(p);
    return inv_freqs<double>(p, seq_len);
}

void rope_tables(const RopeParams& p, const int32_t* positions, int64_t T, float* cos, float* sin) {
    check_params(p);
    const int half = p.rotary_dim / 2;
    const int64_t L = table_seq_len(p, positions, T);
    std::vector<int> axis(half);
    for (int i = 0; i < half; ++i) axis[i] = axis_unchecked(p, i);
    const std::vector<float> inv_f = p.fp64_angles ? std::vector<float>() : inv_freqs<float>(p, L);
    const std::vector<double> inv_d = p.fp64_angles ? inv_freqs<double>(p, L) : std::vector<double>();
    const double att_d = p.scaling.attention_factor;
    const float att_f = static_cast<float>(att_d);  // transformers: cos(fp32) * attention_scaling, in fp32
    for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
            const int32_t pos = positions[axis[i] * T + t];
            if (p.fp64_angles) {
                const double ang = static_cast<double>(pos) * inv_d[i];
                cos[t * half + i] = static_cast<float>(std::cos(ang) * att_d);
                sin[t * half + i] = static_cast<float>(std::sin(ang) * att_d);
            } else {
                const float ang = static_cast<float>(pos) * inv_f[i];
                cos[t * half + i] = std::cos(ang) * att_f;
                sin[t * half + i] = std::sin(ang) * att_f;
            }
        }
}

void rope_apply(float* x, int64_t T, int heads, int head_dim, int64_t stride, int rotary_dim,
                const float* cos, const float* sin) {
    const int half = rotary_dim / 2;
    for (int64_t t = 0; t < T; ++t) {
        const float* c = cos + t * half;
        const float* s = sin + t * half;
        for (int h = 0; h < heads; ++h) {
            float* xh = x + t * stride + static_cast<int64_t>(h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c[i] - b * s[i];
                xh[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

}  // namespace clef::ops
