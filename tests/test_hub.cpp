// clef pull and --model ORG/NAME against a loopback fake Hub (tests/hub/fake_hub.py, written from the Hub's
// documented protocol): the standard cache layout, resumed downloads, checksum refusal, offline mode, the
// token, GGUF file selection, and a decision from a model fetched through the Hub. Expectations come from the
// fake Hub's own answers and from SHA-256 sums computed here (tests/support), never from what clef printed.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/sha256.h"
#include "test_util.h"
#include "util/json.h"

namespace {

namespace fs = std::filesystem;
using clef::JsonValue;
using clef::testing::read_file;
using clef::testing::ScratchDir;

const std::string kScript = std::string(CLEF_TEST_DATA) + "/../hub/fake_hub.py";

// The fake Hub as a child process; its log is one JSON object per request.
class FakeHub {
public:
    FakeHub(const std::vector<std::string>& args, std::string log) : log_(std::move(log)) {
        int fds[2];
        if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
        std::vector<std::string> argv_s = {"python3", kScript, "--log", log_};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        pid_ = ::fork();
        if (pid_ == 0) {
            ::dup2(fds[1], STDOUT_FILENO);
            ::close(fds[0]);
            ::close(fds[1]);
            std::vector<char*> argv;
            for (auto& a : argv_s) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execvp("python3", argv.data());
            ::_exit(127);
        }
        ::close(fds[1]);
        FILE* out = ::fdopen(fds[0], "r");
        char line[32] = {0};
        if (!std::fgets(line, sizeof line, out)) line[0] = 0;
        std::fclose(out);
        port_ = std::atoi(line);
        if (port_ <= 0) {
            stop();
            throw std::runtime_error("the fake Hub did not start");
        }
    }
    ~FakeHub() { stop(); }
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
    int port() const { return port_; }
    std::vector<JsonValue> requests() const {
        std::vector<JsonValue> out;
        if (!fs::exists(log_)) return out;
        std::istringstream lines(read_file(log_));
        for (std::string l; std::getline(lines, l);)
            out.push_back(clef::parse_json_or_throw(l, "fake hub log"));
        return out;
    }
    // The log's requests whose path starts with `prefix`.
    std::vector<JsonValue> requests_to(const std::string& prefix) const {
        std::vector<JsonValue> out;
        for (auto& r : requests())
            if (r.find("path")->as_string().rfind(prefix, 0) == 0) out.push_back(r);
        return out;
    }
    // The commit the fake Hub answers for `repo`@main.
    std::string commit(const std::string& repo) const {
        auto res = client().Get("/api/models/" + repo + "/revision/main");
        if (!res || res->status != 200) throw std::runtime_error("fake hub revision lookup failed");
        return clef::parse_json_or_throw(res->body, "revision").find("sha")->as_string();
    }
    // The ETag the fake Hub announces for a small (non-LFS) file.
    std::string etag(const std::string& repo, const std::string& path) const {
        auto res = client().Head("/" + repo + "/resolve/main/" + path);
        if (!res || res->status != 200) throw std::runtime_error("fake hub HEAD failed");
        std::string e = res->get_header_value("ETag");
        return e.substr(1, e.size() - 2);
    }

private:
    httplib::Client client() const { return httplib::Client("127.0.0.1", port_); }
    std::string log_;
    pid_t pid_ = -1;
    int port_ = 0;
};

struct Result {
    int code = -1;
    std::string out, err;
};

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
}

bool one_line(const std::string& s) {
    return !s.empty() && s.find('\n') == s.size() - 1;
}

std::vector<std::string> files_under(const fs::path& dir) {
    std::vector<std::string> out;
    if (!fs::exists(dir)) return out;
    for (auto& e : fs::recursive_directory_iterator(dir))
        if (!e.is_directory()) out.push_back(e.path().lexically_relative(dir).generic_string());
    std::sort(out.begin(), out.end());
    return out;
}

std::string random_bytes(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    return s;
}

