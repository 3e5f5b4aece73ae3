#include "util/json_fields.h"

#include <cmath>
#include <limits>

#include "util/error.h"

namespace clef {

using json = nlohmann::json;

std::string show_json(const json& v) {
    std::string s = v.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

json parse_json_object(const std::string& text, const std::string& source) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw Error(source + ": not valid JSON: " + e.what());
    }
    if (!j.is_object())
        throw Error(source + ": expected a JSON object at the top level, got " + show_json(j));
    return j;
}

void JsonFields::fail(std::string_view key, const std::string& problem) const {
    throw Error(source_ + ": " + prefix_ + std::string(key) + ": " + problem);
}

const json* JsonFields::find(std::string_view key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
}

const json& JsonFields::require(std::string_view key) const {
    const json* v = find(key);
    if (!v) fail(key, "missing");
    return *v;
}

int64_t JsonFields::integer_in(std::string_view key, const json& v, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + show_json(v));
    if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(hi))
            fail(key, "value " + show_json(v) + " is too large");
    } else {
        const int64_t i = v.get<int64_t>();
        if (i < lo || i > hi) fail(key, "value " + show_json(v) + " is out of range");
    }
    return v.get<int64_t>();
}

int JsonFields::integer(std::string_view key, const json& v) const {
    return static_cast<int>(
        integer_in(key, v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

int JsonFields::integer_or(std::string_view key, int def) const {
    const json* v = find(key);
    return v ? integer(key, *v) : def;
}

int JsonFields::positive(std::string_view key) const {
    int v = integer(key, require(key));
    if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
    return v;
}

int JsonFields::positive_or(std::string_view key, int def) const {
    return has(key) ? positive(key) : def;
}

int64_t JsonFields::positive_up_to(std::string_view key, const json& v, int64_t max) const {
    const int64_t i = integer_in(key, v, std::numeric_limits<int64_t>::min(), max);
    if (i <= 0) fail(key, "must be positive, got " + std::to_string(i));
    return i;
}

double JsonFields::number(std::string_view key, const json& v) const {
    if (!v.is_number()) fail(key, "expected a number, got " + show_json(v));
    double d = v.get<double>();
    if (!std::isfinite(d)) fail(key, "must be finite");
    return d;
}

double JsonFields::number_or(std::string_view key, double def) const {
    const json* v = find(key);
    return v ? number(key, *v) : def;
}

bool JsonFields::boolean_or(std::string_view key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + show_json(*v));
    return v->get<bool>();
}

std::string JsonFields::string_or(std::string_view key, const std::string& def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, "expected a string, got " + show_json(*v));
    return v->get<std::string>();
}

const json* JsonFields::object_or_null(std::string_view key) const {
    const json* v = find(key);
    if (v && !v->is_object()) fail(key, "expected an object, got " + show_json(*v));
    return v;
}

}  // namespace clef
