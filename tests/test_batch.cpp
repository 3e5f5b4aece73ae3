// clef batch (src/cli/cmd_batch.cpp): 40 requests on the tiny fixture, 10 of them invalid, give line for
// line what `clef decide` gives for each request (run once per distinct request: decide is deterministic),
// error bodies on the bad lines, and a cut-off run completes without redoing the finished lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "test_util.h"
#include "util/json.h"

using namespace clef;
using clef::testing::read_file;
using clef::testing::run_command;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

// The fixture's valid request bodies, each also asked with the questions of another case (same state, other
// schema), so that the cache has states to resume.
std::vector<std::string> valid_bodies() {
    std::vector<const JsonValue*> ok;
    for (const auto& c : clef::testing::tiny_cases().items())
        if (!c.find("expected_error") && !c.find("request_body")->as_string().empty()) ok.push_back(&c);
    std::vector<std::string> out;
    for (size_t i = 0; i < ok.size(); ++i) {
        const std::string body = ok[i]->find("request_body")->as_string();
        out.push_back(body);
        JsonValue a = parse_json_or_throw(body, "case");
        const JsonValue b =
            parse_json_or_throw(ok[(i + 1) % ok.size()]->find("request_body")->as_string(), "case");
        a.set("questions", *b.find("questions"));
        out.push_back(write_json(a));
    }
    return out;
}

const std::vector<std::string> kInvalid = {
    "{not json",
    "[]",
    R"({"model":"m"})",
    R"({"model":"m","state":"x","questions":{}})",
    R"({"model":"m","state":"x","questions":{"q":{"type":"maybe","instructions":"?"}}})",
    R"({"model":"m","state":"x","questions":{"q":{"type":"choice","instructions":"?","criteria":{}}}})",
    R"({"model":"m","questions":{"q":{"type":"noul","instructions":"?"}}})",
    "",
    R"({"model":1,"state":"x","questions":{"q":{"type":"noul","instructions":"?"}}})",
    R"({"model":"m","state":"x","questions":{"q":{"type":"score","instructions":"?","levels":[]}}})",
};

std::string decide(const std::string& body, const std::string& dir, int& status) {
    const std::string path = dir + "/req.json";
    std::ofstream(path, std::ios::binary) << body;
    return run_command(std::string(CLEF_BINARY) + " decide --model " + kModel + " " + path + " 2>/dev/null",
                       status);
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
        out.push_back(text.substr(at, nl - at));
    return out;
}

}  // namespace

TEST(Batch, LineForLineWhatDecideGivesAndResumes) {
    const std::string dir = ::testing::TempDir() + "/clef_batch";
    std::filesystem::create_directories(dir);
    const std::vector<std::string> valid = valid_bodies();
    ASSERT_GE(valid.size(), 10u);
    std::vector<std::string> requests;
    for (size_t i = 0; requests.size() < 30; ++i) requests.push_back(valid[i % valid.size()]);
    for (size_t i = 0; i < kInvalid.size(); ++i) requests.insert(requests.begin() + 2 + 4 * i, kInvalid[i]);
    ASSERT_EQ(requests.size(), 40u);
    {
        std::ofstream in(dir + "/in.jsonl", std::ios::binary);
        for (const std::string& r : requests) in << r << '\n';
    }
    std::map<std::string, std::string> expected;  // decide's stdout per distinct valid body
    for (const std::string& body : valid) {
        int status = 0;
        expected[body] = decide(body, dir, status);
        ASSERT_EQ(WEXITSTATUS(status), 0) << body;
    }

    const std::string out = dir + "/out.jsonl";
    std::filesystem::remove(out);
    const std::string cmd = std::string(CLEF_BINARY) + " batch --model " + kModel + " --in " + dir +
                            "/in.jsonl --out " + out + " 2>&1";
    int status = 0;
    std::string log = run_command(cmd, status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << log;
    EXPECT_NE(log.find("40 lines: 30 answered, 10 errors, 0 skipped"), std::string::npos) << log;
    const std::string full = read_file(out);
    const std::vector<std::string> got = lines_of(full);
    ASSERT_EQ(got.size(), 40u);
    for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE(i);
        auto it = expected.find(requests[i]);
        if (it != expected.end()) {
            EXPECT_EQ(got[i] + "\n", it->second);
        } else {
            const JsonValue e = parse_json_or_throw(got[i], "error line");
            EXPECT_NE(e.find("detail"), nullptr) << got[i];
        }
    }

    // Cut off after 20 complete lines and part of a line; the re-run keeps those and writes the rest.
    const size_t cut = full.find('\n', [&] {
        size_t at = 0;
        for (int k = 0; k < 19; ++k) at = full.find('\n', at) + 1;
        return at;
    }()) + 1;
    std::filesystem::resize_file(out, cut + 10);
    log = run_command(cmd, status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << log;
    EXPECT_NE(log.find("20 skipped"), std::string::npos) << log;
    EXPECT_EQ(read_file(out), full);
}
