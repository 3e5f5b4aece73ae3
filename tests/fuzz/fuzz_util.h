// Shared helpers for the libFuzzer targets: the fuzz input as a file (the parsers under test take paths) and
// the test data directory.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace clef::fuzz {

// An anonymous in-memory file (memfd) holding the input, reachable as /proc/self/fd/N. Closed on destruction.
class MemFile {
public:
    MemFile(const uint8_t* data, size_t size) {
        fd_ = ::memfd_create("clef-fuzz", MFD_CLOEXEC);
        if (fd_ < 0) std::abort();
        size_t done = 0;
        while (done < size) {
            ssize_t n = ::write(fd_, data + done, size - done);
            if (n <= 0) std::abort();
            done += static_cast<size_t>(n);
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    ~MemFile() { ::close(fd_); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

// tests/data, or $CLEF_TEST_DATA when set.
inline std::string test_data() {
    const char* env = std::getenv("CLEF_TEST_DATA");
    return env && *env ? env : CLEF_FUZZ_DATA;
}

}  // namespace clef::fuzz
