// Request validation: every rule of the System One request schema (docs/API.md "Errors" and "Limits") that
// the engine enforces, and the reference's option order and defaults.
#include <gtest/gtest.h>

#include "decision/request.h"

using namespace clef;

namespace {

struct Parsed {
    bool ok;
    DecisionRequest req;
    std::vector<RequestError> errors;
};

Parsed parse(std::string_view body, RequestLimits limits = {}) {
    Parsed p;
    JsonValue v = parse_json_or_throw(body, "test");
    p.ok = parse_request(v, p.req, p.errors, limits);
    return p;
}

std::string loc(const RequestError& e) {
    std::string s;
    for (const auto& l : e.loc) s += "/" + (l.is_string() ? l.as_string() : write_json(l));
    return s;
}

}  // namespace

TEST(Request, NoulDefaultsAndOverrides) {
    auto p = parse(R"({"model":"m","state":"s","questions":{
        "a":{"type":"noul","instructions":"A?"},
        "b":{"type":"noul","criteria":{"true":"yes!","false":null,"maybe":"x"}},
        "c":{"type":"noul","instructions":"","criteria":null}}})");
    ASSERT_TRUE(p.ok) << describe_errors(p.errors);
    ASSERT_EQ(p.req.questions.size(), 3u);
    const auto& a = p.req.questions[0];
    ASSERT_EQ(a.options.size(), 2u);
    EXPECT_EQ(a.options[0].id, "true");
    EXPECT_EQ(a.options[0].description.as_string(), "The proposition is true or the answer is yes.");
    EXPECT_EQ(a.options[1].description.as_string(), "The proposition is false or the answer is no.");
    const auto& b = p.req.questions[1];
    EXPECT_EQ(b.instructions.as_string(), "b");  // id fallback
    EXPECT_EQ(b.options[0].description.as_string(), "yes!");
    EXPECT_FALSE(b.options[1].has_description);  // explicit null drops it
    EXPECT_EQ(p.req.questions[2].instructions.as_string(), "c");
}

TEST(Request, ChoiceSortedByCodePointAnswersInRequestOrder) {
    auto p = parse(R"({"model":"m","state":{"x":1},"questions":{"q":{"type":"choice","instructions":"?",
        "criteria":{"b":null,"\u00e9":"e acute","B":"upper","a":{"k":[1]}}}}})");
    ASSERT_TRUE(p.ok);
    const auto& q = p.req.questions[0];
    std::vector<std::string> ids;
    for (const auto& o : q.options) ids.push_back(o.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"B", "a", "b", "\xC3\xA9"}));
    EXPECT_EQ(q.answer_order, (std::vector<std::string>{"b", "\xC3\xA9", "B", "a"}));
    EXPECT_FALSE(q.options[2].has_description);
}

TEST(Request, ScoreLevels) {
    auto p = parse(R"({"model":"m","state":["a"],"questions":{"s":{"type":"score","criteria":["lo",{"x":1},"hi"]}}})");
    ASSERT_TRUE(p.ok);
    const auto& q = p.req.questions[0];
    ASSERT_EQ(q.options.size(), 3u);
    EXPECT_EQ(q.options[1].id, "1");
    EXPECT_TRUE(q.options[1].description.is_object());
}

TEST(Request, DocumentAliasAndExtraFields) {
    auto p = parse(R"({"model":"m","document":"old name","extra":42,"questions":{"q":{"type":"noul"}}})");
    ASSERT_TRUE(p.ok);
    EXPECT_EQ(p.req.state.as_string(), "old name");
}

TEST(Request, KeepsQuestionOrder) {
    auto p = parse(R"({"model":"m","state":"s","questions":{"2":{"type":"noul"},"10":{"type":"noul"},"1":{"type":"noul"}}})");
    ASSERT_TRUE(p.ok);
    EXPECT_EQ(p.req.questions[0].id, "2");
    EXPECT_EQ(p.req.questions[1].id, "10");
    EXPECT_EQ(p.req.questions[2].id, "1");
}

