#include "device/vk_context.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "device/device.h"
#include "device/vk_shaders.h"
#include "util/error.h"

namespace clef::dev::vk {

namespace {

std::atomic<int> g_validation_errors{0};

void check(VkResult r, const char* what) {
    if (r == VK_SUCCESS) return;
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        throw DeviceError(DeviceError::Kind::OutOfMemory,
                          fmt::format("vulkan: out of {} memory ({})",
                                      r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host", what));
    if (r == VK_ERROR_DEVICE_LOST)
        throw DeviceError(DeviceError::Kind::Lost, fmt::format("vulkan: the device was lost ({})", what));
    throw Error(fmt::format("vulkan: {} failed (VkResult {})", what, static_cast<int>(r)));
}

// Faults a test asks for (device/vulkan.h inject_vulkan_fault): counts of calls before the fault, -1 = none.
std::atomic<int> g_oom_after{-1}, g_lost_after{-1};
std::mutex g_fault_mu;
std::string g_failing_kernel;  // under g_fault_mu

// Whether the fault counted by `after` is due now (counting this call).
bool fault_due(std::atomic<int>& after) {
    int n = after.load();
    while (n >= 0)
        if (after.compare_exchange_weak(n, n - 1)) return n == 0;
    return false;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* d, void*) {
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        ++g_validation_errors;
        std::fprintf(stderr, "clef: vulkan validation error: %s\n", d->pMessage);
    } else if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        std::fprintf(stderr, "clef: vulkan validation warning: %s\n", d->pMessage);
    }
    return VK_FALSE;
}

bool validation_asked() {
    const char* v = std::getenv("CLEF_VULKAN_VALIDATION");
    return v && std::strcmp(v, "1") == 0;
}

}  // namespace

uint32_t writable_bindings(const uint32_t* words, size_t count) {
    constexpr uint32_t kTypePointer = 32, kVariable = 59, kDecorate = 71, kMemberDecorate = 72;
    constexpr uint32_t kNonWritable = 24, kBinding = 33;
    std::map<uint32_t, uint32_t> binding, pointee,
        var_type;                                     // id -> binding; pointer -> type; var -> pointer
    std::set<uint32_t> readonly;                      // variables or block types
    std::map<uint32_t, std::pair<int, int>> members;  // block type -> (members, read-only members)
    for (size_t i = 5; i < count;) {
        const uint32_t op = words[i] & 0xffff, n = words[i] >> 16;
        if (n == 0 || i + n > count) break;
        const uint32_t* a = words + i + 1;
        if (op == kDecorate && n >= 3 && a[1] == kBinding && n >= 4) binding[a[0]] = a[2];
        if (op == kDecorate && n >= 3 && a[1] == kNonWritable) readonly.insert(a[0]);
        if (op == kMemberDecorate && n >= 4) {
            auto& m = members[a[0]];
            m.first = std::max<int>(m.first, static_cast<int>(a[1]) + 1);
            if (a[2] == kNonWritable) ++m.second;
        }
        if (op == kTypePointer && n >= 4) pointee[a[0]] = a[2];
        if (op == kVariable && n >= 4) var_type[a[1]] = a[0];
        i += n;
    }
    uint32_t mask = 0;
    for (const auto& [var, b] : binding) {
        const auto t = var_type.find(var);
        const uint32_t block = t != var_type.end() && pointee.count(t->second) ? pointee[t->second] : 0;
        const auto m = members.find(block);
        const bool ro = readonly.count(var) || (m != members.end() && m->second.second >= m->second.first);
        if (!ro && b < 32) mask |= 1u << b;
    }
    return mask;
}

Alloc::~Alloc() {
    if (!ctx) return;
    if (mapped) vkUnmapMemory(ctx->device(), mem);
    if (buf) vkDestroyBuffer(ctx->device(), buf, nullptr);
    if (mem) vkFreeMemory(ctx->device(), mem, nullptr);
    if (counted) ctx->release_bytes(bytes);
}

int Context::validation_errors() {
    return g_validation_errors.load();
}

Context::Context(int index) {
    const VulkanProbe probe = probe_vulkan();  // opens the loader
    if (!probe.error.empty()) throw Error("vulkan: " + probe.error);
    if (index < 0 || index >= static_cast<int>(probe.devices.size()))
        throw Error(fmt::format("vulkan: no device {}", index));
    info_ = probe.devices[index];
    try {
        create_instance();
        create_device(index);
    } catch (...) {
        release();
        throw;
    }
}

void Context::create_instance() {
    const bool validate = validation_asked();
    check(vk::create_instance(validate, inst_), validate ? "instance with the validation layer" : "instance");
    volkLoadInstance(inst_);
    if (validate) {
        VkDebugUtilsMessengerCreateInfoEXT m{};
        m.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
        m.messageSeverity =
            VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
        m.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                        VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                        VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        m.pfnUserCallback = on_message;
        check(vkCreateDebugUtilsMessengerEXT(inst_, &m, nullptr, &messenger_), "debug messenger");
    }
}

void Context::create_device(int index) {
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(inst_, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    vkEnumeratePhysicalDevices(inst_, &n, pds.data());
    if (index >= static_cast<int>(n)) throw Error(fmt::format("vulkan: no device {}", index));
    pd_ = pds[index];
    vkGetPhysicalDeviceMemoryProperties(pd_, &mem_);

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(pd_, &nq, qf.data());
    queue_family_ = nq;
    for (uint32_t i = 0; i < nq && queue_family_ == nq; ++i)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) queue_family_ = i;
    if (queue_family_ == nq) throw Error("vulkan: " + info_.name + " has no compute queue");
    VkPhysicalDeviceProperties props{};
    vkGetPhysicalDeviceProperties(pd_, &props);
    if (qf[queue_family_].timestampValidBits > 0) timestamp_ns_ = props.limits.timestampPeriod;

    const float prio = 1.f;
    VkDeviceQueueCreateInfo q{};
    q.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    q.queueFamilyIndex = queue_family_, q.queueCount = 1, q.pQueuePriorities = &prio;
    // The features the kernels use where the device has them (device/vulkan.h VulkanDeviceInfo): fp16
    // arithmetic (the tensor-core GEMM's tiles, linear_cm.comp) and, for its NV variant, the cooperative
    // matrices and the Vulkan memory model.
    std::vector<const char*> ext = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{};
    coop.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    VkPhysicalDeviceVulkan12Features f12{};
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    f12.shaderFloat16 = info_.fp16;
    if (info_.coop_matrix_nv) {
        ext.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
        coop.cooperativeMatrix = VK_TRUE;
        f12.vulkanMemoryModel = VK_TRUE;
        f12.pNext = &coop;
    }
    VkDeviceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    ci.pNext = &f12;
    ci.queueCreateInfoCount = 1, ci.pQueueCreateInfos = &q;
    ci.enabledExtensionCount = static_cast<uint32_t>(ext.size()), ci.ppEnabledExtensionNames = ext.data();
    check(vkCreateDevice(pd_, &ci, nullptr, &dev_), "device (push descriptors)");
    // No volkLoadDevice: it points volk's global entry points straight at this device's driver, and a second
    // Context (another device, or the same one opened again) would then call into the first one's, freed
    // once that one is gone. volkLoadInstance's entry points go through the loader, which dispatches on the
    // handle.
    vkGetDeviceQueue(dev_, queue_family_, 0, &queue_);
    VkCommandPoolCreateInfo pc{};
    pc.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pc.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pc.queueFamilyIndex = queue_family_;
    check(vkCreateCommandPool(dev_, &pc, nullptr, &pool_), "command pool");
}

Context::~Context() {
    release();
}

void Context::release() {
    if (dev_) {
        vkDeviceWaitIdle(dev_);
        for (auto& [name, p] : pipelines_) {
            vkDestroyPipeline(dev_, p.pipeline, nullptr);
            vkDestroyPipelineLayout(dev_, p.layout, nullptr);
            vkDestroyDescriptorSetLayout(dev_, p.set_layout, nullptr);
        }
        pipelines_.clear();
        if (pool_) vkDestroyCommandPool(dev_, pool_, nullptr);
        vkDestroyDevice(dev_, nullptr);
        dev_ = VK_NULL_HANDLE;
    }
    if (messenger_) vkDestroyDebugUtilsMessengerEXT(inst_, messenger_, nullptr);
    messenger_ = VK_NULL_HANDLE;
    if (inst_) vkDestroyInstance(inst_, nullptr);
    inst_ = VK_NULL_HANDLE;
}

uint32_t Context::memory_type(uint32_t bits, Memory where) const {
    constexpr VkMemoryPropertyFlags kVisible =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    // In order of preference: readback staging wants host-cached memory, else any coherent host-visible type.
    std::vector<VkMemoryPropertyFlags> wants;
    if (where == Memory::Device)
        wants = {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};  // 0: any type the buffer allows
    if (where == Memory::Readback) wants.push_back(kVisible | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (where != Memory::Device) wants.push_back(kVisible);
    for (VkMemoryPropertyFlags want : wants)
        for (uint32_t i = 0; i < mem_.memoryTypeCount; ++i)
            if ((bits & (1u << i)) && (mem_.memoryTypes[i].propertyFlags & want) == want) return i;
    throw Error(fmt::format("vulkan: {} has no {} memory for buffers", info_.name,
                            where == Memory::Device ? "device" : "host-visible"));
}

std::shared_ptr<Alloc> Context::alloc(uint64_t bytes, Memory where) {
    const bool host_visible = where != Memory::Device;
    auto a = std::make_shared<Alloc>();
    a->ctx = this;
    // Whole 32-bit words: the kernels read buffers as arrays of uint or float, whose length is the buffer's
    // size in whole words (a buffer of 2278 bytes, 67 rows of one Q8_0 block, would lose its last 2 bytes).
    a->bytes = (std::max<uint64_t>(bytes, 16) + 3) & ~uint64_t{3};
    if (!host_visible && fault_due(g_oom_after))
        throw DeviceError(DeviceError::Kind::OutOfMemory,
                          fmt::format("vulkan: out of device memory ({} bytes; injected)", a->bytes));
    if (a->bytes > max_range())
        throw Error(fmt::format("vulkan: a buffer of {} bytes is over {}'s storage buffer range of {} bytes",
                                a->bytes, info_.name, info_.max_storage_range));
    VkBufferCreateInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = a->bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev_, &bi, nullptr, &a->buf), "buffer");
    VkMemoryRequirements req{};
    vkGetBufferMemoryRequirements(dev_, a->buf, &req);
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = memory_type(req.memoryTypeBits, where);
    check(vkAllocateMemory(dev_, &ai, nullptr, &a->mem), fmt::format("{} bytes", req.size).c_str());
    check(vkBindBufferMemory(dev_, a->buf, a->mem, 0), "binding buffer memory");
    if (host_visible) check(vkMapMemory(dev_, a->mem, 0, VK_WHOLE_SIZE, 0, &a->mapped), "mapping memory");
    if (!host_visible) {
        a->counted = true;
        allocated_ += a->bytes;
    }
    return a;
}

