// clef tokenize --tokenizer PATH
// Reads JSON lines {"text": "..."} on stdin and writes one {"ids":[...]} line per input, in order.
// PATH: a tokenizer.json, a model directory holding one, or a .gguf file. A bad input line stops the run with
// clef::Error("stdin line N: ...") (exit status 2 from main); the lines before it have already been written.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace clef {

namespace {

struct TokenizeOptions {
    std::string tokenizer;
    bool no_normalize = false;
    bool no_parse_special = false;
};

void run_tokenize(const TokenizeOptions& o) {
    const Tokenizer tok = Tokenizer::load(o.tokenizer);
    EncodeOptions enc;
    enc.normalize = !o.no_normalize;
    enc.parse_special = !o.no_parse_special;

    std::ios::sync_with_stdio(false);
    std::string line, out;
    std::vector<int32_t> ids;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
        ++line_no;
        const std::string where = "stdin line " + std::to_string(line_no) + ": ";
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            std::fflush(stdout);
            // Keep the parser's diagnosis but not its echo of the input (which may be invalid UTF-8).
            std::string why = e.what();
            if (const size_t cut = why.find("; last read"); cut != std::string::npos) why.resize(cut);
            if (const size_t tag = why.find("] ");
                why.rfind("[json.exception", 0) == 0 && tag != std::string::npos)
                why.erase(0, tag + 2);
            throw Error(where + "not valid JSON: " + why);
        }
        const auto it = j.is_object() ? j.find("text") : j.end();
        if (!j.is_object() || it == j.end() || !it->is_string()) {
            std::fflush(stdout);
            throw Error(where + "expected a JSON object with a string \"text\"");
        }
        ids.clear();
        tok.encode(it->get_ref<const std::string&>(), enc, ids);
        out.assign("{\"ids\":[");
        for (size_t i = 0; i < ids.size(); ++i) {
            if (i) out.push_back(',');
            out.append(std::to_string(ids[i]));
        }
        out.append("]}\n");
        std::fwrite(out.data(), 1, out.size(), stdout);
    }
    if (std::cin.bad()) throw Error("stdin: read error");
    std::fflush(stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
    auto opts = std::make_shared<TokenizeOptions>();
    CLI::App* cmd = app.add_subcommand(
        "tokenize",
        "Tokenize JSON lines {\"text\": ...} from stdin into {\"ids\": [...]} lines (no BOS/EOS)");
    cmd->add_option("--tokenizer", opts->tokenizer,
                    "tokenizer.json, a model directory holding it, or a .gguf file")
        ->required();
    cmd->add_flag("--no-normalize", opts->no_normalize, "skip NFC (llama.cpp behaviour)");
    cmd->add_flag("--no-parse-special", opts->no_parse_special,
                  "treat special/control token text as plain text (llama.cpp parse_special=false)");
    cmd->callback([opts] { run_tokenize(*opts); });
}

}  // namespace clef
