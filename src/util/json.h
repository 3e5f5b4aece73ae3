// JSON values as Python's json module sees them: objects keep insertion order (a repeated key keeps its first
// position and takes the last value, like a Python dict), integers keep every digit, floats are doubles.
// Parsing is done by nlohmann's iterative SAX parser (strict RFC 8259, UTF-8 validated), so deep nesting cannot
// overflow the stack; a depth limit is enforced on top. Rendering reproduces
// json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=...) byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clef {

class JsonValue {
public:
    enum class Kind { Null, Bool, Int, Float, String, Array, Object };
    using Member = std::pair<std::string, JsonValue>;

    JsonValue() = default;
    static JsonValue null() { return JsonValue(); }
    static JsonValue boolean(bool b);
    static JsonValue integer(int64_t v);
    static JsonValue integer_text(std::string digits);  // canonical decimal text, optional leading '-'
    static JsonValue number(double v);
    static JsonValue string(std::string s);
    static JsonValue array(std::vector<JsonValue> items = {});
    static JsonValue object(std::vector<Member> members = {});

    Kind kind() const { return kind_; }
    bool is_null() const { return kind_ == Kind::Null; }
    bool is_bool() const { return kind_ == Kind::Bool; }
    bool is_int() const { return kind_ == Kind::Int; }
    bool is_float() const { return kind_ == Kind::Float; }
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_array() const { return kind_ == Kind::Array; }
    bool is_object() const { return kind_ == Kind::Object; }

    bool as_bool() const { return bool_; }
    double as_double() const;                   // Int or Float
    bool fits_int64() const { return int_fits_; }
    int64_t as_int64() const { return int_; }   // valid when fits_int64()
    const std::string& int_text() const { return str_; }  // Int: decimal digits
    const std::string& as_string() const { return str_; }
    const std::vector<JsonValue>& items() const { return items_; }
    std::vector<JsonValue>& items() { return items_; }
    const std::vector<Member>& members() const { return members_; }
    std::vector<Member>& members() { return members_; }

    // Object lookup (linear; objects here are small). nullptr when absent or not an object.
    const JsonValue* find(std::string_view key) const;
    // Sets a member: replaces the value in place when the key exists, appends otherwise.
    void set(std::string key, JsonValue value);
    size_t size() const;  // items or members

    // Python-equal comparison (1 == 1.0 like Python, key order ignored for objects).
    friend bool operator==(const JsonValue& a, const JsonValue& b);

    const char* kind_name() const;  // "null", "bool", "int", "float", "string", "array", "object"

private:
    Kind kind_ = Kind::Null;
    bool bool_ = false;
    bool int_fits_ = false;
    int64_t int_ = 0;
    double float_ = 0.0;
    std::string str_;
    std::vector<JsonValue> items_;
    std::vector<Member> members_;
};

struct JsonParseOptions {
    size_t max_depth = 128;  // nesting of arrays/objects
};

// A parse failure: what went wrong and the byte offset where the parser stopped.
struct JsonParseError {
    std::string message;
    size_t offset = 0;
    bool too_deep = false;
};

// Returns false and fills err on malformed JSON, invalid UTF-8, trailing garbage or excessive depth.
bool parse_json(std::string_view text, JsonValue& out, JsonParseError& err, const JsonParseOptions& opt = {});
// Throwing form: clef::Error("<source>: <message>").
JsonValue parse_json_or_throw(std::string_view text, const std::string& source, const JsonParseOptions& opt = {});

// Python repr() of a float: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16 with ".0" on
// integral values, otherwise d.ddde+XX; json.dumps spellings for the non-finite values (NaN, Infinity, -Infinity).
std::string python_float_repr(double v);

struct JsonWriteOptions {
    bool sort_keys = false;     // keys sorted by code point (UTF-8 byte order), as Python's sort_keys=True
    bool ensure_ascii = false;  // escape non-ASCII as \uXXXX (surrogate pairs above the BMP)
};
// Compact rendering (separators "," and ":"), Python escapes.
std::string write_json(const JsonValue& v, const JsonWriteOptions& opt = {});
void write_json(const JsonValue& v, std::string& out, const JsonWriteOptions& opt = {});

// The reference prompt renderer: strings pass through unchanged, anything else is
// json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=True).
std::string render_python(const JsonValue& v);

}  // namespace clef
