// A deterministic synthetic picture for benchmarks (clef bench --image, bench/bench_vision): no file to ship,
// the same pixels on every machine.
#pragma once

#include <cstdint>

#include "image/image.h"

namespace clef {

// width x height RGB: red a horizontal gradient, green a vertical one, blue noise from a 64-bit LCG seeded
// with `seed`, so that the resize and the tower see neither a flat nor a periodic image. Throws clef::Error
// unless both sides are in [1, 65536].
RgbImage synthetic_image(int width, int height, uint64_t seed = 20261008);

}  // namespace clef
