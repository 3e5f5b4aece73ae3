#include "hub/hub.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "hub/cache.h"
#include "hub/http.h"
#include "hub/progress.h"
#include "hub/select.h"
#include "hub/sha256.h"
#include "util/error.h"
#include "util/json.h"
#include "util/text.h"

namespace clef::hub {

namespace fs = std::filesystem;

namespace {

constexpr int kAttempts = 3;  // per file and run, when a transfer breaks off

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

// huggingface_hub's reading of a boolean variable.
bool env_true(const char* name) {
    const std::string v = ascii_lower(env(name));
    return v == "1" || v == "on" || v == "yes" || v == "true";
}

std::string first_line(const std::string& path) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    return line;
}

// An org or repository name: letters, digits, '-', '_', '.', not starting or ending with '-' or '.', no "--"
// or ".." (the Hub's rule), at most 96 characters.
bool valid_name(std::string_view s) {
    if (s.empty() || s.size() > 96) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
    const auto edge = [](char c) { return c == '-' || c == '.'; };
    return !edge(s.front()) && !edge(s.back()) && s.find("--") == std::string_view::npos &&
           s.find("..") == std::string_view::npos;
}

// A branch, tag or commit: also the name of a file under refs/, so no empty, `.` or `..` parts.
bool valid_revision(const std::string& r) {
    if (r.size() > 255 || !is_safe_repo_path(r)) return false;
    for (char c : r)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != '/')
            return false;
    return true;
}

// Etags name blobs: a plain file name.
bool valid_etag(const std::string& e) {
    if (e.empty() || e.size() > 128 || e[0] == '.') return false;
    for (char c : e)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
    return true;
}

struct RepoInfo {
    std::string commit;
    std::vector<std::string> files;
};

// GET /api/models/<repo>/revision/<revision>: {"sha": commit, "siblings": [{"rfilename": path}, ...]}.
RepoInfo repo_info(HubHttp& http, const RepoId& id) {
    const std::string body =
        http.get("/api/models/" + id.repo + "/revision/" + percent_encode(id.revision, false), id.label());
    const JsonValue doc = parse_json_or_throw(body, id.label() + ": the Hub's revision answer");
    const JsonValue* sha = doc.is_object() ? doc.find("sha") : nullptr;
    const JsonValue* siblings = doc.is_object() ? doc.find("siblings") : nullptr;
    if (!sha || !sha->is_string() || !is_commit(sha->as_string()) || !siblings || !siblings->is_array())
        throw Error(id.label() + ": the Hub's revision answer has no commit sha and siblings list");
    RepoInfo info{sha->as_string(), {}};
    for (const auto& s : siblings->items()) {
        const JsonValue* name = s.is_object() ? s.find("rfilename") : nullptr;
        if (!name || !name->is_string()) throw Error(id.label() + ": a sibling without rfilename");
        if (!is_safe_repo_path(name->as_string()))
            throw Error(id.label() + ": refusing the repository path '" + name->as_string() + "'");
        info.files.push_back(name->as_string());
    }
    return info;
}

Snapshot make_snapshot(const RepoCache& cache, const std::string& commit, std::vector<std::string> files) {
    Snapshot s;
    s.dir = cache.snapshot_dir(commit);
    s.commit = commit;
    for (const auto& f : files)
        if (is_gguf(f)) (is_mmproj(f) ? s.mmprojs : s.ggufs).push_back(s.dir + "/" + f);
    s.files = std::move(files);
    return s;
}

uint64_t size_of(const std::string& path) {
    std::error_code ec;
    const uint64_t n = fs::file_size(path, ec);
    return ec ? 0 : n;
}

// The size the Hub announced and, for LFS files (a SHA-256 etag), the checksum. A mismatch deletes the file.
void verify(const std::string& part, const FileInfo& info, const std::string& what) {
    const uint64_t got = size_of(part);
    std::string problem;
    if (info.size_known && got != info.size) {
        problem = "size mismatch: " + std::to_string(got) + " bytes, the Hub announced " +
                  std::to_string(info.size);
    } else if (is_sha256_hex(info.etag)) {
        const std::string sum = sha256_file(part);
        if (sum != info.etag)
            problem = "checksum mismatch: SHA-256 " + sum + ", the Hub announced " + info.etag;
    }
    if (problem.empty()) return;
    std::error_code ec;
    fs::remove(part, ec);
    throw Error(what + ": " + problem + "; the download was deleted");
}

// Fetches the file's bytes into `part`, resuming from what is there, with up to kAttempts tries.
void download_part(HubHttp& http, const FileInfo& info, const std::string& part, const std::string& what,
                   const std::string& label, bool progress) {
    for (int attempt = 1;; ++attempt) {
        const uint64_t have = size_of(part);
        ProgressBar bar(label, info.size_known ? info.size : 0, have, progress);
        std::string reason;
        const auto outcome = http.download(
            info.location, part, have, [&bar](uint64_t n) { bar.update(n); }, what, reason);
        bar.finish(size_of(part));
        if (outcome == HubHttp::Outcome::Done) return;
        if (attempt == kAttempts)
            throw Error(what + ": the transfer broke off (" + reason + ") with " +
                        format_bytes(size_of(part)) + " fetched; run the command again to resume");
        std::this_thread::sleep_for(std::chrono::seconds(attempt));
    }
}

