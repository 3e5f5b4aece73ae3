// The compute kernels of the Vulkan device as SPIR-V, compiled from src/device/shaders at build time by glslc
// and embedded by cmake/embed_spirv.cmake (no shader compiler at run time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace clef::dev::vk {

struct Spirv {
    const char* name;  // the shader file's stem, plus a variant suffix ("linear_q8_0", "attention_bf16")
    const uint32_t* words;
    size_t count;
};

// The embedded kernel of that name, or nullptr.
const Spirv* find_spirv(std::string_view name);

}  // namespace clef::dev::vk
