// JSON layer: parsing keeps order, big integers and duplicate-key semantics of Python's json module; rendering
// equals json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=True). Expected strings below are what
// CPython 3 prints for the same inputs; the fixture check compares against text the reference rendered.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "util/error.h"
#include "test_util.h"
#include "util/json.h"

using clef::JsonValue;

namespace {

JsonValue parse(std::string_view s) { return clef::parse_json_or_throw(s, "test"); }
std::string render(std::string_view s) { return clef::render_python(parse(s)); }


}  // namespace

TEST(PythonFloatRepr, MatchesCPython) {
    using clef::python_float_repr;
    EXPECT_EQ(python_float_repr(1250.0), "1250.0");
    EXPECT_EQ(python_float_repr(1e-05), "1e-05");
    EXPECT_EQ(python_float_repr(1.5e-05), "1.5e-05");
    EXPECT_EQ(python_float_repr(0.0001), "0.0001");
    EXPECT_EQ(python_float_repr(1e16), "1e+16");
    EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
    EXPECT_EQ(python_float_repr(1e22), "1e+22");
    EXPECT_EQ(python_float_repr(-0.0), "-0.0");
    EXPECT_EQ(python_float_repr(0.0), "0.0");
    EXPECT_EQ(python_float_repr(0.1), "0.1");
    EXPECT_EQ(python_float_repr(1.0 / 3.0), "0.3333333333333333");
    EXPECT_EQ(python_float_repr(5e-324), "5e-324");
    EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
    EXPECT_EQ(python_float_repr(123456789.125), "123456789.125");
    EXPECT_EQ(python_float_repr(-2.5), "-2.5");
    EXPECT_EQ(python_float_repr(1.2345e-7), "1.2345e-07");
    EXPECT_EQ(python_float_repr(9999999999999998.0), "9999999999999998.0");
    EXPECT_EQ(python_float_repr(12345678901234567890.0), "1.2345678901234567e+19");
    EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "Infinity");
    EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-Infinity");
    EXPECT_EQ(python_float_repr(std::nan("")), "NaN");
}

TEST(JsonRender, SortsKeysByCodePointAndKeepsBigIntegers) {
    EXPECT_EQ(render(R"({"b":1,"a":[1,2.0,-0.0],"A":null})"), R"({"A":null,"a":[1,2.0,-0.0],"b":1})");
    EXPECT_EQ(render(R"({"id":18446744073709551617,"neg":-9223372036854775809,"z":-0})"),
              R"({"id":18446744073709551617,"neg":-9223372036854775809,"z":0})");
    EXPECT_EQ(render("123456789012345678901234567890123"), "123456789012345678901234567890123");
    // U+FF01 (3 UTF-8 bytes) sorts before U+1F600 (4 bytes) by code point; UTF-16 order would differ.
    EXPECT_EQ(render(R"({"\ud83d\ude00":2,"\uff01":1,"":0})"), "{\"\":0,\"\xEF\xBC\x81\":1,\"\xF0\x9F\x98\x80\":2}");
    EXPECT_EQ(render("\"plain string passes through\""), "plain string passes through");
    EXPECT_EQ(render("true"), "true");
}

TEST(JsonRender, EscapesLikePython) {
    // Control characters: short escapes where Python has them, lowercase \u00xx otherwise; DEL, U+0080,
    // NBSP and U+2028 stay raw under ensure_ascii=False.
    EXPECT_EQ(render(R"(["\u0000\u0001\b\f\u001f\u007f\u0080\u00a0\u2028","q\"b\\s/t\tn\nr\r"])"),
              "[\"\\u0000\\u0001\\b\\f\\u001f\x7f\xC2\x80\xC2\xA0\xE2\x80\xA8\",\"q\\\"b\\\\s/t\\tn\\nr\\r\"]");
    clef::JsonWriteOptions ascii;
    ascii.ensure_ascii = true;
    EXPECT_EQ(clef::write_json(parse(R"(["\u00e9\ud83d\ude00\u007f"])"), ascii), R"(["\u00e9\ud83d\ude00\u007f"])");
}

TEST(JsonParse, DuplicateKeysKeepFirstPositionLastValue) {
    JsonValue v = parse(R"({"a":1,"b":2,"a":3})");
    ASSERT_EQ(v.members().size(), 2u);
    EXPECT_EQ(v.members()[0].first, "a");
    EXPECT_EQ(v.members()[0].second.int_text(), "3");
    EXPECT_EQ(v.members()[1].first, "b");
}

TEST(JsonParse, KeepsInsertionOrder) {
    JsonValue v = parse(R"({"2":0,"10":0,"1":0})");
    ASSERT_EQ(v.members().size(), 3u);
    EXPECT_EQ(v.members()[0].first, "2");
    EXPECT_EQ(v.members()[1].first, "10");
    EXPECT_EQ(v.members()[2].first, "1");
}

TEST(JsonParse, RejectsMalformedInput) {
    JsonValue v;
    clef::JsonParseError e;
    for (std::string_view bad : {"", "{", "{\"a\":}", "[1,]", "NaN", "Infinity", "[1] x", "\"\xff\"", "{'a':1}",
                                 "\"\\ud800\"", "01", "[1e400]"}) {
        EXPECT_FALSE(clef::parse_json(bad, v, e)) << bad;
        EXPECT_FALSE(e.message.empty());
    }
}

TEST(JsonParse, DepthLimitWithoutRecursion) {
    std::string deep(100000, '[');
    deep += std::string(100000, ']');
    JsonValue v;
    clef::JsonParseError e;
    EXPECT_FALSE(clef::parse_json(deep, v, e));
    EXPECT_TRUE(e.too_deep);
    std::string ok(100, '[');
    ok += std::string(100, ']');
    EXPECT_TRUE(clef::parse_json(ok, v, e));
    EXPECT_THROW(clef::parse_json_or_throw(deep, "body"), clef::Error);
}

// The reference rendered the state of case json_state_rendering; our rendering of the parsed request_body must
// reproduce that text byte for byte.
TEST(JsonRender, FixtureStateRendering) {
    int checked = 0;
    for (const auto& c : clef::testing::tiny_cases().items()) {
        if (c.find("expected_error") || !c.find("segments")) continue;
        JsonValue req = parse(c.find("request_body")->as_string());
        const JsonValue* state = req.find("state");
        ASSERT_NE(state, nullptr);
        for (const auto& seg : c.find("segments")->items()) {
            if (seg.find("role")->as_string() != "state") continue;
            if (c.find("state_tokens_total")->as_int64() != c.find("state_tokens_kept")->as_int64()) continue;
            EXPECT_EQ(clef::render_python(*state), seg.find("text")->as_string()) << c.find("name")->as_string();
            ++checked;
        }
        // request_body parses to the same value as request.
        EXPECT_TRUE(req == *c.find("request")) << c.find("name")->as_string();
    }
    EXPECT_GE(checked, 5);
}
