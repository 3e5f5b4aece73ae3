#include "util/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "util/error.h"

namespace clef {

JsonValue JsonValue::boolean(bool b) {
    JsonValue v;
    v.kind_ = Kind::Bool;
    v.bool_ = b;
    return v;
}

JsonValue JsonValue::integer(int64_t i) {
    JsonValue v;
    v.kind_ = Kind::Int;
    v.int_ = i;
    v.int_fits_ = true;
    v.str_ = std::to_string(i);
    return v;
}

JsonValue JsonValue::integer_text(std::string digits) {
    if (digits == "-0") digits = "0";
    JsonValue v;
    v.kind_ = Kind::Int;
    v.str_ = std::move(digits);
    int64_t parsed = 0;
    auto [p, ec] = std::from_chars(v.str_.data(), v.str_.data() + v.str_.size(), parsed);
    if (ec == std::errc() && p == v.str_.data() + v.str_.size()) {
        v.int_ = parsed;
        v.int_fits_ = true;
    }
    return v;
}

JsonValue JsonValue::number(double d) {
    JsonValue v;
    v.kind_ = Kind::Float;
    v.float_ = d;
    return v;
}

JsonValue JsonValue::string(std::string s) {
    JsonValue v;
    v.kind_ = Kind::String;
    v.str_ = std::move(s);
    return v;
}

JsonValue JsonValue::array(std::vector<JsonValue> items) {
    JsonValue v;
    v.kind_ = Kind::Array;
    v.items_ = std::move(items);
    return v;
}

JsonValue JsonValue::object(std::vector<Member> members) {
    JsonValue v;
    v.kind_ = Kind::Object;
    for (auto& m : members) v.set(std::move(m.first), std::move(m.second));
    return v;
}

double JsonValue::as_double() const {
    if (kind_ == Kind::Float) return float_;
    if (kind_ == Kind::Int) return int_fits_ ? static_cast<double>(int_) : std::strtod(str_.c_str(), nullptr);
    return 0.0;
}

const JsonValue* JsonValue::find(std::string_view key) const {
    if (kind_ != Kind::Object) return nullptr;
    for (const auto& m : members_)
        if (m.first == key) return &m.second;
    return nullptr;
}

void JsonValue::set(std::string key, JsonValue value) {
    for (auto& m : members_)
        if (m.first == key) {
            m.second = std::move(value);
            return;
        }
    members_.emplace_back(std::move(key), std::move(value));
}

size_t JsonValue::size() const {
    if (kind_ == Kind::Array) return items_.size();
    if (kind_ == Kind::Object) return members_.size();
    return 0;
}

const char* JsonValue::kind_name() const {
    switch (kind_) {
        case Kind::Null: return "null";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "string";
        case Kind::Array: return "array";
        case Kind::Object: return "object";
    }
    return "?";
}

bool operator==(const JsonValue& a, const JsonValue& b) {
    using K = JsonValue::Kind;
    if (a.is_number() && b.is_number()) {
        if (a.is_int() && b.is_int()) return a.int_text() == b.int_text();
        return a.as_double() == b.as_double();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case K::Null: return true;
        case K::Bool: return a.as_bool() == b.as_bool();
        case K::String: return a.as_string() == b.as_string();
        case K::Array: return a.items() == b.items();
        case K::Object: {
            if (a.members().size() != b.members().size()) return false;
            for (const auto& m : a.members()) {
                const JsonValue* o = b.find(m.first);
                if (!o || !(*o == m.second)) return false;
            }
            return true;
        }
        default: return false;
    }
}

namespace {

// Builds a JsonValue tree from nlohmann's SAX events.
class Builder {
public:
    explicit Builder(size_t max_depth) : max_depth_(max_depth) {}

    bool null() { return put(JsonValue::null()); }
    bool boolean(bool b) { return put(JsonValue::boolean(b)); }
    bool number_integer(int64_t v) { return put(JsonValue::integer(v)); }
    bool number_unsigned(uint64_t v) { return put(JsonValue::integer_text(std::to_string(v))); }
    bool number_float(double v, const std::string& text) {
        // nlohmann hands integers that overflow 64 bits to the float path; Python keeps them exact.
        bool integral = !text.empty() && text.find_first_of(".eE") == std::string::npos;
        return put(integral ? JsonValue::integer_text(text) : JsonValue::number(v));
    }
    bool string(std::string& s) { return put(JsonValue::string(std::move(s))); }
    bool binary(std::vector<uint8_t>&) { return false; }
    bool start_object(size_t) { return open(JsonValue::object()); }
    bool start_array(size_t) { return open(JsonValue::array()); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool key(std::string& k) {
        Frame& f = stack_.back();
        f.pending_key = std::move(k);
        return true;
    }
    bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& ex) {
        error_.offset = position;
        error_.message = ex.what();
        // Strip nlohmann's "[json.exception.parse_error.101] " prefix.
        auto p = error_.message.find("] ");
        if (p != std::string::npos) error_.message = error_.message.substr(p + 2);
        return false;
    }

    JsonValue take() { return std::move(root_); }
    const JsonParseError& error() const { return error_; }
    JsonParseError& error() { return error_; }

private:
    struct Frame {
        JsonValue value;
        std::string pending_key;
        std::unordered_map<std::string, size_t> index;  // key -> member position (objects only)
    };

