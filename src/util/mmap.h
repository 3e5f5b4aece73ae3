// Read-only memory-mapped files (POSIX mmap). Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace clef {

class MappedFile {
public:
    MappedFile() = default;
    // Throws clef::Error naming the path when the file cannot be opened or mapped.
    static MappedFile open(const std::string& path);
    ~MappedFile();
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const unsigned char* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    const unsigned char* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Releases the whole pages inside [p, p + bytes) of a read-only file mapping from this process's resident set
// (madvise MADV_DONTNEED; they are re-read from the file if used again). Advice only: on failure the pages
// simply stay resident.
void drop_mapped_pages(const void* p, size_t bytes);

// The size of a file in bytes; throws clef::Error naming the path when it cannot be read.
uint64_t file_bytes(const std::string& path);

}  // namespace clef