const Pipeline& Context::pipeline(const std::string& name, uint32_t bindings,
                                  const std::vector<uint32_t>& constants) {
    std::string key = name;
    for (uint32_t c : constants) key += fmt::format("/{}", c);
    std::lock_guard<std::mutex> lk(pipe_mu_);
    if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
    const Spirv* code = find_spirv(name);
    if (!code) throw Error("vulkan: no kernel named " + name);
    {
        std::lock_guard<std::mutex> f(g_fault_mu);
        if (name == g_failing_kernel)
            throw DeviceError(DeviceError::Kind::Kernel,
                              "vulkan: the driver did not build kernel " + name + " (injected)");
    }
    Pipeline p;
    p.bindings = bindings;
    p.writable = writable_bindings(code->words, code->count);
    std::vector<VkDescriptorSetLayoutBinding> b(bindings);
    for (uint32_t i = 0; i < bindings; ++i) {
        b[i].binding = i;
        b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        b[i].descriptorCount = 1;
        b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dl{};
    dl.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    dl.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
    dl.bindingCount = bindings, dl.pBindings = b.data();
    check(vkCreateDescriptorSetLayout(dev_, &dl, nullptr, &p.set_layout), "descriptor set layout");
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
    VkPipelineLayoutCreateInfo pl{};
    pl.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pl.setLayoutCount = 1, pl.pSetLayouts = &p.set_layout;
    pl.pushConstantRangeCount = 1, pl.pPushConstantRanges = &range;
    check(vkCreatePipelineLayout(dev_, &pl, nullptr, &p.layout), "pipeline layout");
    VkShaderModuleCreateInfo sm{};
    sm.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    sm.codeSize = code->count * 4, sm.pCode = code->words;
    VkShaderModule module = VK_NULL_HANDLE;
    check(vkCreateShaderModule(dev_, &sm, nullptr, &module), ("shader module " + name).c_str());
    VkComputePipelineCreateInfo cp{};
    cp.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    cp.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cp.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cp.stage.module = module;
    cp.stage.pName = "main";
    std::vector<VkSpecializationMapEntry> entries(constants.size());
    for (uint32_t i = 0; i < constants.size(); ++i) entries[i] = {i, i * 4, 4};
    const VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(),
                                    constants.size() * 4, constants.data()};
    if (!constants.empty()) cp.stage.pSpecializationInfo = &spec;
    cp.layout = p.layout;
    const VkResult r = vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &cp, nullptr, &p.pipeline);
    vkDestroyShaderModule(dev_, module, nullptr);
    if (r != VK_SUCCESS) {
        vkDestroyPipelineLayout(dev_, p.layout, nullptr);
        vkDestroyDescriptorSetLayout(dev_, p.set_layout, nullptr);
        throw DeviceError(DeviceError::Kind::Kernel, fmt::format("vulkan: the driver did not build kernel {} "
                                                                 "(VkResult {})",
                                                                 name, static_cast<int>(r)));
    }
    return pipelines_.emplace(key, p).first->second;
}