TEST(Request, ValidationErrors422) {
    struct Case {
        const char* body;
        const char* type;
        const char* loc;
    };
    const Case cases[] = {
        {R"([1,2])", "dict_type", "/body"},
        {R"({"state":"s","questions":{"q":{"type":"noul"}}})", "missing", "/body/model"},
        {R"({"model":5,"state":"s","questions":{"q":{"type":"noul"}}})", "string_type", "/body/model"},
        {R"({"model":"m","questions":{"q":{"type":"noul"}}})", "missing", "/body/state"},
        {R"({"model":"m","state":null,"questions":{"q":{"type":"noul"}}})", "missing", "/body/state"},
        {R"({"model":"m","state":"s"})", "missing", "/body/questions"},
        {R"({"model":"m","state":"s","questions":[]})", "dict_type", "/body/questions"},
        {R"({"model":"m","state":"s","questions":{}})", "too_short", "/body/questions"},
        {R"({"model":"m","state":"s","questions":{"q":"noul"}})", "dict_type", "/body/questions/q"},
        {R"({"model":"m","state":"s","questions":{"q":{"type":"rank"}}})", "union_tag_invalid", "/body/questions/q/type"},
        {R"({"model":"m","state":"s","questions":{"q":{"instructions":"x"}}})", "union_tag_invalid", "/body/questions/q/type"},
        {R"({"model":"m","state":"s","questions":{"q":{"type":"choice"}}})", "missing", "/body/questions/q/choice/criteria"},
        {R"({"model":"m","state":"s","questions":{"q":{"type":"choice","criteria":["a"]}}})", "dict_type", "/body/questions/q/choice/criteria"},
        {R"({"model":"m","state":"s","questions":{"q":{"type":"score","criteria":{"a":1}}}})", "list_type", "/body/questions/q/score/criteria"},
        {R"({"model":"m","state":"s","questions":{"q":{"type":"noul","criteria":"yes"}}})", "dict_type", "/body/questions/q/noul/criteria"},
        {R"({"model":"m","state":"s","questions":{"":{"type":"noul"}}})", "value_error", "/body/questions/"},
    };
    for (const auto& c : cases) {
        auto p = parse(c.body);
        ASSERT_FALSE(p.ok) << c.body;
        ASSERT_FALSE(p.errors.empty());
        EXPECT_EQ(p.errors[0].kind, RequestErrorKind::Validation) << c.body;
        EXPECT_EQ(p.errors[0].type, c.type) << c.body;
        EXPECT_EQ(loc(p.errors[0]), c.loc) << c.body;
    }
    // Several problems are all reported.
    auto p = parse(R"({"questions":{"q":{"type":"noul"}}})");
    EXPECT_EQ(p.errors.size(), 2u);
}

TEST(Request, UsageErrors400) {
    std::string many = R"({"model":"m","state":"s","questions":{"q":{"type":"choice","criteria":{)";
    for (int i = 0; i < 256; ++i) many += std::string(i ? "," : "") + "\"o" + std::to_string(i) + "\":null";
    many += "}}}}";
    auto p = parse(many);
    ASSERT_FALSE(p.ok);
    EXPECT_EQ(p.errors[0].kind, RequestErrorKind::Usage);
    EXPECT_EQ(p.errors[0].message, "Too many choices. Must have at most 255 choices.");
    // 255 is fine.
    std::string ok = R"({"model":"m","state":"s","questions":{"q":{"type":"choice","criteria":{)";
    for (int i = 0; i < 255; ++i) ok += std::string(i ? "," : "") + "\"o" + std::to_string(i) + "\":null";
    ok += "}}}}";
    EXPECT_TRUE(parse(ok).ok);

    p = parse(R"({"model":"m","state":"s","questions":{"q":{"type":"score","criteria":[1,2,3,4,5,6,7,8,9,10,11]}}})");
    ASSERT_FALSE(p.ok);
    EXPECT_EQ(p.errors[0].message, "Too many score levels. Must have at most 10 levels.");
    EXPECT_TRUE(parse(R"({"model":"m","state":"s","questions":{"q":{"type":"score","criteria":[1]}}})").ok);

    p = parse(R"({"model":"m","state":"s","questions":{"q":{"type":"choice","criteria":{}}}})");
    ASSERT_FALSE(p.ok);
    EXPECT_EQ(p.errors[0].message, "q: criteria must not be empty");
    p = parse(R"({"model":"m","state":"s","questions":{"q":{"type":"score","criteria":[]}}})");
    EXPECT_EQ(p.errors[0].message, "q: criteria must not be empty");

    RequestLimits lim;
    lim.max_questions = 2;
    p = parse(R"({"model":"m","state":"s","questions":{"a":{"type":"noul"},"b":{"type":"noul"},"c":{"type":"noul"}}})", lim);
    ASSERT_FALSE(p.ok);
    EXPECT_EQ(p.errors[0].kind, RequestErrorKind::Usage);
    EXPECT_EQ(p.errors[0].message, "Too many questions. Must have at most 2 questions.");
}

TEST(Request, DescribeErrors) {
    auto p = parse(R"({"model":"m","state":"s","questions":{"rank_it":{"type":"rank"}}})");
    EXPECT_EQ(describe_errors(p.errors), "rank_it: type must be noul, choice, or score");
    p = parse(R"({"state":"s","questions":{"q":{"type":"noul"}}})");
    EXPECT_EQ(describe_errors(p.errors), "model: Field required");
}
