// The Vulkan plumbing under the Vulkan device (device/vk_device.cpp): one logical device with one compute
// queue, device memory as buffers (Alloc), the embedded SPIR-V kernels as compute pipelines (built on first
// use, bound with push descriptors and push constants), and one-shot transfers for weights. The loader is
// opened at run time through volk (device/vulkan.cpp).
#pragma once

#define VK_NO_PROTOTYPES
#include <volk.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/vulkan.h"

namespace clef::dev::vk {

class Context;

// A Vulkan 1.2 instance for clef (device/vulkan.cpp), with the Khronos validation layer and debug messages
// when `validation`.
VkResult create_instance(bool validation, VkInstance& inst);

// Where an allocation lives: device memory, or host-visible staging mapped for the life of the buffer, for
// copies to the device (coherent, write-combined is fine) or back from it (host-cached where the device has
// such a type, so that the host's reads run at memory speed).
enum class Memory { Device, Upload, Readback };

// One VkBuffer with its own memory.
struct Alloc {
    Context* ctx = nullptr;
    bool counted = false;  // device memory, in Context::allocated()
    VkBuffer buf = VK_NULL_HANDLE;
    VkDeviceMemory mem = VK_NULL_HANDLE;
    uint64_t bytes = 0;
    void* mapped = nullptr;
    Alloc() = default;
    Alloc(const Alloc&) = delete;
    Alloc& operator=(const Alloc&) = delete;
    ~Alloc();
};

// A compute pipeline of one embedded kernel and its layouts.
struct Pipeline {
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    uint32_t bindings = 0;
    // Bit i: the kernel may write binding i (its SPIR-V does not declare the buffer read-only). What the
    // synchronization (and its validation) must assume the kernel writes, whatever one dispatch does.
    uint32_t writable = 0;
};

// The storage-buffer bindings of descriptor set 0 that a SPIR-V module does not decorate NonWritable (on the
// variable or on every member of its block), as a bit mask.
uint32_t writable_bindings(const uint32_t* words, size_t count);

class Context {
public:
    // Opens Vulkan device `index` (device/vulkan.h numbering). With the environment variable
    // CLEF_VULKAN_VALIDATION=1 the Khronos validation layer checks every call and validation_errors() counts
    // what it reports. Throws clef::Error when the device cannot be opened.
    explicit Context(int index);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    const VulkanDeviceInfo& info() const { return info_; }
    VkDevice device() const { return dev_; }
    // The largest buffer a kernel can bind, in whole 32-bit words.
    uint64_t max_range() const { return info_.max_storage_range & ~uint64_t{3}; }
    // Storage buffer of `bytes` (at least 16, rounded up to whole 32-bit words) in device memory or staging
    // memory. Throws clef::Error naming the size when the device is out of memory.
    std::shared_ptr<Alloc> alloc(uint64_t bytes, Memory where = Memory::Device);
    // The pipeline of an embedded kernel (device/vk_shaders.h: its name) with `bindings` storage buffers and
    // its specialisation constants 0, 1, ... set to `constants` (the shader's defaults where empty), built on
    // first use.
    const Pipeline& pipeline(const std::string& name, uint32_t bindings,
                             const std::vector<uint32_t>& constants = {});

    VkCommandBuffer new_command_buffer();
    void free_command_buffer(VkCommandBuffer cb);
    // Submits a recorded command buffer and waits for it (the queue is shared: one submission at a time).
    void submit_and_wait(VkCommandBuffer cb, VkFence fence);
    // The host's waits and the bytes copied each way so far (device/device.h Transfers); the streams and
    // write() count their copies.
    Transfers transfers() const { return {syncs_.load(), up_.load(), down_.load()}; }
    void count_copy(uint64_t bytes, bool to_device) { (to_device ? up_ : down_) += bytes; }
    VkFence new_fence();
    // dst[dst_off ..] = bytes of host memory, through a staging buffer, waiting for the copy.
    void write(const Alloc& dst, uint64_t dst_off, const void* src, uint64_t bytes);

    // Nanoseconds per timestamp tick of the compute queue; 0 where it has no timestamps.
    double timestamp_ns() const { return timestamp_ns_; }

    // Bytes of device memory this context holds (buffers, not staging).
    uint64_t allocated() const { return allocated_.load(); }
    void release_bytes(uint64_t n) { allocated_ -= n; }

    // Messages of severity error the validation layer reported (0 without the layer).
    static int validation_errors();

private:
    void create_instance();
    void release();  // the handles, in reverse order of creation
    void create_device(int index);
    uint32_t memory_type(uint32_t bits, Memory where) const;

    VulkanDeviceInfo info_;
    VkInstance inst_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    VkPhysicalDevice pd_ = VK_NULL_HANDLE;
    VkDevice dev_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkPhysicalDeviceMemoryProperties mem_{};
    std::mutex queue_mu_, pool_mu_, pipe_mu_;
    std::map<std::string, Pipeline> pipelines_;
    std::atomic<uint64_t> allocated_{0};
    std::atomic<int64_t> syncs_{0};
    std::atomic<uint64_t> up_{0}, down_{0};
    std::atomic<bool> lost_{false};  // an injected device loss: every later submission fails
    double timestamp_ns_ = 0;
};

}  // namespace clef::dev::vk