VkCommandBuffer Context::new_command_buffer() {
    std::lock_guard<std::mutex> lk(pool_mu_);
    VkCommandBufferAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = pool_, ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, ai.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    check(vkAllocateCommandBuffers(dev_, &ai, &cb), "command buffer");
    return cb;
}

void Context::free_command_buffer(VkCommandBuffer cb) {
    std::lock_guard<std::mutex> lk(pool_mu_);
    vkFreeCommandBuffers(dev_, pool_, 1, &cb);
}

VkFence Context::new_fence() {
    VkFenceCreateInfo fi{};
    fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    VkFence f = VK_NULL_HANDLE;
    check(vkCreateFence(dev_, &fi, nullptr, &f), "fence");
    return f;
}

void Context::submit_and_wait(VkCommandBuffer cb, VkFence fence) {
    if (fault_due(g_lost_after)) lost_ = true;
    if (lost_) throw DeviceError(DeviceError::Kind::Lost, "vulkan: the device was lost (injected)");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1, si.pCommandBuffers = &cb;
    {
        std::lock_guard<std::mutex> lk(queue_mu_);
        check(vkQueueSubmit(queue_, 1, &si, fence), "queue submit");
    }
    ++syncs_;
    check(vkWaitForFences(dev_, 1, &fence, VK_TRUE, UINT64_MAX), "waiting for the device");
    check(vkResetFences(dev_, 1, &fence), "fence reset");
}

