// PyTorch's uint8 antialiased bicubic resize (aten/src/ATen/native/cpu/UpSampleKernel.cpp, the kernel that
// torchvision resize(BICUBIC, antialias=True) runs on a uint8 CPU tensor), bit for bit:
//   per axis, scale = in/out, support = 2·max(scale, 1), centre = scale·(i + 0.5),
//   taps from xmin = max(int(centre − support + 0.5), 0) to xmax = min(int(centre + support + 0.5), in),
//   Keys cubic (a = −0.5) weights at (j + xmin − centre + 0.5)/max(scale, 1), normalised, in double;
//   int16 fixed-point weights with the precision p that keeps the largest weight below 2^15;
//   out = clamp((2^(p−1) + Σ x·w) >> p, 0, 255); the horizontal pass first, then the vertical pass on the
//   uint8 result; an axis whose size does not change is skipped.
// Pillow's resampler is the same algorithm with p = 22, which differs by ±1 on some pixels: the reference
// runs this one (transformers' torchvision backend).
#pragma once

#include <cstdint>
#include <vector>

#include "image/image.h"

namespace clef {

struct ResizeAxisWeights {
    int in_size = 0;
    int out_size = 0;
    int precision = 0;             // fixed-point bits p
    int taps = 0;                  // weights stored per output (row length of `weights`)
    std::vector<int> start;        // first input index per output
    std::vector<int> count;        // inputs used per output (<= taps)
    std::vector<int16_t> weights;  // [out_size][taps]
};

// The weights of one axis (in_size, out_size >= 1).
ResizeAxisWeights bicubic_aa_weights(int in_size, int out_size);

// Resizes to out_width x out_height (both >= 1). An unchanged axis is not touched.
RgbImage resize_bicubic_aa(const RgbImage& in, int out_width, int out_height);

}  // namespace clef
