// Vulkan devices: what the machine offers (probe_vulkan) and which one a `--device` spec picks
// (choose_device). The loader is opened at run time through volk (no link-time libvulkan), so a machine
// without it runs on the CPU and says why. The Vulkan compute backend behind the device seam
// (device/device.h) builds on this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace clef::dev {

struct VulkanHeap {
    uint64_t bytes = 0;
    bool device_local = false;
};

struct VulkanDeviceInfo {
    int index = 0;     // vulkan:N
    std::string name;  // VkPhysicalDeviceProperties::deviceName
    std::string type;  // "discrete", "integrated", "virtual", "cpu" or "other"
    std::string api_version, driver;
    std::vector<VulkanHeap> heaps;
    bool fp16 = false;         // shaderFloat16: fp16 arithmetic
    bool int8 = false;         // shaderInt8: int8 arithmetic
    bool storage16 = false;    // 16-bit storage buffers (fp16 / bf16 weights read as they are)
    bool int_dot = false;      // shaderIntegerDotProduct (int8 dot products)
    bool coop_matrix = false;  // VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix (tensor cores)
    // VK_NV_cooperative_matrix with the shape the tensor-core GEMM uses (16 x 16 x 16, fp16 A and B, fp32 C
    // and D, subgroup scope) and the Vulkan memory model its shaders need: the GEMM's `nv` variant runs here.
    bool coop_matrix_nv = false;
    uint32_t subgroup_size = 0;
    uint32_t shared_memory = 0;      // maxComputeSharedMemorySize, bytes
    uint64_t max_storage_range = 0;  // maxStorageBufferRange, bytes
    uint64_t device_local_bytes() const;
    bool gpu() const { return type == "discrete" || type == "integrated"; }
};

// The Vulkan devices of this machine. `error` says why there are none where the loader or an instance is
// missing ("" when the loader answered, even with no devices).
struct VulkanProbe {
    std::vector<VulkanDeviceInfo> devices;
    std::string error;
};
VulkanProbe probe_vulkan();

// A `--device` spec as written: auto, cpu, vulkan, or vulkan:N (N: up to three digits). Throws clef::Error
// ("--device 'x': expected auto, cpu, vulkan or vulkan:N") for anything else. Every command reads --device
// through it (choose_device below; clef info's memory plan).
struct DeviceSpec {
    enum class Kind { Auto, Cpu, Vulkan };
    Kind kind = Kind::Auto;
    int index = -1;  // vulkan:N; -1 for auto, cpu and vulkan
};
DeviceSpec parse_device_spec(const std::string& spec);

// What `--device auto|cpu|vulkan[:N]` picks. auto: the first discrete GPU, else the first integrated one,
// else the CPU (never a CPU-type Vulkan device such as lavapipe); vulkan: the best Vulkan device of any type
// (GPU before virtual before CPU-type), the CPU when there is none; vulkan:N: that device. `reason` says why
// the choice fell to the CPU ("" otherwise). Throws clef::Error for a malformed spec or a vulkan:N with no
// such device.
struct DeviceChoice {
    bool vulkan = false;
    int index = -1;  // the Vulkan device's index when vulkan
    std::string reason;
};
DeviceChoice choose_device(const std::string& spec, const VulkanProbe& probe);

}  // namespace clef::dev

namespace clef::dev {

class Device;

// The Vulkan device `index` (device/vulkan.h numbering) behind the device seam (device/device.h): weights in
// device memory in their file's type, every kernel a compute shader, one queue of kernels per stream that
// runs when the host needs a result. Throws clef::Error when the device cannot be opened.
std::unique_ptr<Device> open_vulkan(int index);

// The device a `--device` spec picks (choose_device), opened: `device` is nullptr for the CPU, and `reason`
// says why the CPU runs where the spec did not ask for it ("" otherwise). A Vulkan device that fails to open
// leaves the CPU with the error as the reason. Throws clef::Error for a malformed spec or a vulkan:N with no
// such device.
struct OpenedDevice {
    std::unique_ptr<Device> device;
    std::string reason;
};
OpenedDevice open_device(const std::string& spec);

// Test hook: the next Vulkan faults of this process. After `n` more device allocations the next one fails
// out of memory (once); after `n` more submissions the device that makes the next one is lost for good; a
// kernel of that name fails to build on every device. -1 / "" clears one.
enum class VulkanFault { OutOfMemory, Lost, Kernel };
void inject_vulkan_fault(VulkanFault f, int n, const std::string& kernel = "");

// Test hook: every later projection GEMM of this process on a Vulkan device runs with this tile shape
// (device/vk_device.cpp GemmShape: "large", "medium", "small", or "coopmat": the tensor-core kernel, the
// device's own where it has VK_NV_cooperative_matrix, else its plain-GLSL emulation) and K split into
// `slices` slices (0: as the plan decides); "" and 0 let the plan choose again. A shape the device cannot run
// (shared memory, subgroup size, fp16) is an error at the GEMM.
void force_vulkan_gemm(const std::string& shape, int slices = 0);

// Messages of severity error the Khronos validation layer reported in this process (it is on where the
// environment has CLEF_VULKAN_VALIDATION=1; 0 otherwise).
int vulkan_validation_errors();

}  // namespace clef::dev