void Context::write(const Alloc& dst, uint64_t dst_off, const void* src, uint64_t bytes) {
    if (bytes == 0) return;
    const std::shared_ptr<Alloc> stage = alloc(bytes, Memory::Upload);
    std::memcpy(stage->mapped, src, bytes);
    count_copy(bytes, true);
    VkCommandBuffer cb = new_command_buffer();
    VkFence fence = new_fence();
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb, &bi);
    const VkBufferCopy region{0, dst_off, bytes};
    vkCmdCopyBuffer(cb, stage->buf, dst.buf, 1, &region);
    vkEndCommandBuffer(cb);
    try {
        submit_and_wait(cb, fence);
    } catch (...) {
        vkDestroyFence(dev_, fence, nullptr);
        free_command_buffer(cb);
        throw;
    }
    vkDestroyFence(dev_, fence, nullptr);
    free_command_buffer(cb);
}

}  // namespace clef::dev::vk

namespace clef::dev {

void inject_vulkan_fault(VulkanFault f, int n, const std::string& kernel) {
    switch (f) {
        case VulkanFault::OutOfMemory:
            vk::g_oom_after = n;
            break;
        case VulkanFault::Lost:
            vk::g_lost_after = n;
            break;
        case VulkanFault::Kernel: {
            std::lock_guard<std::mutex> lk(vk::g_fault_mu);
            vk::g_failing_kernel = kernel;
            break;
        }
    }
}

}  // namespace clef::dev
