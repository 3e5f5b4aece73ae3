#include "hub/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "util/error.h"

namespace clef::hub {

namespace fs = std::filesystem;

namespace {

void make_dirs(const fs::path& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot create the directory: " + ec.message());
}

std::string folder_name(const std::string& repo) {
    std::string out = "models--";
    for (char c : repo) out += c == '/' ? std::string("--") : std::string(1, c);
    return out;
}

}  // namespace

bool is_commit(const std::string& s) {
    return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

RepoCache::RepoCache(const std::string& cache_dir, const std::string& repo)
    : cache_dir_(cache_dir), folder_(folder_name(repo)), root_((fs::path(cache_dir) / folder_).string()) {}

std::string RepoCache::blob(const std::string& etag) const {
    return (fs::path(root_) / "blobs" / etag).string();
}

std::string RepoCache::snapshot_dir(const std::string& commit) const {
    return (fs::path(root_) / "snapshots" / commit).string();
}

bool RepoCache::has_file(const std::string& commit, const std::string& path) const {
    std::error_code ec;
    return fs::is_regular_file(fs::path(snapshot_dir(commit)) / path, ec);
}

std::string RepoCache::read_ref(const std::string& revision) const {
    std::ifstream f(fs::path(root_) / "refs" / revision);
    std::string commit;
    if (!f || !std::getline(f, commit)) return {};
    while (!commit.empty() && (commit.back() == '\r' || commit.back() == ' ')) commit.pop_back();
    return is_commit(commit) ? commit : std::string();
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
    const fs::path ref = fs::path(root_) / "refs" / revision;
    make_dirs(ref.parent_path());
    const fs::path tmp = ref.string() + ".tmp" + std::to_string(::getpid());
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << commit;
        if (!f) throw Error(tmp.string() + ": cannot write");
    }
    std::error_code ec;
    fs::rename(tmp, ref, ec);
    if (ec) throw Error(ref.string() + ": cannot write: " + ec.message());
}

void RepoCache::link(const std::string& commit, const std::string& path, const std::string& etag) const {
    const fs::path file = fs::path(snapshot_dir(commit)) / path;
    make_dirs(file.parent_path());
    // From snapshots/<commit>/<dir...>/ back up to the repository folder, then into blobs/.
    std::string target;
    for (size_t i = 0, n = 2 + static_cast<size_t>(std::count(path.begin(), path.end(), '/')); i < n; ++i)
        target += "../";
    target += "blobs/" + etag;
    std::error_code ec;
    fs::remove(file, ec);
    fs::create_symlink(target, file, ec);
    if (ec) throw Error(file.string() + ": cannot create the link to the blob: " + ec.message());
}

std::vector<std::string> RepoCache::snapshot_files(const std::string& commit) const {
    std::vector<std::string> out;
    const fs::path dir(snapshot_dir(commit));
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (fs::is_regular_file(it->path(), ec))
            out.push_back(it->path().lexically_relative(dir).generic_string());
    std::sort(out.begin(), out.end());
    return out;
}

std::string RepoCache::lock_path(const std::string& etag) const {
    return (fs::path(cache_dir_) / ".locks" / folder_ / (etag + ".lock")).string();
}

RepoCache::Lock::Lock(const std::string& path) {
    make_dirs(fs::path(path).parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot open the lock file: " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0)
        if (errno != EINTR) throw Error(path + ": cannot lock: " + std::strerror(errno));
}

RepoCache::Lock::~Lock() {
    if (fd_ >= 0) ::close(fd_);
}

}  // namespace clef::hub
