// One repository in the Hugging Face cache, in the layout every Hub client shares (docs/HUB.md):
//   <cache>/models--<org>--<name>/blobs/<etag>            the files' bytes, named by their etag
//                                 refs/<revision>          the commit a branch or tag was last resolved to
//                                 snapshots/<commit>/<path> -> ../../blobs/<etag> (relative symlinks)
//   <cache>/.locks/models--<org>--<name>/<etag>.lock      flock(2)ed while a blob is being fetched
#pragma once

#include <string>
#include <vector>

namespace clef::hub {

class RepoCache {
public:
    RepoCache(const std::string& cache_dir, const std::string& repo);

    const std::string& root() const { return root_; }
    std::string blob(const std::string& etag) const;
    std::string incomplete(const std::string& etag) const { return blob(etag) + ".incomplete"; }
    std::string snapshot_dir(const std::string& commit) const;
    // Whether snapshots/<commit>/<path> exists and leads to a file.
    bool has_file(const std::string& commit, const std::string& path) const;
    // The commit refs/<revision> holds, "" when there is none.
    std::string read_ref(const std::string& revision) const;
    void write_ref(const std::string& revision, const std::string& commit) const;
    // snapshots/<commit>/<path> -> the blob, replacing what was there.
    void link(const std::string& commit, const std::string& path, const std::string& etag) const;
    // The repository paths of a snapshot's files (symlinks to present blobs), sorted.
    std::vector<std::string> snapshot_files(const std::string& commit) const;

    // An exclusive lock on one blob, across processes (and huggingface_hub's own lock files).
    class Lock {
    public:
        explicit Lock(const std::string& path);
        ~Lock();
        Lock(const Lock&) = delete;
        Lock& operator=(const Lock&) = delete;

    private:
        int fd_ = -1;
    };
    std::string lock_path(const std::string& etag) const;

private:
    std::string cache_dir_, folder_, root_;
};

// 40 lower-case hex digits: a git commit id.
bool is_commit(const std::string& s);

}  // namespace clef::hub
