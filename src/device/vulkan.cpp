#include "device/vulkan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "device/vk_context.h"  // volk, vk::create_instance
#include "util/error.h"

namespace clef::dev {

namespace {

// volk opens the loader once per process; its answer is kept.
VkResult init_loader() {
    static std::once_flag once;
    static VkResult r = VK_ERROR_INITIALIZATION_FAILED;
    std::call_once(once, [] { r = volkInitialize(); });
    return r;
}

std::string type_name(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return "discrete";
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return "integrated";
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return "virtual";
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return "cpu";
        default:
            return "other";
    }
}

std::string version_text(uint32_t v) {
    return fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
}

bool has_extension(VkPhysicalDevice pd, const char* name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
    std::vector<VkExtensionProperties> ext(n);
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, ext.data());
    return std::any_of(ext.begin(), ext.end(), [&](const VkExtensionProperties& e) {
        return std::strcmp(e.extensionName, name) == 0;
    });
}

// Whether the device has VK_NV_cooperative_matrix with 16 x 16 x 16 fp16 x fp16 -> fp32 subgroup matrices.
bool nv_f16_shape(VkPhysicalDevice pd) {
    if (!has_extension(pd, "VK_NV_cooperative_matrix") || !vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
        return false;
    uint32_t n = 0;
    vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, nullptr);
    std::vector<VkCooperativeMatrixPropertiesNV> props(n);
    for (auto& p : props) p.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, props.data());
    return std::any_of(props.begin(), props.end(), [](const VkCooperativeMatrixPropertiesNV& p) {
        return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 && p.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
               p.BType == VK_COMPONENT_TYPE_FLOAT16_NV && p.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
               p.DType == VK_COMPONENT_TYPE_FLOAT32_NV && p.scope == VK_SCOPE_SUBGROUP_NV;
    });
}

// Properties, limits, memory heaps and the features the kernels choose by (Vulkan 1.1+ query chains).
VulkanDeviceInfo describe(VkPhysicalDevice pd, int index) {
    VulkanDeviceInfo d;
    d.index = index;
    VkPhysicalDeviceDriverProperties driver{};
    driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
    VkPhysicalDeviceSubgroupProperties subgroup{};
    subgroup.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    subgroup.pNext = &driver;
    VkPhysicalDeviceProperties2 props{};
    props.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    props.pNext = &subgroup;
    vkGetPhysicalDeviceProperties2(pd, &props);
    const VkPhysicalDeviceProperties& p = props.properties;
    d.name = p.deviceName;
    d.type = type_name(p.deviceType);
    d.api_version = version_text(p.apiVersion);
    d.driver = fmt::format("{} {}", driver.driverName, driver.driverInfo);
    d.subgroup_size = subgroup.subgroupSize;
    d.shared_memory = p.limits.maxComputeSharedMemorySize;
    d.max_storage_range = p.limits.maxStorageBufferRange;

    VkPhysicalDeviceMemoryProperties mem{};
    vkGetPhysicalDeviceMemoryProperties(pd, &mem);
    for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
        d.heaps.push_back(
            {mem.memoryHeaps[i].size, (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});

    VkPhysicalDeviceVulkan13Features f13{};
    f13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
    VkPhysicalDeviceVulkan12Features f12{};
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    VkPhysicalDeviceVulkan11Features f11{};
    f11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
    VkPhysicalDeviceFeatures2 feats{};
    feats.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    const uint32_t api = std::min(p.apiVersion, volkGetInstanceVersion());
    // Chain only the structures the device's version knows.
    if (api >= VK_API_VERSION_1_2) {
        feats.pNext = &f11;
        f11.pNext = &f12;
        if (api >= VK_API_VERSION_1_3) f12.pNext = &f13;
    }
    vkGetPhysicalDeviceFeatures2(pd, &feats);
    d.fp16 = f12.shaderFloat16;
    d.int8 = f12.shaderInt8;
    d.storage16 = f11.storageBuffer16BitAccess;
    d.int_dot = f13.shaderIntegerDotProduct;
    d.coop_matrix =
        has_extension(pd, "VK_NV_cooperative_matrix") || has_extension(pd, "VK_KHR_cooperative_matrix");
    d.coop_matrix_nv = f12.vulkanMemoryModel && d.fp16 && nv_f16_shape(pd);
    return d;
}

}  // namespace

uint64_t VulkanDeviceInfo::device_local_bytes() const {
    uint64_t n = 0;
    for (const VulkanHeap& h : heaps) n += h.device_local ? h.bytes : 0;
    return n;
}

