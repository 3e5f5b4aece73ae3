#include "hub/http.h"

#include <httplib.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "util/error.h"
#include "util/text.h"
#include "util/version.h"

namespace clef::hub {

namespace {

constexpr int kMaxRedirects = 10;

std::unique_ptr<httplib::Client> make_client(const std::string& origin) {
    auto c = std::make_unique<httplib::Client>(origin);
    if (!c->is_valid()) throw Error(origin + ": not a usable http(s) address");
    c->set_connection_timeout(30);
    c->set_read_timeout(120);
    c->set_write_timeout(30);
    c->set_follow_location(false);  // redirects are ours: the token stays on the endpoint's origin
    c->set_url_encode(false);       // targets are encoded already (and CDN signatures must stay as sent)
    c->set_decompress(false);
    return c;
}

bool is_redirect(const httplib::Response& r) {
    return r.status >= 300 && r.status < 400 && r.has_header("Location");
}

// A server's text, made safe for a one-line message.
std::string one_line(const std::string& s) {
    std::string out;
    for (char c : s.substr(0, 200)) out += std::isprint(static_cast<unsigned char>(c)) ? c : ' ';
    return out;
}

// What an HTTP error answer means, in the Hub's terms (its X-Error-Code / X-Error-Message headers).
std::string describe_status(const httplib::Response& r, bool has_token) {
    const std::string code = r.get_header_value("X-Error-Code");
    std::string s = "HTTP " + std::to_string(r.status);
    if (r.status == 401)
        s += has_token
                 ? ": the token (HF_TOKEN) gives no access to this repository, or it does not exist"
                 : ": the repository does not exist, or it is private or gated and needs a token (HF_TOKEN)";
    else if (r.status == 403)
        s += code == "GatedRepo"
                 ? ": gated repository: accept its conditions on the Hub with the token's account"
                 : ": access denied";
    else if (code == "RevisionNotFound")
        s += ": revision not found";
    else if (code == "EntryNotFound")
        s += ": file not found";
    else if (r.status == 404)
        s += ": not found";
    const std::string msg = r.get_header_value("X-Error-Message");
    if (!msg.empty()) s += " (" + one_line(msg) + ")";
    return s;
}

std::string unreachable(const Url& url, httplib::Error e) {
    return "cannot reach " + url.origin + ": " + httplib::to_string(e) +
           " (HF_HUB_OFFLINE=1 uses the local cache alone)";
}

// The request headers for `url`: no compression (sizes and ranges are of the file's bytes), and the token
// for the endpoint's origin alone.
httplib::Headers headers_for(const Url& url, const Url& endpoint, const std::string& token) {
    httplib::Headers h{{"Accept-Encoding", "identity"},
                       {"User-Agent", std::string("clef.cpp/") + kClefVersion}};
    if (!token.empty() && url.origin == endpoint.origin) h.emplace("Authorization", "Bearer " + token);
    return h;
}

// "W/\"abc\"" -> "abc".
std::string normalize_etag(std::string e) {
    if (e.rfind("W/", 0) == 0) e = e.substr(2);
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    return e;
}

bool parse_size(const std::string& s, uint64_t& out) {
    if (s.empty() || s.size() > 19) return false;
    out = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        out = out * 10 + static_cast<uint64_t>(c - '0');
    }
    return true;
}

// The first byte of a 206 answer's Content-Range ("bytes START-END/TOTAL"), or -1.
int64_t range_start(const httplib::Response& r) {
    const std::string cr = r.get_header_value("Content-Range");
    uint64_t v = 0;
    if (cr.rfind("bytes ", 0) != 0) return -1;
    const size_t dash = cr.find('-', 6);
    if (dash == std::string::npos || !parse_size(cr.substr(6, dash - 6), v)) return -1;
    return static_cast<int64_t>(v);
}

// The partial file a download appends to (or rewrites), reporting its size as it grows.
class PartWriter {
public:
    PartWriter(std::string path, const std::function<void(uint64_t)>& progress)
        : path_(std::move(path)), progress_(progress) {}
    ~PartWriter() {
        if (f_) std::fclose(f_);
    }
    bool open(uint64_t offset) {
        f_ = std::fopen(path_.c_str(), offset > 0 ? "ab" : "wb");
        size_ = offset;
        if (!f_) error_ = path_ + ": cannot write: " + std::strerror(errno);
        return f_ != nullptr;
    }
    bool write(const char* data, size_t n) {
        if (!f_) return true;  // the body of an answer we do not keep
        if (std::fwrite(data, 1, n, f_) != n) {
            error_ = path_ + ": cannot write: " + std::strerror(errno);
            return false;
        }
        size_ += n;
        if (progress_) progress_(size_);
        return true;
    }
    void close() {
        if (f_ && std::fclose(f_) != 0 && error_.empty())
            error_ = path_ + ": cannot write: " + std::strerror(errno);
        f_ = nullptr;
    }
    const std::string& error() const { return error_; }

private:
    std::string path_;
    const std::function<void(uint64_t)>& progress_;
    FILE* f_ = nullptr;
    uint64_t size_ = 0;
    std::string error_;
};

}  // namespace

