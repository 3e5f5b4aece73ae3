// clef batch: one System One request body per line of --in, one response per line of --out in the same order.
// A bad line gets its error body ({"detail": ...}, as the server would answer) on its line. Requests that
// share a state run back to back so the state cache resumes it. Resumable: lines already complete in --out
// are kept and skipped; a partial last line is rewritten.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "decision/engine.h"
#include "decision/prompt.h"
#include "decision/response.h"
#include "image/image.h"
#include "util/error.h"
#include "util/json.h"

namespace clef {

namespace {

struct BatchArgs {
    std::string model, in, out;
    LoadArgs load;
    DecisionArgs decision;
};

// The complete lines already in `out` (each ends with '\n' and is JSON); the file is cut after them.
size_t keep_complete_lines(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return 0;
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t done = 0, end = 0;
    for (size_t at = 0; at < text.size();) {
        const size_t nl = text.find('\n', at);
        if (nl == std::string::npos) break;
        JsonValue v;
        JsonParseError err;
        if (!parse_json(std::string_view(text).substr(at, nl - at), v, err)) break;
        ++done;
        at = end = nl + 1;
    }
    f.close();
    std::error_code ec;
    std::filesystem::resize_file(path, end, ec);
    if (ec) throw Error(path + ": cannot truncate: " + ec.message());
    return done;
}

LineResult failed(JsonValue body) {
    LineResult r;
    r.body = std::move(body);
    r.error = true;
    return r;
}

LineResult run_line(const Engine& engine, const std::string& line, const DecideOptions& opt) {
    JsonValue body;
    JsonParseError perr;
    if (!parse_json(line, body, perr))
        return failed(error_detail(
            "api_usage_error", "invalid JSON at byte " + std::to_string(perr.offset) + ": " + perr.message));
    LineResult r;
    std::vector<RequestError> errors;
    if (!parse_request(body, r.request, errors)) return failed(request_error_response(errors).second);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        r.decision = engine.decide(r.request, opt);
    } catch (const PromptTooLong& e) {
        return failed(error_detail("max_tokens_exceeded", e.what()));
    } catch (const ImageError& e) {
        return failed(error_detail("api_usage_error", e.what()));
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.body = std::move(r.decision.response);
    r.tokens = static_cast<int64_t>(r.decision.prompt.input_ids.size());
    return r;
}

// The order to run lines in: lines whose request has the same state back to back (first appearance order).
std::vector<size_t> grouped_order(const std::vector<std::string>& lines, size_t first) {
    std::map<std::string, std::vector<size_t>> groups;
    std::vector<std::string> order;
    for (size_t i = first; i < lines.size(); ++i) {
        JsonValue v;
        JsonParseError err;
        std::string key = "#" + std::to_string(i);  // unparsable lines stand alone
        if (parse_json(lines[i], v, err) && v.is_object() && v.find("state"))
            key = write_json(*v.find("state")) + (v.find("images") ? write_json(*v.find("images")) : "");
        auto [it, fresh] = groups.try_emplace(key);
        if (fresh) order.push_back(key);
        it->second.push_back(i);
    }
    std::vector<size_t> out;
    for (const std::string& k : order) out.insert(out.end(), groups[k].begin(), groups[k].end());
    return out;
}

void progress(size_t done, size_t total, double seconds) {
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
    const int width = 30, fill = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu  %.1f decisions/s  ETA %.0f s ", std::string(fill, '#').c_str(),
                 std::string(width - fill, ' ').c_str(), done, total, rate, eta);
}

void run_batch(const BatchArgs& a) {
    const DecideOptions opt = a.decision.options();
    const std::vector<std::string> lines = read_lines(a.in);
    const size_t skipped = std::min(keep_complete_lines(a.out), lines.size());
    std::unique_ptr<Engine> engine = Engine::load(
        a.model, a.load.head, a.load.options(opt.backbone.precision, default_state_cache_bytes()));
    std::ofstream out(a.out, std::ios::binary | std::ios::app);
    if (!out) throw Error(a.out + ": cannot open for writing");

    size_t errors = 0;
    int64_t tokens = 0;
    const double s = run_request_lines(*engine, lines, skipped, opt, [&](size_t, LineResult& r) {
        out << write_json(r.body) << '\n' << std::flush;
        errors += r.error;
        tokens += r.tokens;
    });
    const size_t done = lines.size() - skipped;
    const StateCacheStats c = engine->state_cache_stats();
    std::fprintf(
        stderr,
        "clef batch: %zu lines: %zu answered, %zu errors, %zu skipped (already in %s); %.2f decisions/s, "
        "%.0f tokens/s; state cache: %llu hits of %llu, %llu tokens reused\n",
        lines.size(), done - errors, errors, skipped, a.out.c_str(), s > 0 ? done / s : 0.0,
        s > 0 ? static_cast<double>(tokens) / s : 0.0, static_cast<unsigned long long>(c.hits),
        static_cast<unsigned long long>(c.lookups), static_cast<unsigned long long>(c.tokens_reused));
}

}  // namespace

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    std::vector<std::string> lines;
    for (std::string line; std::getline(f, line);) lines.push_back(line);
    return lines;
}

double run_request_lines(const Engine& engine, const std::vector<std::string>& lines, size_t first,
                         const DecideOptions& opt, const std::function<void(size_t, LineResult&)>& done) {
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&t0] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const bool tty = isatty(STDERR_FILENO);
    std::map<size_t, LineResult> ready;  // finished, waiting for the lines before them
    size_t next = first, finished = 0;
    for (size_t i : grouped_order(lines, first)) {
        ready[i] = run_line(engine, lines[i], opt);
        for (auto it = ready.find(next); it != ready.end(); it = ready.find(next)) {
            done(next, it->second);
            ready.erase(it);
            ++next;
        }
        ++finished;
        if (tty) progress(finished, lines.size() - first, elapsed());
    }
    if (tty) std::fprintf(stderr, "\n");
    return elapsed();
}

void add_batch_command(CLI::App& app) {
    auto args = std::make_shared<BatchArgs>();
    CLI::App* cmd = app.add_subcommand(
        "batch", "Answer one System One request per line of a JSONL file, one response per line (resumable)");
    cmd->add_option("--model", args->model, "Model directory (publisher layout) or GGUF file")->required();
    add_load_options(cmd, args->load);
    cmd->add_option("--in", args->in, "Requests, one JSON body per line")->required();
    cmd->add_option("--out", args->out, "Responses, one per line (lines already complete are kept)")
        ->required();
    add_decision_options(cmd, args->decision);
    cmd->callback([args] { run_batch(*args); });
}

}  // namespace clef
