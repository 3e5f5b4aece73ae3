// Vulkan device discovery (device/vulkan.h) and the --device choice. The choice rules run on made-up device
// lists; the probe runs on this machine's Vulkan loader, where scripts/setup installs Mesa's lavapipe (a
// conforming Vulkan 1.3 device on the CPU: fp16, int8, 16-bit storage, integer dot product, subgroups of 8,
// 32 KiB shared memory, 128 MiB max storage buffer range; docs/GPU.md).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "device/vulkan.h"
#include "test_util.h"
#include "util/error.h"

using namespace clef;
using clef::testing::run_command;

namespace {

dev::VulkanDeviceInfo device(int index, const std::string& type) {
    dev::VulkanDeviceInfo d;
    d.index = index;
    d.name = type + " device";
    d.type = type;
    return d;
}

dev::VulkanProbe probe_of(std::initializer_list<const char*> types) {
    dev::VulkanProbe p;
    int i = 0;
    for (const char* t : types) p.devices.push_back(device(i++, t));
    return p;
}

}  // namespace

TEST(VulkanDevices, AutoTakesAGpuAndNeverACpuTypeDevice) {
    EXPECT_EQ(dev::choose_device("auto", probe_of({"cpu", "integrated", "discrete"})).index, 2);
    EXPECT_EQ(dev::choose_device("auto", probe_of({"cpu", "integrated"})).index, 1);
    const dev::DeviceChoice lavapipe_only = dev::choose_device("auto", probe_of({"cpu"}));
    EXPECT_FALSE(lavapipe_only.vulkan);
    EXPECT_NE(lavapipe_only.reason.find("no GPU among the Vulkan devices"), std::string::npos)
        << lavapipe_only.reason;
    dev::VulkanProbe none;
    none.error = "no Vulkan loader (libvulkan.so.1) on this machine";
    const dev::DeviceChoice no_loader = dev::choose_device("auto", none);
    EXPECT_FALSE(no_loader.vulkan);
    EXPECT_EQ(no_loader.reason, none.error);
}

TEST(VulkanDevices, VulkanTakesTheBestOfAnyTypeAndVulkanNTakesThatOne) {
    EXPECT_EQ(dev::choose_device("vulkan", probe_of({"cpu"})).index, 0);
    EXPECT_EQ(dev::choose_device("vulkan", probe_of({"cpu", "virtual"})).index, 1);
    EXPECT_EQ(dev::choose_device("vulkan:1", probe_of({"discrete", "cpu"})).index, 1);
    EXPECT_FALSE(dev::choose_device("cpu", probe_of({"discrete"})).vulkan);
    EXPECT_FALSE(dev::choose_device("vulkan", dev::VulkanProbe{}).vulkan);
    EXPECT_THROW(dev::choose_device("vulkan:2", probe_of({"discrete", "cpu"})), Error);
    EXPECT_THROW(dev::choose_device("vulkan:0", dev::VulkanProbe{}), Error);
    for (const char* bad : {"gpu", "vulkan:", "vulkan:x", "vulkan:-1", "vulkan:1234", "CPU", ""})
        EXPECT_THROW(dev::choose_device(bad, probe_of({"discrete"})), Error) << bad;
}

TEST(VulkanDevices, ProbeFindsLavapipeWithItsLimits) {
    const dev::VulkanProbe p = dev::probe_vulkan();
    ASSERT_TRUE(p.error.empty()) << p.error;
    const dev::VulkanDeviceInfo* lvp = nullptr;
    for (const dev::VulkanDeviceInfo& d : p.devices)
        if (d.type == "cpu" && d.name.find("llvmpipe") != std::string::npos) lvp = &d;
    ASSERT_NE(lvp, nullptr) << "no lavapipe device (scripts/setup installs mesa-vulkan-drivers)";
    EXPECT_GE(lvp->subgroup_size, 4u);
    EXPECT_GE(lvp->shared_memory, 16u * 1024);  // Vulkan's required minimum
    EXPECT_GE(lvp->max_storage_range, uint64_t{1} << 27);
    EXPECT_GT(lvp->device_local_bytes(), 0u);
    EXPECT_TRUE(lvp->fp16);
    EXPECT_TRUE(lvp->storage16);
    EXPECT_FALSE(lvp->gpu());
    EXPECT_EQ(p.devices[static_cast<size_t>(lvp->index)].name, lvp->name);
}

TEST(VulkanDevices, CliListsTheDevicesAndTheAutoChoice) {
    int status = 0;
    const std::string out = run_command(std::string(CLEF_BINARY) + " devices --json", status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    const dev::VulkanProbe p = dev::probe_vulkan();
    ASSERT_EQ(j.at("vulkan_devices").size(), p.devices.size());
    for (size_t i = 0; i < p.devices.size(); ++i) {
        const nlohmann::json& d = j.at("vulkan_devices")[i];
        EXPECT_EQ(d.at("name"), p.devices[i].name);
        EXPECT_EQ(d.at("type"), p.devices[i].type);
        EXPECT_EQ(d.at("subgroup_size"), p.devices[i].subgroup_size);
    }
    const dev::DeviceChoice c = dev::choose_device("auto", p);
    EXPECT_EQ(j.at("auto"), c.vulkan ? "vulkan:" + std::to_string(c.index) : std::string("cpu"));
}