bool parse_url(const std::string& text, Url& out) {
    const size_t sep = text.find("://");
    if (sep == std::string::npos) return false;
    const std::string scheme = ascii_lower(text.substr(0, sep));
    if (scheme != "http" && scheme != "https") return false;
    const size_t path = text.find_first_of("/?#", sep + 3);
    std::string host =
        ascii_lower(text.substr(sep + 3, path == std::string::npos ? std::string::npos : path - sep - 3));
    if (host.empty() || host.find('@') != std::string::npos) return false;
    // The default port is left out, so that equal origins compare equal.
    const std::string default_port = scheme == "https" ? ":443" : ":80";
    if (host.size() > default_port.size() &&
        host.compare(host.size() - default_port.size(), std::string::npos, default_port) == 0)
        host.resize(host.size() - default_port.size());
    out.origin = scheme + "://" + host;
    out.target = path == std::string::npos ? "/" : text.substr(path);
    if (out.target[0] != '/') out.target = "/" + out.target;
    const size_t hash = out.target.find('#');
    if (hash != std::string::npos) out.target.resize(hash);
    return true;
}

Url follow_location(const Url& base, const std::string& location) {
    Url u;
    if (parse_url(location, u)) return u;
    if (location.rfind("//", 0) == 0 &&
        parse_url(base.origin.substr(0, base.origin.find(':')) + ":" + location, u))
        return u;
    u.origin = base.origin;
    if (!location.empty() && location[0] == '/') {
        u.target = location;
    } else {  // relative to the base's directory
        const std::string path = base.target.substr(0, base.target.find('?'));
        u.target = path.substr(0, path.rfind('/') + 1) + location;
    }
    return u;
}

std::string percent_encode(std::string_view s, bool keep_slash) {
    static const char* const kHex = "0123456789ABCDEF";
    std::string out;
    for (char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
            out += ch;
        } else {
            out += '%';
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

HubHttp::HubHttp(const std::string& endpoint, std::string token) : token_(std::move(token)) {
    if (!parse_url(endpoint, endpoint_) || endpoint_.target.find('?') != std::string::npos)
        throw Error("HF_ENDPOINT: expected an http:// or https:// URL, got '" + endpoint + "'");
    while (!endpoint_.target.empty() && endpoint_.target.back() == '/') endpoint_.target.pop_back();
}

std::string HubHttp::get(const std::string& target, const std::string& what) {
    Url url{endpoint_.origin, endpoint_.target + target};
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
        auto res = make_client(url.origin)->Get(url.target, headers_for(url, endpoint_, token_));
        if (!res) throw Error(what + ": " + unreachable(url, res.error()));
        if (res->status == 200) return res->body;
        if (!is_redirect(*res)) throw Error(what + ": " + describe_status(*res, !token_.empty()));
        url = follow_location(url, res->get_header_value("Location"));
    }
    throw Error(what + ": too many redirects");
}

FileInfo HubHttp::file_info(const std::string& target, const std::string& what) {
    Url url{endpoint_.origin, endpoint_.target + target};
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
        auto res = make_client(url.origin)->Head(url.target, headers_for(url, endpoint_, token_));
        if (!res) throw Error(what + ": " + unreachable(url, res.error()));
        const bool redirect = is_redirect(*res);
        std::string etag = res->get_header_value("X-Linked-Etag");
        if (etag.empty()) etag = res->get_header_value("ETag");
        etag = normalize_etag(etag);
        if (!etag.empty() && (res->status == 200 || redirect)) {
            FileInfo f;
            f.etag = etag;
            f.commit = res->get_header_value("X-Repo-Commit");
            // A redirect's Content-Length is that of its own body: only X-Linked-Size gives the file's size.
            f.size_known = parse_size(res->get_header_value("X-Linked-Size"), f.size) ||
                           (!redirect && parse_size(res->get_header_value("Content-Length"), f.size));
            f.location = redirect ? follow_location(url, res->get_header_value("Location")) : url;
            return f;
        }
        // A redirect without an etag (a renamed repository) leads to the answer that has one.
        if (!redirect) {
            if (res->status == 200) throw Error(what + ": the Hub's answer carries no ETag");
            throw Error(what + ": " + describe_status(*res, !token_.empty()));
        }
        url = follow_location(url, res->get_header_value("Location"));
    }
    throw Error(what + ": too many redirects");
}

HubHttp::Outcome HubHttp::download(const Url& start, const std::string& part, uint64_t offset,
                                   const std::function<void(uint64_t)>& progress, const std::string& what,
                                   std::string& reason) {
    Url url = start;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
        httplib::Headers h = headers_for(url, endpoint_, token_);
        if (offset > 0) h.emplace("Range", "bytes=" + std::to_string(offset) + "-");
        PartWriter out(part, progress);
        std::string location, failure;
        bool complete = false;  // 416: the partial file already holds every byte
        auto on_answer = [&](const httplib::Response& r) {
            if (is_redirect(r)) {
                location = r.get_header_value("Location");
                return true;
            }
            if (r.status == 206 && offset > 0 && range_start(r) == static_cast<int64_t>(offset))
                return out.open(offset);
            if (r.status == 200) return out.open(0);  // the whole file, whatever was asked
            if (r.status == 206) {
                failure = "the server sent another range than the one asked (" +
                          one_line(r.get_header_value("Content-Range")) + ")";
                return false;
            }
            if (r.status == 416 && offset > 0) {
                complete = true;
                return false;
            }
            failure = describe_status(r, !token_.empty());
            return false;
        };
        auto res = make_client(url.origin)->Get(url.target, h, on_answer, [&](const char* d, size_t n) {
            return out.write(d, n);
        });
        out.close();
        if (!out.error().empty()) throw Error(what + ": " + out.error());
        if (!failure.empty()) throw Error(what + ": " + failure);
        if (complete) return Outcome::Done;
        if (!res) {
            reason = httplib::to_string(res.error());
            return Outcome::Cut;
        }
        if (location.empty()) return Outcome::Done;
        url = follow_location(url, location);
    }
    throw Error(what + ": too many redirects");
}

}  // namespace clef::hub
