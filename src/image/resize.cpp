#include "image/resize.h"

#include <algorithm>
#include <cmath>

namespace clef {

namespace {

// Keys' cubic convolution with a = -0.5 (PyTorch aa_filter for bicubic, Pillow's bicubic_filter).
double cubic_filter(double x) {
    const double a = -0.5;
    x = std::abs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

inline uint8_t clamp_shift(int32_t acc, int p) {
    const int32_t v = acc >> p;  // arithmetic shift, as _mm_srai_epi32
    return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

ResizeAxisWeights bicubic_aa_weights(int in_size, int out_size) {
    ResizeAxisWeights a;
    a.in_size = in_size;
    a.out_size = out_size;
    const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
    const double support = scale >= 1.0 ? 2.0 * scale : 2.0;  // (interp_size 4 / 2) * max(scale, 1)
    // PyTorch: interp_size = (int)ceilf(support) * 2 + 1 (ceilf on the value converted to float).
    a.taps = static_cast<int>(std::ceil(static_cast<float>(support))) * 2 + 1;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    std::vector<double> w(static_cast<size_t>(out_size) * a.taps, 0.0);
    a.start.resize(out_size);
    a.count.resize(out_size);
    double wt_max = 0.0;
    for (int i = 0; i < out_size; ++i) {
        const double center = scale * (i + 0.5);
        const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
        int64_t xsize =
            std::min(static_cast<int64_t>(center + support + 0.5), static_cast<int64_t>(in_size)) - xmin;
        xsize = std::clamp(xsize, int64_t{0}, static_cast<int64_t>(a.taps));
        double* wi = w.data() + static_cast<size_t>(i) * a.taps;
        double total = 0.0;
        for (int64_t j = 0; j < xsize; ++j) {
            const double v = cubic_filter((static_cast<double>(j + xmin) - center + 0.5) * invscale);
            wi[j] = v;
            total += v;
        }
        if (total != 0.0)
            for (int64_t j = 0; j < xsize; ++j) {
                wi[j] /= total;
                wt_max = std::max(wt_max, wi[j]);
            }
        a.start[i] = static_cast<int>(xmin);
        a.count[i] = static_cast<int>(xsize);
    }
    int p = 0;
    for (p = 0; p < 22; ++p) {
        const int next = static_cast<int>(0.5 + wt_max * static_cast<double>(1 << (p + 1)));
        if (next >= (1 << 15)) break;
    }
    a.precision = p;
    a.weights.resize(w.size());
    for (size_t k = 0; k < w.size(); ++k) {
        const double v = w[k] * static_cast<double>(1 << p);
        a.weights[k] = static_cast<int16_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    return a;
}

RgbImage resize_bicubic_aa(const RgbImage& in, int out_width, int out_height) {
    if (out_width < 1 || out_height < 1) throw ImageError("resize: the target size must be positive");
    RgbImage cur = in;
    if (out_width != in.width) {
        const ResizeAxisWeights a = bicubic_aa_weights(in.width, out_width);
        const int p = a.precision;
        const int32_t init = p > 0 ? int32_t{1} << (p - 1) : 0;
        RgbImage out(out_width, cur.height);
        for (int y = 0; y < cur.height; ++y) {
            const uint8_t* src = cur.row(y);
            uint8_t* dst = out.row(y);
            for (int x = 0; x < out_width; ++x) {
                const int16_t* k = a.weights.data() + static_cast<size_t>(x) * a.taps;
                const uint8_t* s = src + static_cast<size_t>(a.start[x]) * 3;
                int32_t r = init, g = init, b = init;
                for (int j = 0; j < a.count[x]; ++j, s += 3) {
                    r += s[0] * k[j];
                    g += s[1] * k[j];
                    b += s[2] * k[j];
                }
                dst[3 * x] = clamp_shift(r, p);
                dst[3 * x + 1] = clamp_shift(g, p);
                dst[3 * x + 2] = clamp_shift(b, p);
            }
        }
        cur = std::move(out);
    }
    if (out_height != in.height) {
        const ResizeAxisWeights a = bicubic_aa_weights(in.height, out_height);
        const int p = a.precision;
        const int32_t init = p > 0 ? int32_t{1} << (p - 1) : 0;
        const int row_len = cur.width * 3;
        RgbImage out(cur.width, out_height);
        std::vector<int32_t> acc(static_cast<size_t>(row_len));
        for (int y = 0; y < out_height; ++y) {
            const int16_t* k = a.weights.data() + static_cast<size_t>(y) * a.taps;
            std::fill(acc.begin(), acc.end(), init);
            for (int j = 0; j < a.count[y]; ++j) {
                const uint8_t* s = cur.row(a.start[y] + j);
                const int32_t wj = k[j];
                for (int c = 0; c < row_len; ++c) acc[c] += s[c] * wj;
            }
            uint8_t* dst = out.row(y);
            for (int c = 0; c < row_len; ++c) dst[c] = clamp_shift(acc[c], p);
        }
        cur = std::move(out);
    }
    return cur;
}

}  // namespace clef
