// Every kernel of the Vulkan device (device/vk_device.cpp, src/device/shaders) against the CPU device's
// scalar oracles (a reference stream of dev::cpu()), at awkward sizes: not multiples of the tiles, one row,
// long rows. Runs on lavapipe (scripts/setup installs Mesa's Vulkan drivers) under the Khronos validation
// layer (CLEF_VULKAN_VALIDATION=1, set below), which must report no error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "device/device.h"
#include "device/vulkan.h"

using namespace clef;

namespace {

// The first Vulkan device of any type (lavapipe here), opened once for the suite.
dev::Device& gpu() {
    static std::unique_ptr<dev::Device> d = [] {
        setenv("CLEF_VULKAN_VALIDATION", "1", 0);
        const dev::DeviceChoice c = dev::choose_device("vulkan", dev::probe_vulkan());
        if (!c.vulkan) throw std::runtime_error("no Vulkan device: " + c.reason);
        return dev::open_vulkan(c.index);
    }();
    return *d;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

// Host values on a device, through a stream's upload.
dev::Tensor on(dev::Stream& s, const std::vector<float>& v) {
    dev::Tensor t = s.scratch(static_cast<int64_t>(v.size()));
    s.upload(t.span(), v.data());
    return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

}  // namespace

TEST(VulkanKernels, Add) {
    for (int64_t n : {1, 255, 1000, 70001}) {
        const auto a = random_values(n, 1), b = random_values(n, 2);
        std::vector<float> want(a);
        for (int64_t i = 0; i < n; ++i) want[i] += b[i];
        auto s = gpu().stream({});
        dev::Tensor ta = on(*s, a), tb = on(*s, b);
        s->add(ta.span(), tb.span());
        EXPECT_EQ(max_abs_diff(s->read(ta.span()), want), 0.f) << n;
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}