    bool put(JsonValue v) {
        if (stack_.empty()) {
            root_ = std::move(v);
            return true;
        }
        Frame& f = stack_.back();
        if (f.value.is_array()) {
            f.value.items().push_back(std::move(v));
        } else {
            auto [it, inserted] = f.index.emplace(f.pending_key, f.value.members().size());
            if (inserted)
                f.value.members().emplace_back(std::move(f.pending_key), std::move(v));
            else
                f.value.members()[it->second].second = std::move(v);  // Python dict: first position, last value
        }
        return true;
    }
    bool open(JsonValue v) {
        if (stack_.size() >= max_depth_) {
            error_.message = "nesting deeper than " + std::to_string(max_depth_) + " levels";
            error_.too_deep = true;
            return false;
        }
        stack_.push_back(Frame{std::move(v), {}, {}});
        return true;
    }
    bool close() {
        JsonValue v = std::move(stack_.back().value);
        stack_.pop_back();
        return put(std::move(v));
    }

    size_t max_depth_;
    std::vector<Frame> stack_;
    JsonValue root_;
    JsonParseError error_;
};

void append_utf8_escape(std::string& out, uint32_t cp) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    out += buf;
}

void write_string(std::string_view s, std::string& out, bool ensure_ascii) {
    out += '"';
    for (size_t i = 0; i < s.size(); ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"': out += "\\\""; continue;
            case '\\': out += "\\\\"; continue;
            case '\n': out += "\\n"; continue;
            case '\r': out += "\\r"; continue;
            case '\t': out += "\\t"; continue;
            case '\b': out += "\\b"; continue;
            case '\f': out += "\\f"; continue;
            default: break;
        }
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
            append_utf8_escape(out, c);
        } else if (c < 0x80 || !ensure_ascii) {
            out += static_cast<char>(c);
        } else {
            // Decode one UTF-8 sequence (input is valid UTF-8: the parser checked it).
            int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            uint32_t cp = c & (0xff >> (len + 1));
            for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
            i += len - 1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                append_utf8_escape(out, 0xd800 + (cp >> 10));
                append_utf8_escape(out, 0xdc00 + (cp & 0x3ff));
            } else {
                append_utf8_escape(out, cp);
            }
        }
    }
    out += '"';
}

void write_value(const JsonValue& v, std::string& out, const JsonWriteOptions& opt) {
    using K = JsonValue::Kind;
    switch (v.kind()) {
        case K::Null: out += "null"; return;
        case K::Bool: out += v.as_bool() ? "true" : "false"; return;
        case K::Int: out += v.int_text(); return;
        case K::Float: out += python_float_repr(v.as_double()); return;
        case K::String: write_string(v.as_string(), out, opt.ensure_ascii); return;
        case K::Array: {
            out += '[';
            bool first = true;
            for (const auto& item : v.items()) {
                if (!first) out += ',';
                first = false;
                write_value(item, out, opt);
            }
            out += ']';
            return;
        }
        case K::Object: {
            out += '{';
            std::vector<const JsonValue::Member*> members;
            members.reserve(v.members().size());
            for (const auto& m : v.members()) members.push_back(&m);
            if (opt.sort_keys)
                std::sort(members.begin(), members.end(),
                          [](const JsonValue::Member* a, const JsonValue::Member* b) { return a->first < b->first; });
            bool first = true;
            for (const auto* m : members) {
                if (!first) out += ',';
                first = false;
                write_string(m->first, out, opt.ensure_ascii);
                out += ':';
                write_value(m->second, out, opt);
            }
            out += '}';
            return;
        }
    }
}

}  // namespace

bool parse_json(std::string_view text, JsonValue& out, JsonParseError& err, const JsonParseOptions& opt) {
    Builder b(opt.max_depth);
    bool ok = false;
    try {
        ok = nlohmann::json::sax_parse(text.begin(), text.end(), &b, nlohmann::json::input_format_t::json, true);
    } catch (const std::exception& e) {  // defensive: the SAX path reports errors through parse_error
        b.error().message = e.what();
        ok = false;
    }
    if (!ok) {
        err = b.error();
        if (err.message.empty()) err.message = "malformed JSON";
        return false;
    }
    out = b.take();
    return true;
}

JsonValue parse_json_or_throw(std::string_view text, const std::string& source, const JsonParseOptions& opt) {
    JsonValue v;
    JsonParseError e;
    if (!parse_json(text, v, e, opt)) throw Error(source + ": invalid JSON: " + e.message);
    return v;
}

std::string python_float_repr(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
    // Shortest round-trip digits in scientific form: [-]d[.ddd]e[+-]XX
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string_view s(buf, static_cast<size_t>(res.ptr - buf));
    bool neg = false;
    if (s.front() == '-') {
        neg = true;
        s.remove_prefix(1);
    }
    size_t e = s.find('e');
    std::string digits;
    for (char c : s.substr(0, e))
        if (c != '.') digits += c;
    int exp10 = std::atoi(std::string(s.substr(e + 1)).c_str());
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int decpt = exp10 + 1;  // value = 0.d1d2... * 10^decpt
    std::string out = neg ? "-" : "";
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out += "0.";
            out.append(static_cast<size_t>(-decpt), '0');
            out += digits;
        } else if (static_cast<size_t>(decpt) >= digits.size()) {
            out += digits;
            out.append(static_cast<size_t>(decpt) - digits.size(), '0');
            out += ".0";
        } else {
            out += digits.substr(0, static_cast<size_t>(decpt));
            out += '.';
            out += digits.substr(static_cast<size_t>(decpt));
        }
    } else {
        out += digits[0];
        if (digits.size() > 1) {
            out += '.';
            out += digits.substr(1);
        }
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        out += eb;
    }
    return out;
}

void write_json(const JsonValue& v, std::string& out, const JsonWriteOptions& opt) { write_value(v, out, opt); }

std::string write_json(const JsonValue& v, const JsonWriteOptions& opt) {
    std::string out;
    write_value(v, out, opt);
    return out;
}

std::string render_python(const JsonValue& v) {
    if (v.is_string()) return v.as_string();
    JsonWriteOptions opt;
    opt.sort_keys = true;
    return write_json(v, opt);
}

}  // namespace clef