// blobs/<etag>: fetched, checked and moved into place, unless it is there already (another revision, run or
// tool fetched it).
void ensure_blob(HubHttp& http, const RepoCache& cache, const FileInfo& info, const std::string& what,
                 const std::string& label, bool progress) {
    const std::string blob = cache.blob(info.etag);
    std::error_code ec;
    if (fs::exists(blob, ec)) return;
    RepoCache::Lock lock(cache.lock_path(info.etag));  // another process may be fetching the same blob
    if (fs::exists(blob, ec)) return;
    fs::create_directories(fs::path(blob).parent_path(), ec);
    const std::string part = cache.incomplete(info.etag);
    download_part(http, info, part, what, label, progress);
    verify(part, info, what);
    fs::rename(part, blob, ec);
    if (ec) throw Error(blob + ": cannot move the download into place: " + ec.message());
}

void fetch_file(HubHttp& http, const RepoCache& cache, const RepoId& id, const std::string& commit,
                const std::string& path, const std::string& label, bool progress) {
    if (cache.has_file(commit, path)) return;
    const std::string what = id.repo + ": " + path;
    const FileInfo info =
        http.file_info("/" + id.repo + "/resolve/" + commit + "/" + percent_encode(path, true), what);
    if (!info.commit.empty() && info.commit != commit)
        throw Error(what + ": the Hub answered for commit " + info.commit + " instead of " + commit);
    if (!valid_etag(info.etag)) throw Error(what + ": unusable ETag '" + info.etag + "'");
    ensure_blob(http, cache, info, what, label, progress);
    cache.link(commit, path, info.etag);
}

Snapshot from_cache(const RepoId& id, const std::vector<std::string>& patterns, const RepoCache& cache) {
    const std::string commit = is_commit(id.revision) ? id.revision : cache.read_ref(id.revision);
    std::error_code ec;
    if (commit.empty() || !fs::is_directory(cache.snapshot_dir(commit), ec))
        throw Error(id.label() + " is not in the Hugging Face cache (" + cache.root() +
                    ") and HF_HUB_OFFLINE is set: fetch it first with network access (clef pull " +
                    id.label() + ")");
    return make_snapshot(cache, commit, select_files(cache.snapshot_files(commit), patterns, id.label()));
}

}  // namespace

bool parse_repo_id(std::string_view text, RepoId& out) {
    const size_t at = text.find('@');
    const std::string_view repo = text.substr(0, at);
    const size_t slash = repo.find('/');
    if (slash == std::string_view::npos || !valid_name(repo.substr(0, slash)) ||
        !valid_name(repo.substr(slash + 1)))
        return false;
    RepoId id{std::string(repo), "main"};
    if (at != std::string_view::npos) {
        id.revision = std::string(text.substr(at + 1));
        if (!valid_revision(id.revision)) return false;
    }
    out = std::move(id);
    return true;
}

Settings Settings::from_environment() {
    Settings s;
    if (!env("HF_ENDPOINT").empty()) s.endpoint = env("HF_ENDPOINT");
    // huggingface_hub's defaults: HF_HOME = $XDG_CACHE_HOME/huggingface = ~/.cache/huggingface.
    std::string home = env("HF_HOME");
    if (home.empty())
        home = (env("XDG_CACHE_HOME").empty() ? env("HOME") + "/.cache" : env("XDG_CACHE_HOME")) +
               "/huggingface";
    s.cache_dir = env("HF_HUB_CACHE").empty() ? home + "/hub" : env("HF_HUB_CACHE");
    s.token = env("HF_TOKEN");
    if (s.token.empty())
        s.token = first_line(env("HF_TOKEN_PATH").empty() ? home + "/token" : env("HF_TOKEN_PATH"));
    s.offline = env_true("HF_HUB_OFFLINE");
    s.progress = ::isatty(STDERR_FILENO) == 1;
    return s;
}

std::string Snapshot::model_path() const {
    if (ggufs.size() > 1)
        throw Error("the selection holds several GGUF model files (" + ggufs[0] + ", " + ggufs[1] +
                    "...): choose one with --file PATTERN");
    return ggufs.empty() ? dir : ggufs[0];
}

std::string Snapshot::mmproj_path() const {
    if (mmprojs.size() > 1)
        throw Error("the selection holds several mmproj files: choose one with --file PATTERN");
    return mmprojs.empty() ? std::string() : mmprojs[0];
}

Snapshot fetch(const RepoId& id, const std::vector<std::string>& patterns, const Settings& settings) {
    if (settings.cache_dir.empty())
        throw Error("no Hugging Face cache directory: set HF_HOME or HF_HUB_CACHE");
    const RepoCache cache(settings.cache_dir, id.repo);
    if (settings.offline) return from_cache(id, patterns, cache);
    HubHttp http(settings.endpoint, settings.token);
    const RepoInfo info = repo_info(http, id);
    Snapshot snap = make_snapshot(cache, info.commit, select_files(info.files, patterns, id.label()));
    for (size_t i = 0; i < snap.files.size(); ++i) {
        std::string label = std::to_string(i + 1);  // "[3/9] model.safetensors"
        label.insert(0, 1, '[');
        label += '/' + std::to_string(snap.files.size()) + "] " + snap.files[i];
        fetch_file(http, cache, id, info.commit, snap.files[i], label, settings.progress);
    }
    if (id.revision != info.commit) cache.write_ref(id.revision, info.commit);
    return snap;
}

}  // namespace clef::hub