class HubTest : public ::testing::Test {
protected:
    HubTest() : scratch_("clef_hub"), home_(scratch_.path() / "hf") {
        repo_ = scratch_.path() / "repo";
        fs::create_directories(repo_ / "assets");
        write(repo_ / "config.json", R"({"model_type": "test"})");
        write(repo_ / "tokenizer.json", R"({"version": "1.0"})");
        write(repo_ / "assets/vocab.txt", "a\nb\n");
        write(repo_ / "README.md", "# a model\n");
        write(repo_ / ".gitattributes", "*.safetensors filter=lfs\n");
        write(repo_ / "logo.png", "\x89PNG not really");
        weights_ = random_bytes(300000, 7);
        write(repo_ / "model.safetensors", weights_);
    }
    static void write(const fs::path& p, const std::string& bytes) {
        fs::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary) << bytes;
    }
    std::string log() const { return (scratch_.path() / "hub.log").string(); }
    // A request body of the tiny-clef fixture, as a file.
    std::string request() const {
        return scratch_.write("request.json",
                              clef::testing::tiny_cases().items()[0].find("request_body")->as_string());
    }
    fs::path model_root() const { return home_ / "hub" / "models--org--model"; }

    // Runs clef with a clean Hugging Face environment: HF_HOME in the scratch directory, HF_ENDPOINT
    // `endpoint`; `env`: more of env(1)'s options and NAME=VALUE assignments.
    Result clef(const std::string& args, const std::string& endpoint, const std::string& env = "") const {
        const std::string err = (scratch_.path() / "stderr").string();
        const std::string cmd = "env -u HF_TOKEN -u HF_TOKEN_PATH -u HF_HUB_CACHE -u HF_HUB_OFFLINE " + env +
                                " HF_HOME='" + home_.string() + "' HF_ENDPOINT='" + endpoint + "' '" +
                                CLEF_BINARY + "' " + args + " 2>'" + err + "'";
        Result r;
        int status = 0;
        r.out = clef::testing::run_command(cmd, status);
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.err = read_file(err);
        return r;
    }

    ScratchDir scratch_;
    fs::path home_, repo_;
    std::string weights_;
};

