// The one typed reader of JSON settings files: the model configs (model/config.cpp) and the image / video
// processor settings (image/preprocess.cpp) read their keys through JsonFields, whose errors read
// "<source>: <prefix><key>: <problem>".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace clef {

// A short rendering of a JSON value for error messages (at most 60 characters).
std::string show_json(const nlohmann::json& v);
// Parses a settings file's text: clef::Error("<source>: not valid JSON: ...") or, for anything but an
// object at the top level, "<source>: expected a JSON object at the top level, got ...".
nlohmann::json parse_json_object(const std::string& text, const std::string& source);

// Typed keys of one JSON object; `source` must outlive the reader.
class JsonFields {
public:
    using json = nlohmann::json;
    JsonFields(const json& obj, const std::string& source, std::string prefix)
        : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

    [[noreturn]] void fail(std::string_view key, const std::string& problem) const;
    std::string path(std::string_view key) const { return prefix_ + std::string(key); }
    const std::string& source() const { return source_; }

    // nullptr when absent or null.
    const json* find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }
    const json& require(std::string_view key) const;  // "missing" when absent or null

    int integer(std::string_view key, const json& v) const;  // an int
    int integer_or(std::string_view key, int def) const;
    int positive(std::string_view key) const;  // a required int above 0
    int positive_or(std::string_view key, int def) const;
    // An integer in [1, max] (e.g. pixel counts, beyond an int).
    int64_t positive_up_to(std::string_view key, const json& v, int64_t max) const;
    double number(std::string_view key, const json& v) const;  // finite
    double number_or(std::string_view key, double def) const;
    bool boolean_or(std::string_view key, bool def) const;
    std::string string_or(std::string_view key, const std::string& def) const;
    // A nested object (nullptr when absent or null); anything else is an error.
    const json* object_or_null(std::string_view key) const;

private:
    // An integer in [lo, hi]: "too large" above hi, "out of range" below lo.
    int64_t integer_in(std::string_view key, const json& v, int64_t lo, int64_t hi) const;

    const json& obj_;
    const std::string& source_;
    std::string prefix_;
};

}  // namespace clef