namespace vk {

VkResult create_instance(bool validation, VkInstance& inst) {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "clef";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    // Synchronization validation too: every hazard between kernels and copies the barriers miss is an error.
    const VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    VkValidationFeaturesEXT features{};
    features.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT;
    features.enabledValidationFeatureCount = 1, features.pEnabledValidationFeatures = &sync;
    if (validation) {
        ci.pNext = &features;
        ci.enabledLayerCount = 1, ci.ppEnabledLayerNames = &layer;
        ci.enabledExtensionCount = 1, ci.ppEnabledExtensionNames = &ext;
    }
    return vkCreateInstance(&ci, nullptr, &inst);
}

}  // namespace vk

VulkanProbe probe_vulkan() {
    VulkanProbe out;
    if (init_loader() != VK_SUCCESS) {
        out.error = "no Vulkan loader (libvulkan.so.1) on this machine";
        return out;
    }
    VkInstance inst = VK_NULL_HANDLE;
    if (volkGetInstanceVersion() < VK_API_VERSION_1_2) {
        out.error = "the Vulkan loader is older than 1.2";
        return out;
    }
    if (const VkResult r = vk::create_instance(false, inst); r != VK_SUCCESS) {
        out.error =
            fmt::format("the Vulkan loader could not create an instance (VkResult {})", static_cast<int>(r));
        return out;
    }
    volkLoadInstanceOnly(inst);
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(inst, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    vkEnumeratePhysicalDevices(inst, &n, pds.data());
    for (uint32_t i = 0; i < n; ++i) out.devices.push_back(describe(pds[i], static_cast<int>(i)));
    vkDestroyInstance(inst, nullptr);
    return out;
}

namespace {

// Preference among Vulkan devices: discrete, integrated, virtual, other, CPU-type.
int rank(const VulkanDeviceInfo& d) {
    static const char* const kOrder[] = {"discrete", "integrated", "virtual", "other", "cpu"};
    for (int i = 0; i < 5; ++i)
        if (d.type == kOrder[i]) return i;
    return 5;
}

const VulkanDeviceInfo* best(const VulkanProbe& probe, bool gpu_only) {
    const VulkanDeviceInfo* b = nullptr;
    for (const VulkanDeviceInfo& d : probe.devices)
        if ((!gpu_only || d.gpu()) && (!b || rank(d) < rank(*b))) b = &d;
    return b;
}

std::string none_reason(const VulkanProbe& probe, bool gpu_only) {
    if (!probe.error.empty()) return probe.error;
    if (probe.devices.empty()) return "no Vulkan device";
    std::string names;
    for (const VulkanDeviceInfo& d : probe.devices)
        names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", d.name, d.type);
    return gpu_only ? "no GPU among the Vulkan devices: " + names : "no Vulkan device";
}

}  // namespace

DeviceSpec parse_device_spec(const std::string& spec) {
    using Kind = DeviceSpec::Kind;
    if (spec == "auto") return {Kind::Auto, -1};
    if (spec == "cpu") return {Kind::Cpu, -1};
    if (spec == "vulkan") return {Kind::Vulkan, -1};
    const std::string prefix = "vulkan:";
    if (spec.rfind(prefix, 0) == 0 && spec.size() > prefix.size() && spec.size() <= prefix.size() + 3 &&
        std::all_of(spec.begin() + static_cast<std::ptrdiff_t>(prefix.size()), spec.end(),
                    [](char ch) { return ch >= '0' && ch <= '9'; }))
        return {Kind::Vulkan, std::stoi(spec.substr(prefix.size()))};
    throw Error("--device '" + spec + "': expected auto, cpu, vulkan or vulkan:N");
}

DeviceChoice choose_device(const std::string& spec, const VulkanProbe& probe) {
    const DeviceSpec s = parse_device_spec(spec);
    DeviceChoice c;
    if (s.kind == DeviceSpec::Kind::Cpu) return c;
    if (s.index < 0) {
        const bool gpu_only = s.kind == DeviceSpec::Kind::Auto;
        if (const VulkanDeviceInfo* d = best(probe, gpu_only)) {
            c.vulkan = true;
            c.index = d->index;
        } else {
            c.reason = none_reason(probe, gpu_only);
        }
        return c;
    }
    if (s.index >= static_cast<int>(probe.devices.size()))
        throw Error(fmt::format("--device {}: {}", spec,
                                probe.devices.empty() ? none_reason(probe, false)
                                                      : fmt::format("this machine has Vulkan devices 0 to {}",
                                                                    probe.devices.size() - 1)));
    c.vulkan = true;
    c.index = s.index;
    return c;
}

}  // namespace clef::dev
