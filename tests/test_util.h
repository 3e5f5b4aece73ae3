// Helpers shared by the test programs: test data paths, file reading, the tiny-clef fixture cases, structural
// JSON comparison with a numeric tolerance, and running the clef binary.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "decision/request.h"
#include "util/json.h"

namespace clef::testing {

// Sanitizer builds run several times slower: the waits that bound a behaviour (not a speed) stretch by this.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kTimeScale = 4.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kTimeScale = 4.0;
#else
inline constexpr double kTimeScale = 1.0;
#endif
#else
inline constexpr double kTimeScale = 1.0;
#endif
// Sanitizer builds: the sweeps over every fixture case through the slow scalar paths take a sample there
// (the Release run covers every case; the sanitizers look for memory errors, which a sample finds as well).
inline constexpr bool kSanitized = kTimeScale > 1.0;

inline std::string data_path(const std::string& rel) {
    return std::string(CLEF_TEST_DATA) + "/" + rel;
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Normally distributed test vectors (mean 0, standard deviation `scale`).
inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// A fresh directory under the system temp directory (unique per process and instance), removed with its
// contents when this goes out of scope.
class ScratchDir {
public:
    explicit ScratchDir(const std::string& tag) {
        static std::atomic<int> counter{0};
        dir_ = std::filesystem::temp_directory_path() /
               (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
                std::to_string(std::random_device{}()));
        std::filesystem::create_directories(dir_);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;

    const std::filesystem::path& path() const { return dir_; }
    std::string file(const std::string& name) const { return (dir_ / name).string(); }
    // Writes `bytes` to the file `name` in this directory and returns its path.
    std::string write(const std::string& name, std::string_view bytes) const {
        const std::string p = file(name);
        std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return p;
    }

private:
    std::filesystem::path dir_;
};

// tests/data/tiny-clef/cases.json, parsed once per test program.
// The cases of a fixture directory's cases.json (tiny-clef, tiny-clef27), parsed once per test program.
inline const JsonValue& cases_in(const std::string& dir) {
    static std::map<std::string, JsonValue> docs;
    auto it = docs.find(dir);
    if (it == docs.end())
        it =
            docs.emplace(dir, parse_json_or_throw(read_file(dir + "/cases.json"), dir + "/cases.json")).first;
    return *it->second.find("cases");
}

inline const JsonValue& tiny_case_of(const std::string& dir, const std::string& name) {
    for (const auto& c : cases_in(dir).items())
        if (c.find("name")->as_string() == name) return c;
    throw std::runtime_error("no fixture case " + name + " in " + dir);
}

inline const JsonValue& tiny_cases() {
    return cases_in(data_path("tiny-clef"));
}

inline const JsonValue& tiny_case(const std::string& name) {
    return tiny_case_of(data_path("tiny-clef"), name);
}

// tests/data/tiny-clef/image_cases.json, parsed once per test program.
inline const JsonValue& tiny_image_cases() {
    static const JsonValue doc =
        parse_json_or_throw(read_file(data_path("tiny-clef/image_cases.json")), "image_cases.json");
    return *doc.find("cases");
}

// Calls fn(fixture case, image entry, the request's image JSON) for every image the image cases describe, in
// order (cases without an "images" entry are the error cases).
template <class Fn>
void for_each_fixture_image(Fn&& fn) {
    for (const auto& c : tiny_image_cases().items()) {
        const JsonValue* imgs = c.find("images");
        if (!imgs) continue;
        const auto& req_images = c.find("request")->find("images")->items();
        for (const auto& im : imgs->items())
            fn(c, im, req_images[static_cast<size_t>(im.find("index")->as_int64())]);
    }
}

// A [begin, end) pair from the fixture's JSON.
inline std::pair<int, int> span_of(const JsonValue& arr) {
    return {static_cast<int>(arr.items()[0].as_int64()), static_cast<int>(arr.items()[1].as_int64())};
}

// Parses a fixture case's request_body (the json.dumps text) and validates it.
// Max |a - b| over every option of every question (Decision::probabilities of two decisions).
template <class P>
double max_probability_diff(const P& a, const P& b) {
    double worst = 0;
    for (size_t q = 0; q < b.size() && q < a.size(); ++q)
        for (size_t o = 0; o < b[q].size() && o < a[q].size(); ++o)
            worst = std::max(worst, std::fabs(static_cast<double>(a[q][o]) - static_cast<double>(b[q][o])));
    return worst;
}

inline bool parse_case_request(const JsonValue& c, DecisionRequest& req, std::vector<RequestError>& errors) {
    JsonValue body = parse_json_or_throw(c.find("request_body")->as_string(), c.find("name")->as_string());
    return parse_request(body, req, errors);
}

// Same kinds, same keys in the same order, strings exact, numbers within tol.
inline void expect_json_near(const JsonValue& got, const JsonValue& want, double tol,
                             const std::string& path) {
    if (want.is_number()) {
        ASSERT_TRUE(got.is_number()) << path;
        EXPECT_NEAR(got.as_double(), want.as_double(), tol) << path;
        return;
    }
    ASSERT_EQ(got.kind(), want.kind()) << path;
    if (want.is_object()) {
        ASSERT_EQ(got.members().size(), want.members().size()) << path;
        for (size_t i = 0; i < want.members().size(); ++i) {
            EXPECT_EQ(got.members()[i].first, want.members()[i].first) << path;
            expect_json_near(got.members()[i].second, want.members()[i].second, tol,
                             path + "/" + want.members()[i].first);
        }
    } else if (want.is_array()) {
        ASSERT_EQ(got.items().size(), want.items().size()) << path;
        for (size_t i = 0; i < want.items().size(); ++i)
            expect_json_near(got.items()[i], want.items()[i], tol, path + "/" + std::to_string(i));
    } else {
        EXPECT_TRUE(got == want) << path << ": " << write_json(got) << " vs " << write_json(want);
    }
}

// softmax(l / t) in double, written out (the independent side of the calibration tests).
inline std::vector<double> softmax_ref(const std::vector<double>& l, double t) {
    std::vector<double> p;
    double sum = 0;
    for (double x : l) sum += std::exp(x / t);
    for (double x : l) p.push_back(std::exp(x / t) / sum);
    return p;
}

// Runs a shell command, returns its stdout; status gets the wait status (use WEXITSTATUS).
inline std::string run_command(const std::string& cmd, int& status) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed: " + cmd);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    status = pclose(p);
    return out;
}

}  // namespace clef::testing
