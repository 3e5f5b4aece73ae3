// clef devices [--json]
// Lists the Vulkan devices of this machine with what the kernels choose by (type, memory heaps, fp16 / int8 /
// integer dot product / cooperative matrix support, subgroup size, shared memory, max storage buffer range)
// and what `--device auto` picks (docs/GPU.md).
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "device/vulkan.h"

namespace clef {

namespace {

std::string gib(uint64_t bytes) {
    return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string yes_no(bool b) {
    return b ? "yes" : "no";
}

std::string choice_text(const dev::DeviceChoice& c) {
    return c.vulkan ? fmt::format("vulkan:{}", c.index) : "the CPU (" + c.reason + ")";
}

void print_text(const dev::VulkanProbe& probe) {
    if (!probe.error.empty()) fmt::print("Vulkan: {}\n", probe.error);
    for (const dev::VulkanDeviceInfo& d : probe.devices) {
        fmt::print("vulkan:{}  {} ({}, Vulkan {}, {})\n", d.index, d.name, d.type, d.api_version, d.driver);
        for (size_t h = 0; h < d.heaps.size(); ++h)
            fmt::print("  memory heap {}: {}{}\n", h, gib(d.heaps[h].bytes),
                       d.heaps[h].device_local ? " device-local" : "");
        fmt::print("  fp16 {}, int8 {}, 16-bit storage {}, integer dot product {}, cooperative matrix {}\n",
                   yes_no(d.fp16), yes_no(d.int8), yes_no(d.storage16), yes_no(d.int_dot),
                   yes_no(d.coop_matrix));
        fmt::print("  --precision fp16 on tensor cores (VK_NV_cooperative_matrix): {}\n",
                   yes_no(d.coop_matrix_nv));
        fmt::print("  subgroup size {}, shared memory {} KiB, max storage buffer {} MiB\n", d.subgroup_size,
                   d.shared_memory / 1024, d.max_storage_range >> 20);
    }
    if (probe.error.empty() && probe.devices.empty()) fmt::print("Vulkan: no device\n");
    fmt::print("--device auto: {}\n", choice_text(dev::choose_device("auto", probe)));
}

nlohmann::json to_json(const dev::VulkanProbe& probe) {
    nlohmann::json devices = nlohmann::json::array();
    for (const dev::VulkanDeviceInfo& d : probe.devices) {
        nlohmann::json heaps = nlohmann::json::array();
        for (const dev::VulkanHeap& h : d.heaps)
            heaps.push_back({{"bytes", h.bytes}, {"device_local", h.device_local}});
        devices.push_back({{"device", fmt::format("vulkan:{}", d.index)},
                           {"name", d.name},
                           {"type", d.type},
                           {"api_version", d.api_version},
                           {"driver", d.driver},
                           {"memory_heaps", heaps},
                           {"fp16", d.fp16},
                           {"int8", d.int8},
                           {"storage_16bit", d.storage16},
                           {"integer_dot_product", d.int_dot},
                           {"cooperative_matrix", d.coop_matrix},
                           {"tensor_core_gemm", d.coop_matrix_nv},
                           {"subgroup_size", d.subgroup_size},
                           {"shared_memory_bytes", d.shared_memory},
                           {"max_storage_buffer_bytes", d.max_storage_range}});
    }
    const dev::DeviceChoice c = dev::choose_device("auto", probe);
    nlohmann::json j = {
        {"vulkan_devices", devices},
        {"auto", c.vulkan ? nlohmann::json(fmt::format("vulkan:{}", c.index)) : nlohmann::json("cpu")}};
    if (!c.reason.empty()) j["auto_reason"] = c.reason;
    if (!probe.error.empty()) j["vulkan_error"] = probe.error;
    return j;
}

}  // namespace

void add_devices_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("devices", "List the Vulkan devices and what --device auto picks");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "One JSON object instead of text");
    cmd->callback([json] {
        const dev::VulkanProbe probe = dev::probe_vulkan();
        if (*json)
            fmt::print("{}\n", to_json(probe).dump());
        else
            print_text(probe);
    });
}

}  // namespace clef
