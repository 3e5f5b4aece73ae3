#include "tools/imatrix.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "io/gguf.h"
#include "util/error.h"

namespace clef {

namespace {

void check_values(const std::string& path, const std::string& name, const std::vector<float>& v) {
    if (v.empty()) throw Error(path + ": entry '" + name + "' has no values");
    for (float x : v)
        if (!std::isfinite(x) || x < 0)
            throw Error(path + ": entry '" + name + "' has a negative or non-finite value");
}

// GGUF: "<name>.in_sum2" / "<name>.counts" pairs.
ImportanceMatrix load_gguf(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    ImportanceMatrix m;
    const std::string sums = ".in_sum2", counts = ".counts";
    auto f32_values = [&](const GgufTensorInfo& t) {
        if (t.ggml_type != 0) throw Error(path + ": tensor " + t.name + " is not f32");
        std::vector<float> v(t.n_elements());
        std::memcpy(v.data(), t.data, v.size() * sizeof(float));
        return v;
    };
    for (const GgufTensorInfo& t : f.tensors()) {
        if (t.name.size() <= sums.size() || !t.name.ends_with(sums)) continue;
        const std::string name = t.name.substr(0, t.name.size() - sums.size());
        const GgufTensorInfo* c = f.find_tensor(name + counts);
        if (!c) throw Error(path + ": " + t.name + " has no " + name + counts);
        const std::vector<float> s = f32_values(t), n = f32_values(*c);
        if (n.empty() || s.size() % n.size() != 0)
            throw Error(path + ": " + name + ": " + std::to_string(s.size()) + " sums for " +
                        std::to_string(n.size()) + " counts");
        std::vector<float> w(s.size());
        const size_t per = s.size() / n.size();
        for (size_t e = 0; e < n.size(); ++e)
            for (size_t j = 0; j < per; ++j) w[e * per + j] = n[e] > 0 ? s[e * per + j] / n[e] : 1.f;
        check_values(path, name, w);
        m.columns[name] = std::move(w);
    }
    if (m.columns.empty()) throw Error(path + ": no importance-matrix entries (<name>.in_sum2 tensors)");
    if (const GgufValue* d = f.find("imatrix.datasets"); d && d->is_array())
        for (std::string_view s : d->strings()) m.datasets.emplace_back(s);
    if (const GgufValue* c = f.find("imatrix.chunk_count")) m.chunks = static_cast<int>(c->as_int());
    return m;
}

// A cursor over the legacy file's bytes that refuses to read past the end.
struct Reader {
    const std::string& path;
    const std::vector<char>& b;
    size_t at = 0;

    bool done() const { return at >= b.size(); }
    void need(size_t n, const char* what) const {
        if (n > b.size() - at) throw Error(path + ": truncated (" + what + ")");
    }
    int32_t i32(const char* what) {
        need(4, what);
        int32_t v;
        std::memcpy(&v, b.data() + at, 4);
        at += 4;
        return v;
    }
    std::string str(int32_t n, const char* what) {
        if (n < 0) throw Error(path + ": negative length (" + what + ")");
        need(static_cast<size_t>(n), what);
        std::string s(b.data() + at, static_cast<size_t>(n));
        at += static_cast<size_t>(n);
        return s;
    }
};

ImportanceMatrix load_legacy(const std::string& path, const std::vector<char>& bytes) {
    Reader r{path, bytes};
    ImportanceMatrix m;
    const int32_t n = r.i32("entry count");
    if (n < 1) throw Error(path + ": no entries");
    for (int32_t i = 0; i < n; ++i) {
        const std::string name = r.str(r.i32("name length"), "name");
        const int32_t ncall = r.i32("call count"), nval = r.i32("value count");
        if (nval < 1) throw Error(path + ": entry '" + name + "' has no values");
        r.need(static_cast<size_t>(nval) * 4, "values");
        std::vector<float> v(static_cast<size_t>(nval));
        std::memcpy(v.data(), bytes.data() + r.at, v.size() * 4);
        r.at += v.size() * 4;
        if (ncall > 0)
            for (float& x : v) x /= static_cast<float>(ncall);
        check_values(path, name, v);
        m.columns[name] = std::move(v);
    }
    if (!r.done()) {
        m.chunks = r.i32("chunk count");
        if (!r.done()) {
            const int32_t len = r.i32("dataset name length");
            if (len > 0) m.datasets.push_back(r.str(len, "dataset name"));
        }
    }
    return m;
}

}  // namespace

const float* ImportanceMatrix::find(const std::string& name, size_t cols) const {
    auto it = columns.find(name);
    if (it == columns.end()) return nullptr;
    if (it->second.size() != cols)
        throw Error("importance matrix: " + name + " has " + std::to_string(it->second.size()) +
                    " columns, the tensor " + std::to_string(cols) + " (a matrix for another model?)");
    return it->second.data();
}

ImportanceMatrix load_imatrix(const std::string& path) {
    if (is_gguf_file(path)) return load_gguf(path);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open the importance matrix");
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
    return load_legacy(path, bytes);
}

}  // namespace clef
