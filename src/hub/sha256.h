// SHA-256 of a file, with OpenSSL's EVP interface: a Hub LFS file's etag is the SHA-256 of its content.
#pragma once

#include <string>

namespace clef::hub {

// Lower-case hex digest of the file's bytes. Throws clef::Error when the file cannot be read.
std::string sha256_file(const std::string& path);

// 64 lower-case hex digits: the form of an LFS file's etag.
bool is_sha256_hex(const std::string& s);

}  // namespace clef::hub
