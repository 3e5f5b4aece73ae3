// `clef serve --device vulkan` (issue 29, point 8), in process on lavapipe: /v1/models and /metrics name the
// device and its memory; decisions answer as the CPU server's do (max |dp| <= 1e-4); with the state cache on,
// a decision that resumes a cached prefix answers as one that does not (entries can only miss, never answer
// wrong).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "device/vulkan.h"
#include "test_server_util.h"
#include "util/json.h"

using namespace clef;
using clef::testing::RunningServer;

namespace {

bool have_vulkan() {
    return dev::choose_device("vulkan", dev::probe_vulkan()).vulkan;
}

RunningServer& server(const std::string& device) {
    static std::map<std::string, std::unique_ptr<RunningServer>> servers;
    auto& s = servers[device];
    if (!s) {
        setenv("CLEF_VULKAN_VALIDATION", "1", 0);
        ServerOptions o;
        o.model_name = "tiny-clef";
        LoadOptions lo;
        lo.device = device;
        lo.cache_bytes = 64 << 20;
        s = std::make_unique<RunningServer>(o, lo);
    }
    return *s;
}

JsonValue get_json(RunningServer& s, const std::string& path) {
    const auto r = s.client().Get(path);
    if (!r || r->status != 200) throw std::runtime_error("GET " + path + " failed");
    return parse_json_or_throw(r->body, path);
}

// The probabilities of every option of a /v1/systemone answer, in answer order.
std::vector<double> probabilities(RunningServer& s, const std::string& body) {
    const auto r = s.client().Post("/v1/systemone", body, "application/json");
    if (!r || r->status != 200) throw std::runtime_error("decision failed: " + (r ? r->body : "no answer"));
    std::vector<double> out;
    const JsonValue doc = parse_json_or_throw(r->body, "answer");
    for (const auto& [name, a] : doc.find("answers")->members()) {
        if (const JsonValue* p = a.find("probabilities"))
            for (const auto& [option, v] : p->members()) out.push_back(v.as_double());
        if (const JsonValue* n = a.find("noul")) out.push_back(n->as_double());
    }
    return out;
}

const std::string kState =
    "Order 1182: the customer reports the parcel arrived two weeks late and the box was crushed; they ask "
    "for a refund of the shipping fee.";

std::string request(const std::string& questions) {
    return R"({"model": "tiny-clef", "state": ")" + kState + R"(", "questions": )" + questions + "}";
}

}  // namespace

TEST(VulkanServer, ModelsAndMetricsNameTheDevice) {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    for (const std::string device : {"vulkan", "cpu"}) {
        SCOPED_TRACE(device);
        const JsonValue models = get_json(server(device), "/v1/models");
        const JsonValue& d = *models.find("models")->items().at(0).find("device");
        EXPECT_EQ(d.find("kind")->as_string(), device);
        EXPECT_FALSE(d.find("name")->as_string().empty());
        const int64_t total = d.find("memory_bytes")->as_int64(),
                      used = d.find("memory_used_bytes")->as_int64();
        if (device == "vulkan") {
            EXPECT_GT(total, 0);
            EXPECT_GT(used, 100'000);  // tiny-clef's weights (about 1 MB) are on the device
            EXPECT_LE(used, total);
        } else {
            EXPECT_EQ(total, 0);
        }
        const auto r = server(device).client().Get("/metrics");
        ASSERT_TRUE(r);
        EXPECT_NE(r->body.find("clef_device_info{kind=\"" + device + "\",name=\""), std::string::npos);
        EXPECT_NE(r->body.find("clef_device_memory_used_bytes " + std::to_string(device == "cpu" ? 0 : used)),
                  std::string::npos)
            << "the memory /v1/models reported (nothing was decided in between)";
    }
}

TEST(VulkanServer, AnswersAsTheCpuServerWithTheStateCache) {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    const std::string a = request(R"({"late": {"type": "noul"}})");
    const std::string b =
        request(R"({"mood": {"type": "choice", "criteria": {"calm": null, "angry": null, "sad": null}}})");
    // a fills the cache with the state's prefix; b resumes it on the device.
    for (const std::string& body : {a, b, a}) {
        const std::vector<double> g = probabilities(server("vulkan"), body);
        const std::vector<double> c = probabilities(server("cpu"), body);
        ASSERT_EQ(g.size(), c.size());
        // The answers carry 4 decimals: two values 1e-6 apart can round 1e-4 apart.
        for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], c[i], 1.5e-4) << i;
    }
    const auto r = server("vulkan").client().Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body.find("clef_state_cache_hits_total 0\n"), std::string::npos) << "the cache was not used";
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}