TEST_F(HubTest, FreshDownloadBuildsTheStandardCache) {
    FakeHub hub({"--repo", "org/model=" + repo_.string()}, log());
    const std::string commit = hub.commit("org/model");
    Result r = clef("pull org/model", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    const fs::path snap = model_root() / "snapshots" / commit;
    EXPECT_EQ(trim(r.out), snap.string());
    EXPECT_EQ(read_file((model_root() / "refs/main").string()), commit);

    // What a model needs, not the README, .gitattributes or pictures.
    EXPECT_EQ(files_under(snap), (std::vector<std::string>{"assets/vocab.txt", "config.json",
                                                           "model.safetensors", "tokenizer.json"}));
    // Blobs named by etag (SHA-256 for the LFS file), reached by relative symlinks.
    const std::string lfs = clef::sha256_hex(weights_);
    EXPECT_EQ(fs::read_symlink(snap / "model.safetensors").string(), "../../blobs/" + lfs);
    EXPECT_EQ(fs::read_symlink(snap / "config.json").string(),
              "../../blobs/" + hub.etag("org/model", "config.json"));
    EXPECT_EQ(fs::read_symlink(snap / "assets/vocab.txt").string(),
              "../../../blobs/" + hub.etag("org/model", "assets/vocab.txt"));
    EXPECT_EQ(read_file((snap / "model.safetensors").string()), weights_);
    EXPECT_EQ(read_file((snap / "assets/vocab.txt").string()), "a\nb\n");
    EXPECT_EQ(files_under(model_root() / "blobs").size(), 4u);  // no .incomplete left
    // The LFS bytes came from the CDN path the resolve URL redirected to.
    ASSERT_EQ(hub.requests_to("/cdn/").size(), 1u);

    // A second pull asks for the commit again and fetches nothing.
    const size_t before = hub.requests().size();
    r = clef("pull org/model", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto after = hub.requests();
    ASSERT_EQ(after.size(), before + 1);
    EXPECT_EQ(after.back().find("path")->as_string(), "/api/models/org/model/revision/main");
}

TEST_F(HubTest, ResumesACutTransferWithARange) {
    FakeHub hub({"--repo", "org/model=" + repo_.string(), "--drop", "model.safetensors:1"}, log());
    Result r = clef("pull org/model", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto cdn = hub.requests_to("/cdn/");
    ASSERT_EQ(cdn.size(), 2u);
    EXPECT_TRUE(cdn[0].find("range")->is_null());
    // The fake Hub sent half the file before cutting the connection: the retry asks for the rest.
    EXPECT_EQ(cdn[1].find("range")->as_string(), "bytes=" + std::to_string(weights_.size() / 2) + "-");
    const fs::path snap = model_root() / "snapshots" / hub.commit("org/model");
    EXPECT_EQ(read_file((snap / "model.safetensors").string()), weights_);
}

TEST_F(HubTest, ResumesThePartialFileOfAnEarlierRun) {
    const std::string blob = (model_root() / "blobs" / clef::sha256_hex(weights_)).string();
    uint64_t partial = 0;
    {
        FakeHub hub({"--repo", "org/model=" + repo_.string(), "--drop", "model.safetensors:100"}, log());
        Result r = clef("pull org/model", hub.endpoint());
        EXPECT_EQ(r.code, 2);
        EXPECT_TRUE(one_line(r.err)) << r.err;
        EXPECT_NE(r.err.find("run the command again to resume"), std::string::npos) << r.err;
        ASSERT_TRUE(fs::exists(blob + ".incomplete"));
        EXPECT_FALSE(fs::exists(blob));
        EXPECT_FALSE(fs::exists(model_root() / "refs/main"));
        partial = fs::file_size(blob + ".incomplete");
        EXPECT_GT(partial, 0u);
        EXPECT_LT(partial, weights_.size());
        EXPECT_EQ(read_file(blob + ".incomplete"), weights_.substr(0, partial));
    }
    fs::remove(log());
    FakeHub hub({"--repo", "org/model=" + repo_.string()}, log());
    Result r = clef("pull org/model", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto cdn = hub.requests_to("/cdn/");
    ASSERT_EQ(cdn.size(), 1u);
    EXPECT_EQ(cdn[0].find("range")->as_string(), "bytes=" + std::to_string(partial) + "-");
    EXPECT_EQ(read_file(blob), weights_);
    EXPECT_FALSE(fs::exists(blob + ".incomplete"));
}

TEST_F(HubTest, RefusesAFileWhoseChecksumDiffers) {
    FakeHub hub({"--repo", "org/model=" + repo_.string(), "--corrupt", "model.safetensors"}, log());
    Result r = clef("pull org/model --file model.safetensors", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(clef::sha256_hex(weights_)), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
    EXPECT_EQ(files_under(model_root() / "blobs"), std::vector<std::string>{});
    EXPECT_EQ(files_under(model_root() / "snapshots"), std::vector<std::string>{});
}

TEST_F(HubTest, OfflineModeUsesTheCacheAlone) {
    std::string online_path;
    {
        FakeHub hub({"--repo", "org/model=" + repo_.string()}, log());
        Result r = clef("pull org/model", hub.endpoint());
        ASSERT_EQ(r.code, 0) << r.err;
        online_path = trim(r.out);
    }
    // The fake Hub is gone: offline, the ref and the snapshot are enough.
    Result r = clef("pull org/model", "http://127.0.0.1:9", "HF_HUB_OFFLINE=1");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(trim(r.out), online_path);
    // Online with the Hub gone: a clear error that names the way out.
    r = clef("pull org/model", "http://127.0.0.1:9");
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("cannot reach http://127.0.0.1:9"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("HF_HUB_OFFLINE=1"), std::string::npos) << r.err;
}

TEST_F(HubTest, OfflineWithAnEmptyCacheFailsClearly) {
    Result r = clef("pull org/model", "http://127.0.0.1:9", "HF_HUB_OFFLINE=1");
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("org/model@main is not in the Hugging Face cache"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("HF_HUB_OFFLINE"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
}

TEST_F(HubTest, SendsTheTokenToTheHubButNotToAnotherHost) {
    // The CDN redirects name "localhost": another origin than the endpoint's 127.0.0.1.
    FakeHub hub({"--repo", "org/model=" + repo_.string(), "--token", "s3cret", "--cdn-host", "localhost"},
                log());
    Result r = clef("pull org/model", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("HTTP 401"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("HF_TOKEN"), std::string::npos) << r.err;

    fs::remove(log());
    r = clef("pull org/model", hub.endpoint(), "HF_TOKEN=s3cret");
    ASSERT_EQ(r.code, 0) << r.err;
    size_t to_hub = 0, to_cdn = 0;
    for (const auto& q : hub.requests()) {
        const bool cdn = q.find("path")->as_string().rfind("/cdn/", 0) == 0;
        if (cdn) {
            ++to_cdn;
            EXPECT_TRUE(q.find("authorization")->is_null());
        } else {
            ++to_hub;
            ASSERT_TRUE(q.find("authorization")->is_string());
            EXPECT_EQ(q.find("authorization")->as_string(), "Bearer s3cret");
        }
    }
    EXPECT_EQ(to_cdn, 1u);
    EXPECT_EQ(to_hub, 8u) << read_file(log());  // the revision, a HEAD per file, a GET per small file
}

TEST_F(HubTest, ReadsTheTokenFileOfHfHome) {
    FakeHub hub({"--repo", "org/model=" + repo_.string(), "--token", "from-file"}, log());
    write(home_ / "token", "from-file\n");
    Result r = clef("pull org/model --file config.json", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(hub.requests().back().find("authorization")->as_string(), "Bearer from-file");
}

TEST_F(HubTest, GgufRepositoriesNeedAFileChoice) {
    const fs::path gguf = scratch_.path() / "gguf";
    write(gguf / "m-Q4_K_M.gguf", random_bytes(5000, 1));
    write(gguf / "m-Q8_0.gguf", random_bytes(6000, 2));
    write(gguf / "mmproj-m-f16.gguf", random_bytes(7000, 3));
    write(gguf / "README.md", "# gguf\n");
    FakeHub hub({"--repo", "org/gguf=" + gguf.string()}, log());
    const fs::path snap = home_ / "hub/models--org--gguf/snapshots" / hub.commit("org/gguf");

    Result r = clef("pull org/gguf", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find("--file"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("m-Q4_K_M.gguf, m-Q8_0.gguf"), std::string::npos) << r.err;

    r = clef("pull org/gguf --file '*Q4_K_M.gguf'", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(trim(r.out), (snap / "m-Q4_K_M.gguf").string());
    EXPECT_EQ(files_under(snap), std::vector<std::string>{"m-Q4_K_M.gguf"});

    r = clef("pull org/gguf --file '*Q4_K_M.gguf' --file '*mmproj*'", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(trim(r.out), (snap / "m-Q4_K_M.gguf").string());
    EXPECT_EQ(files_under(snap), (std::vector<std::string>{"m-Q4_K_M.gguf", "mmproj-m-f16.gguf"}));
    EXPECT_EQ(read_file((snap / "mmproj-m-f16.gguf").string()), random_bytes(7000, 3));

    r = clef("pull org/gguf --file '*IQ1_S.gguf'", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--file '*IQ1_S.gguf' matches no file of org/gguf@main"), std::string::npos)
        << r.err;

    // --model takes the chosen file (here no real GGUF: the loader's error names the cached file).
    r = clef("decide --model org/gguf --file '*Q8_0.gguf' '" + request() + "'", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(one_line(r.err)) << r.err;
    EXPECT_NE(r.err.find((snap / "m-Q8_0.gguf").string()), std::string::npos) << r.err;
}

TEST_F(HubTest, RejectsWhatIsNoHubRepository) {
    FakeHub hub({"--repo", "org/model=" + repo_.string()}, log());
    Result r = clef("pull org/missing", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("org/missing@main: HTTP 404"), std::string::npos) << r.err;
    r = clef("pull org/model@v9", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("org/model@v9: HTTP 404: revision not found"), std::string::npos) << r.err;
    r = clef("pull ../etc", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("expected ORG/NAME[@REVISION]"), std::string::npos) << r.err;
    const size_t asked = hub.requests().size();
    r = clef("pull org/model@../../x", hub.endpoint());
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("expected ORG/NAME[@REVISION]"), std::string::npos) << r.err;
    EXPECT_EQ(hub.requests().size(), asked);
}

// A decision from a model fetched through the Hub equals one from the same files on disk, and a local path
// that exists wins over the Hub id of the same spelling.
TEST_F(HubTest, ModelOptionFetchesAndDecides) {
    const fs::path tiny(clef::testing::data_path("tiny-clef"));
    const fs::path repo = scratch_.path() / "tiny";
    fs::create_directories(repo);
    for (const char* f :
         {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
          "joint_head.safetensors", "joint_head_config.json", "processor_config.json", "README.md"})
        fs::create_symlink(tiny / f, repo / f);
    const std::string request = this->request();

    int status = 0;
    const std::string want = clef::testing::run_command(
        std::string("'") + CLEF_BINARY + "' decide --model '" + tiny.string() + "' '" + request + "'",
        status);
    ASSERT_EQ(WEXITSTATUS(status), 0);

    FakeHub hub({"--repo", "org/tiny-clef=" + repo.string()}, log());
    Result r = clef("decide --model org/tiny-clef '" + request + "'", hub.endpoint());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, want);
    EXPECT_EQ(hub.requests_to("/cdn/").size(), 2u);  // the two safetensors files

    // A directory named org/tiny-clef in the working directory is used as it is, with the Hub unreachable.
    fs::create_directories(scratch_.path() / "cwd/org");
    fs::create_directory_symlink(tiny, scratch_.path() / "cwd/org/tiny-clef");
    r = clef("decide --model org/tiny-clef '" + request + "'", "http://127.0.0.1:9",
             "--chdir='" + (scratch_.path() / "cwd").string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, want);
}

}  // namespace
