// `clef serve --device vulkan` (issue 29, points 8 and 9), in process on lavapipe: /v1/models and /metrics
// name the device and its memory; decisions answer as the CPU server's do (max |dp| <= 1e-4); with the state
// cache on, a decision that resumes a cached prefix answers as one that does not (entries can only miss,
// never answer wrong). Faults forced through device/vulkan.h inject_vulkan_fault: out of device memory fails
// that one decision (503) and the next is answered; a lost device and a kernel the driver does not build move
// the model to the CPU, and the decision is answered there.
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

std::unique_ptr<RunningServer> start_server(const std::string& device) {
    setenv("CLEF_VULKAN_VALIDATION", "1", 0);
    ServerOptions o;
    o.model_name = "tiny-clef";
    LoadOptions lo;
    lo.device = device;
    lo.cache_bytes = 64 << 20;
    return std::make_unique<RunningServer>(o, lo);
}

// One server per device for the program (the fault tests start their own), stopped by Env::TearDown: a
// Vulkan device must go before the process's exit handlers, which unload the validation layer's state.
std::map<std::string, std::unique_ptr<RunningServer>>& servers() {
    static std::map<std::string, std::unique_ptr<RunningServer>> m;
    return m;
}

RunningServer& server(const std::string& device) {
    auto& s = servers()[device];
    if (!s) s = start_server(device);
    return *s;
}

class Env : public ::testing::Environment {
public:
    void TearDown() override { servers().clear(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

JsonValue get_json(RunningServer& s, const std::string& path) {
    const auto r = s.client().Get(path);
    if (!r || r->status != 200) throw std::runtime_error("GET " + path + " failed");
    return parse_json_or_throw(r->body, path);
}

// The probabilities of every option of an answer (a /v1/systemone response body), in answer order.
std::vector<double> probabilities(const std::string& answer) {
    std::vector<double> out;
    const JsonValue doc = parse_json_or_throw(answer, "answer");
    for (const auto& [name, a] : doc.find("answers")->members()) {
        if (const JsonValue* p = a.find("probabilities"))
            for (const auto& [option, v] : p->members()) out.push_back(v.as_double());
        if (const JsonValue* n = a.find("noul")) out.push_back(n->as_double());
    }
    return out;
}

std::vector<double> probabilities(RunningServer& s, const std::string& body) {
    const auto r = s.client().Post("/v1/systemone", body, "application/json");
    if (!r || r->status != 200) throw std::runtime_error("decision failed: " + (r ? r->body : "no answer"));
    return probabilities(r->body);
}

// The answers carry 4 decimals: two values 1e-6 apart can round 1e-4 apart.
void expect_same_answers(const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1.5e-4) << i;
}

std::string device_kind(RunningServer& s) {
    return get_json(s, "/v1/models").find("models")->items().at(0).find("device")->find("kind")->as_string();
}

// Clears every injected fault when a test ends, passed or not.
struct FaultsCleared {
    ~FaultsCleared() {
        dev::inject_vulkan_fault(dev::VulkanFault::OutOfMemory, -1);
        dev::inject_vulkan_fault(dev::VulkanFault::Lost, -1);
        dev::inject_vulkan_fault(dev::VulkanFault::Kernel, -1, "");
    }
};

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
    for (const std::string& body : {a, b, a})
        expect_same_answers(probabilities(server("vulkan"), body), probabilities(server("cpu"), body));
    const auto r = server("vulkan").client().Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body.find("clef_state_cache_hits_total 0\n"), std::string::npos) << "the cache was not used";
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

// A long state: the decision needs device buffers larger than the warm-up's, so it allocates.
std::string long_request() {
    std::string state;
    for (int i = 0; i < 40; ++i) state += "Line " + std::to_string(i) + ": the parcel was late again. ";
    return R"({"model": "tiny-clef", "state": ")" + state + R"(", "questions": {"late": {"type": "noul"}}})";
}

TEST(VulkanServer, OutOfDeviceMemoryFailsThatDecisionOnly) {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    FaultsCleared cleared;
    const auto s = start_server("vulkan");
    dev::inject_vulkan_fault(dev::VulkanFault::OutOfMemory, 0);  // the next device allocation fails
    const std::string body = long_request();
    const auto r = s->client().Post("/v1/systemone", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_NE(r->body.find("device_out_of_memory"), std::string::npos) << r->body;
    // The server keeps serving, on the device, and the next decision is right.
    EXPECT_EQ(device_kind(*s), "vulkan");
    expect_same_answers(probabilities(*s, body), probabilities(server("cpu"), body));
}

TEST(VulkanServer, LostDeviceMovesTheModelToTheCpu) {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    FaultsCleared cleared;
    const auto s = start_server("vulkan");
    dev::inject_vulkan_fault(dev::VulkanFault::Lost, 0);  // the next submission loses the device
    const std::string body = long_request();
    const auto r = s->client().Post("/v1/systemone", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;  // the decision started over on the CPU
    expect_same_answers(probabilities(r->body), probabilities(server("cpu"), body));
    EXPECT_EQ(device_kind(*s), "cpu");
    expect_same_answers(probabilities(*s, body), probabilities(server("cpu"), body));
}

TEST(VulkanServer, KernelTheDriverDoesNotBuildMovesTheModelToTheCpu) {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device on this machine";
    FaultsCleared cleared;
    dev::inject_vulkan_fault(dev::VulkanFault::Kernel, 0,
                             "delta_wy");   // the chunked delta rule's first kernel
    const auto s = start_server("vulkan");  // the warm-up decision finds it and moves to the CPU
    EXPECT_EQ(device_kind(*s), "cpu");
    const std::string body = long_request();
    expect_same_answers(probabilities(*s, body), probabilities(server("cpu"), body));
}
