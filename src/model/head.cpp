#include "model/head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "device/device.h"
#include "model/tensors.h"
#include "util/error.h"
#include "util/half.h"
#include "util/text.h"

namespace clef {

namespace {

constexpr double kCosineEps = 1e-8;      // torch cosine_similarity default
constexpr double kNormalizeEps = 1e-12;  // torch F.normalize default
constexpr int64_t kRowBlock = 512;       // rows normalised/projected at a time when streaming over the memory

bool is_float_dtype(DType t) {
    return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::F64;
}

// A torch.nn.Linear: a matrix of the head's device (fp32 weights packed once, Precision::Exact, on the fast
// path; the scalar ops::linear on a head loaded with reference = true).
using Dense = std::unique_ptr<dev::Matrix>;

// A torch.nn.LayerNorm with affine weight and bias over rows of d, eps 1e-5.
struct Norm {
    dev::Tensor w, b;
    int64_t d = 0;
};

// A torch.nn.MultiheadAttention: packed in-projection rows [q; k; v] with bias, then out_proj. On the fast
// path the k and v weights and the v bias are also device vectors: the factored memory attention reads them.
struct Attn {
    Dense q, k, v;  // the rows [0, W), [W, 2W), [2W, 3W) of in_proj_weight / in_proj_bias
    Dense out;
    dev::Tensor wk, wv, bv;
};

struct RoutingLayer {
    Norm query_norm, memory_norm, feedforward_norm;
    Attn attention;
    Dense ff_in, ff_out;  // feedforward.0, feedforward.3
};

struct FieldLayer {  // torch.nn.TransformerDecoderLayer, norm_first, GELU
    Attn self_attn, cross_attn;
    Dense linear1, linear2;
    Norm norm1, norm2, norm3;
};

// Reads one lm_head row as fp32 (the dtype is a float type, checked at load).
void read_row(const TensorView& t, int64_t row, int64_t cols, float* dst) {
    const size_t es = dtype_size(t.dtype);
    convert_to_f32(t.dtype, t.data + static_cast<size_t>(row) * static_cast<size_t>(cols) * es,
                   static_cast<size_t>(cols), dst);
}

// Takes tensors out of the head file by name with their expected shape, and remembers which were used; puts
// the matrices and vectors on the head's device.
class TensorTaker {
public:
    TensorTaker(const WeightSource& f, dev::Device& device, bool reference)
        : f_(f), dev_(device), reference_(reference) {}

    std::vector<float> take(const std::string& name, const std::vector<int64_t>& shape) {
        const TensorView* t = f_.find(name);
        if (!t) throw Error(f_.description() + ": joint head: missing tensor " + name);
        if (t->shape != shape)
            throw Error(f_.description() + ": joint head: tensor " + name + " has shape " +
                        shape_str(t->shape) + ", expected " + shape_str(shape));
        if (!is_float_dtype(t->dtype))
            throw Error(f_.description() + ": joint head: tensor " + name + " has dtype " +
                        std::string(dtype_name(t->dtype)) + ", expected a float type");
        used_.insert(name);
        return t->to_f32();
    }
    // The modules of model/tensors.h's head table (names and shapes from it).
    float scalar(const ModuleRef& m) { return take(m.weight, m.shape)[0]; }
    dev::Tensor param(const ModuleRef& m) { return dev_.vector(take(m.weight, m.shape)); }
    Dense dense(const ModuleRef& m) {
        const int64_t out = m.shape[0];
        return matrix(take(m.weight, m.shape), out, m.shape[1],
                      m.bias.empty() ? std::vector<float>{} : take(m.bias, {out}));
    }
    Norm norm(const ModuleRef& m) {
        return {dev_.vector(take(m.weight, m.shape)), dev_.vector(take(m.bias, m.shape)), m.shape[0]};
    }
    // A MultiheadAttention: the packed in-projection in_proj and its out_proj.
    Attn attn(const ModuleRef& in_proj, const ModuleRef& out_proj) {
        Attn a;
        const int64_t w = in_proj.shape[1];
        const std::vector<float> in_w = take(in_proj.weight, in_proj.shape);
        const std::vector<float> in_b = take(in_proj.bias, {3 * w});
        auto rows = [&](const std::vector<float>& v, int i, int64_t n) {
            return std::vector<float>(v.begin() + i * n, v.begin() + (i + 1) * n);
        };
        Dense* parts[3] = {&a.q, &a.k, &a.v};
        for (int i = 0; i < 3; ++i) *parts[i] = matrix(rows(in_w, i, w * w), w, w, rows(in_b, i, w));
        if (!reference_) {
            a.wk = dev_.vector(rows(in_w, 1, w * w));
            a.wv = dev_.vector(rows(in_w, 2, w * w));
            a.bv = dev_.vector(rows(in_b, 2, w));
        }
        a.out = dense(out_proj);
        return a;
    }
    // Strict load: every tensor of the file must have been taken.
    void check_all_used() const {
        for (const std::string& name : f_.names())
            if (!used_.count(name)) throw Error(f_.description() + ": joint head: unexpected tensor " + name);
    }

private:
    // fp32 values [out][in] as a device matrix (the device copies what it keeps).
    Dense matrix(const std::vector<float>& w, int64_t out, int64_t in, std::vector<float> bias) {
        TensorView t;
        t.dtype = DType::F32;
        t.shape = {out, in};
        t.data = reinterpret_cast<const unsigned char*>(w.data());
        t.nbytes = w.size() * sizeof(float);
        dev::MatrixSource src;
        src.tensor = &t;
        src.bias = std::move(bias);
        src.paths = reference_ ? dev::Paths::Reference : dev::Paths::Fast;
        return dev_.matrix(src);
    }

    const WeightSource& f_;
    dev::Device& dev_;
    bool reference_;
    std::set<std::string> used_;
};

}  // namespace

struct JointHead::Weights {
    HeadConfig cfg;
    dev::Device* dev = nullptr;  // where the matrices and vectors live and both stages run
    bool reference = false;      // the scalar reference path (the oracle)
    TensorView lm_head;          // mapped, not copied (unless lm_quant holds the table)
    std::unique_ptr<QuantMatrix> lm_quant;
    int64_t vocab = 0;
    void lexical_row(int64_t id, float* dst) const {
        if (lm_quant)
            lm_quant->row_f32(id, dst);
        else
            read_row(lm_head, id, cfg.hidden_size, dst);
    }
    Norm hidden_norm;
    Dense memory_projection, question_projection, option_question_projection, global_projection,
        option_context_projection, option_lexical_projection;
    dev::Tensor type_embedding;  // [3][W]
    std::vector<RoutingLayer> routing;
    Norm option_summary_norm;
    std::vector<FieldLayer> layers;
    Norm field_norm, option_norm;
    Dense scorer_in, scorer_out;  // residual_scorer.0, residual_scorer.3
    float prior_scale = 0.f, joint_scale = 0.f, gate = 0.f;
    std::unique_ptr<dev::Stream> stream() const { return dev->stream({reference, ops::Precision::Exact}); }
};

namespace {

using Weights = JointHead::Weights;

// One pass of either stage through a stream of the head's device.
struct Pass {
    dev::Stream& s;
    dev::Device& device;
    dev::Tensor scratch(int64_t n) const { return s.scratch(n); }
    // A host array as a span for this pass (the CPU's is the array itself).
    dev::Tensor wrap(const std::vector<float>& v) const {
        return device.wrap(const_cast<float*>(v.data()), static_cast<int64_t>(v.size()));
    }
    void linear(const Dense& d, dev::Span x, int64_t rows, dev::Span y) const { s.linear(*d, x, rows, y); }
    // The memory rows [T][W] as a span: where the builder left them on the device, else the host's wrapped.
    dev::Span memory(const HeadFeatures& ft, dev::Tensor& hold) const {
        if (!ft.memory_on_device.empty()) return ft.memory_on_device.span();
        hold = wrap(ft.memory);
        return hold.span();
    }
    void norm(const Norm& n, dev::Span x, int64_t rows, dev::Span y) const {
        s.layer_norm(x, rows, n.d, n.w.span(), n.b.span(), 1e-5f, y);  // torch's default eps
    }
};

// K and V rows of an attention over `rows` memory rows, optionally LayerNorm-ed first (block by block, so no
// normalised copy of the whole memory is kept).
void memory_kv(const Pass& p, const Attn& a, const Norm* norm, dev::Span mem, int64_t rows, int64_t W,
               dev::Span k, dev::Span v) {
    const dev::Tensor normed = p.scratch(norm ? std::min(kRowBlock, rows) * W : 0);
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        const int64_t n = std::min(kRowBlock, rows - r0);
        dev::Span x = mem.at(r0 * W, n * W);
        if (norm) {
            p.norm(*norm, x, n, normed.at(0, n * W));
            x = normed.at(0, n * W);
        }
        p.linear(a.k, x, n, k.at(r0 * W, n * W));
        p.linear(a.v, x, n, v.at(r0 * W, n * W));
    }
}

// out[lq][W] = MHA(xq, keys, values) given the projected K and V rows; no masks. The queries are few: the
// scalar kernel on the CPU.
void attend(const Pass& p, const Attn& a, int heads, int64_t W, dev::Span xq, int64_t lq, dev::Span k,
            dev::Span v, int64_t lk, dev::Span out) {
    const dev::Tensor q = p.scratch(lq * W), ctx = p.scratch(lq * W);
    p.linear(a.q, xq, lq, q.span());
    const int dh = static_cast<int>(W / heads);
    dev::Attention at;
    at.T = lq, at.kv = lk, at.causal = false, at.small = true;
    at.nh = at.nkv = heads, at.hd = dh;
    at.scale = 1.f / std::sqrt(static_cast<float>(dh));
    at.q = q.span(), at.k = k, at.v = v, at.out = ctx.span();
    p.s.attention(at);
    p.linear(a.out, ctx.span(), lq, out);
}

// Fast form of memory_kv + attend for memory rows `mem` [T][W] (already normalised if the layer norms them):
// the factored attention of ops/attention_fast.h, the T memory rows never projected.
void attend_memory(const Pass& p, const Attn& a, int heads, int64_t W, dev::Span xq, int64_t lq,
                   dev::Span mem, int64_t T, dev::Span out) {
    const dev::Tensor q = p.scratch(lq * W), o = p.scratch(lq * W);
    p.linear(a.q, xq, lq, q.span());
    p.s.memory_attention(q.span(), lq, heads, W, a.wk.span(), a.wv.span(), a.bv.span(), mem, T, o.span());
    p.linear(a.out, o.span(), lq, out);
}

// Feed-forward block with exact GELU: out = second(gelu(first(x))).
void feedforward(const Pass& p, const Dense& first, const Dense& second, dev::Span x, int64_t rows,
                 dev::Span out) {
    const dev::Tensor h = p.scratch(rows * first->out());
    p.linear(first, x, rows, h.span());
    p.s.gelu(h.span(), rows, false);
    p.linear(second, h.span(), rows, out);
}

std::string span_str(int64_t b, int64_t e) {
    return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
}

void check_span(int64_t b, int64_t e, int64_t T, const std::string& what) {
    if (b < 0 || e > T || b > e)
        throw Error("joint head: " + what + " span " + span_str(b, e) + " is out of range for " +
                    std::to_string(T) + " tokens");
    if (b == e) throw Error("joint head: " + what + " span " + span_str(b, e) + " is empty");
}

size_t total_options(const std::vector<HeadQuestion>& questions) {
    size_t n = 0;
    for (const auto& q : questions) n += q.option_spans.size();
    return n;
}

}  // namespace

// -----------------------------------------------------------------------------------------------------------
// Loading

JointHead::JointHead(const HeadConfig& cfg, const WeightSource& head_weights, const TensorView& lm_head,
                     bool reference, dev::Device& device)
    : JointHead(cfg, head_weights, reference, device, [&lm_head](Weights& w) {
          // lm_head: [vocab][hidden], a float type, rows read in place.
          const int64_t H = w.cfg.hidden_size;
          const std::string lm = lm_head.file + ": " + (lm_head.name.empty() ? "lm_head" : lm_head.name);
          if (lm_head.shape.size() != 2 || lm_head.shape[0] <= 0 || lm_head.shape[1] != H)
              throw Error(lm + ": has shape " + shape_str(lm_head.shape) + ", expected [vocab, " +
                          std::to_string(H) + "]");
          if (!is_float_dtype(lm_head.dtype))
              throw Error(lm + ": has dtype " + std::string(dtype_name(lm_head.dtype)) +
                          ", expected BF16, F16, F32 or F64");
          if (!lm_head.data ||
              lm_head.nbytes != static_cast<size_t>(lm_head.numel()) * dtype_size(lm_head.dtype))
              throw Error(lm + ": data does not match its shape");
          w.lm_head = lm_head;
          w.vocab = lm_head.shape[0];
      }) {}

JointHead::JointHead(const HeadConfig& cfg, const WeightSource& head_weights, const QuantMatrix& lm_head,
                     bool reference, dev::Device& device)
    : JointHead(cfg, head_weights, reference, device, [&lm_head](Weights& w) {
          if (lm_head.cols != w.cfg.hidden_size)
              throw Error("lm_head: has " + std::to_string(lm_head.cols) + " columns, expected hidden_size " +
                          std::to_string(w.cfg.hidden_size));
          lm_head.validate("lm_head");
          w.lm_quant = std::make_unique<QuantMatrix>(lm_head);
          w.vocab = lm_head.rows;
      }) {}

JointHead::JointHead(const HeadConfig& cfg, const WeightSource& head_weights, bool reference,
                     dev::Device& device, const std::function<void(Weights&)>& set_lexical) {
    const std::string& path = head_weights.description();
    if (cfg.hidden_size <= 0 || cfg.width <= 0 || cfg.heads <= 0 || cfg.feedforward <= 0 ||
        cfg.routing_layers < 0 || cfg.layers < 0)
        throw Error(path + ": joint head: config has a non-positive size");
    if (cfg.width % cfg.heads != 0)
        throw Error(path + ": joint head: width " + std::to_string(cfg.width) +
                    " is not divisible by heads " + std::to_string(cfg.heads));
    auto w = std::make_shared<Weights>();
    w->cfg = cfg;
    w->dev = &device;
    w->reference = reference;
    set_lexical(*w);

    TensorTaker t(head_weights, device, reference);
    using M = HeadModule;
    const ModuleIndex m = head_modules(cfg);
    w->hidden_norm = t.norm(m.at(M::HiddenNorm));
    w->memory_projection = t.dense(m.at(M::MemoryProjection));
    w->question_projection = t.dense(m.at(M::QuestionProjection));
    w->option_question_projection = t.dense(m.at(M::OptionQuestionProjection));
    w->global_projection = t.dense(m.at(M::GlobalProjection));
    w->option_context_projection = t.dense(m.at(M::OptionContextProjection));
    w->option_lexical_projection = t.dense(m.at(M::OptionLexicalProjection));
    w->type_embedding = t.param(m.at(M::TypeEmbedding));
    for (int i = 0; i < cfg.routing_layers; ++i) {
        RoutingLayer l;
        l.query_norm = t.norm(m.at(M::QueryNorm, i));
        l.memory_norm = t.norm(m.at(M::MemoryNorm, i));
        l.attention = t.attn(m.at(M::Attention, i), m.at(M::AttentionOut, i));
        l.feedforward_norm = t.norm(m.at(M::FeedforwardNorm, i));
        l.ff_in = t.dense(m.at(M::FeedforwardIn, i));
        l.ff_out = t.dense(m.at(M::FeedforwardOut, i));
        w->routing.push_back(std::move(l));
    }
    w->option_summary_norm = t.norm(m.at(M::OptionSummaryNorm));
    for (int i = cfg.routing_layers; i < cfg.routing_layers + cfg.layers; ++i) {  // the table's layer numbers
        FieldLayer l;
        l.self_attn = t.attn(m.at(M::SelfAttn, i), m.at(M::SelfAttnOut, i));
        l.cross_attn = t.attn(m.at(M::CrossAttn, i), m.at(M::CrossAttnOut, i));
        l.linear1 = t.dense(m.at(M::Linear1, i));
        l.linear2 = t.dense(m.at(M::Linear2, i));
        l.norm1 = t.norm(m.at(M::Norm1, i));
        l.norm2 = t.norm(m.at(M::Norm2, i));
        l.norm3 = t.norm(m.at(M::Norm3, i));
        w->layers.push_back(std::move(l));
    }
    w->field_norm = t.norm(m.at(M::FieldNorm));
    w->option_norm = t.norm(m.at(M::OptionNorm));
    w->scorer_in = t.dense(m.at(M::ScorerIn));
    w->scorer_out = t.dense(m.at(M::ScorerOut));

    // Scalars: clamp at ln(100), then exp; evaluated in double and rounded once.
    const double cap = std::log(100.0);
    w->prior_scale = static_cast<float>(std::exp(std::min<double>(t.scalar(m.at(M::PriorScale)), cap)));
    w->joint_scale = static_cast<float>(std::exp(std::min<double>(t.scalar(m.at(M::JointScale)), cap)));
    w->gate =
        static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(t.scalar(m.at(M::ResidualGate))))));
    t.check_all_used();
    w_ = std::move(w);
}

const HeadConfig& JointHead::config() const {
    return w_->cfg;
}
dev::Device& JointHead::device() const {
    return *w_->dev;
}
int64_t JointHead::vocab_size() const {
    return w_->vocab;
}
float JointHead::prior_scale() const {
    return w_->prior_scale;
}
float JointHead::joint_scale() const {
    return w_->joint_scale;
}
float JointHead::residual_gate() const {
    return w_->gate;
}

void JointHead::check_questions(int64_t T, const std::vector<HeadQuestion>& questions) {
    if (T <= 0) throw Error("joint head: empty sequence");
    if (questions.empty()) throw Error("joint head: no questions");
    for (size_t i = 0; i < questions.size(); ++i) {
        const HeadQuestion& q = questions[i];
        const std::string name = "question " + std::to_string(i);
        if (q.type < 0 || q.type > 2)
            throw Error("joint head: " + name + ": type " + std::to_string(q.type) +
                        " is not 0 (noul), 1 (choice) or 2 (score)");
        check_span(q.span_begin, q.span_end, T, name);
        if (q.option_spans.empty()) throw Error("joint head: " + name + " has no options");
        for (size_t j = 0; j < q.option_spans.size(); ++j)
            check_span(q.option_spans[j].first, q.option_spans[j].second, T,
                       name + " option " + std::to_string(j));
    }
}

// -----------------------------------------------------------------------------------------------------------
// Stage 1: features

HeadFeatureBuilder::HeadFeatureBuilder(const JointHead& head, int64_t T, const std::vector<int32_t>& ids,
                                       const std::vector<HeadQuestion>& questions)
    : w_(head.w_.get()), T_(T) {
    JointHead::check_questions(T, questions);
    if (static_cast<int64_t>(ids.size()) != T)
        throw Error("joint head: " + std::to_string(ids.size()) + " input ids for " + std::to_string(T) +
                    " positions");
    const int64_t H = w_->cfg.hidden_size, W = w_->cfg.width;
    const int64_t vocab = w_->vocab;
    const size_t N = total_options(questions);
    questions_ = questions.size();

    out_.length = T;
    if (w_->dev->is_cpu()) out_.memory.assign(static_cast<size_t>(T * W), 0.f);  // else device_memory()
    out_.global.assign(static_cast<size_t>(H), 0.f);
    out_.question_mean.assign(questions_ * H, 0.f);
    out_.option_context.assign(N * H, 0.f);
    out_.option_lexical.assign(N * H, 0.f);
    sums_.assign((questions_ + N) * H, 0.0);

    // Spans, and the lexical means (lm_head rows of each option's ids), which need no hidden state.
    std::vector<float> row(static_cast<size_t>(H));
    std::vector<double> acc(static_cast<size_t>(H));
    size_t option = 0;
    for (size_t i = 0; i < questions.size(); ++i) {
        const HeadQuestion& q = questions[i];
        spans_.push_back({q.span_begin, q.span_end, i});
        for (const auto& [b, e] : q.option_spans) {
            spans_.push_back({b, e, questions_ + option});
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t p = b; p < e; ++p) {
                const int64_t id = ids[p];
                if (id < 0 || id >= vocab)
                    throw Error("joint head: input id " + std::to_string(id) + " at position " +
                                std::to_string(p) + " is outside the lm_head vocabulary of " +
                                std::to_string(vocab));
                w_->lexical_row(id, row.data());
                for (int64_t c = 0; c < H; ++c) acc[c] += row[c];
            }
            float* dst = out_.option_lexical.data() + option * H;
            for (int64_t c = 0; c < H; ++c) dst[c] = static_cast<float>(acc[c] / static_cast<double>(e - b));
            ++option;
        }
    }
}

void HeadFeatureBuilder::add_rows(const float* rows, int64_t n) {
    if (n < 0 || done_ + n > T_)
        throw Error("joint head: " + std::to_string(n) + " more hidden rows after " + std::to_string(done_) +
                    " of " + std::to_string(T_));
    if (n == 0) return;
    settle();
    const int64_t H = w_->cfg.hidden_size, W = w_->cfg.width;
    normed_.resize(static_cast<size_t>(n * H));
    {  // LN_hidden and the memory rows on the device; the span sums below read the normalised rows
        const std::unique_ptr<dev::Stream> stream = w_->stream();
        dev::Device& d = *w_->dev;
        const dev::Tensor x = d.wrap(const_cast<float*>(rows), n * H), y = d.wrap(normed_.data(), n * H);
        dev::Tensor host_memory;
        const dev::Span m = d.is_cpu() ? (host_memory = d.wrap(out_.memory.data() + done_ * W, n * W)).span()
                                       : device_memory().at(done_ * W, n * W);
        stream->layer_norm(x.span(), n, H, w_->hidden_norm.w.span(), w_->hidden_norm.b.span(), 1e-5f,
                           y.span());
        stream->linear(*w_->memory_projection, y.span(), n, m);
        stream->sync();
    }
    sum_rows(normed_.data(), done_, n);
    done_ += n;
}

void HeadFeatureBuilder::add_device_rows(dev::Stream& s, dev::Span rows, int64_t n) {
    if (n < 0 || done_ + n > T_)
        throw Error("joint head: " + std::to_string(n) + " more hidden rows after " + std::to_string(done_) +
                    " of " + std::to_string(T_));
    if (w_->dev->is_cpu()) throw Error("joint head: device rows for a head on the CPU");
    if (n == 0) return;
    settle();
    const int64_t H = w_->cfg.hidden_size, W = w_->cfg.width, first = done_, last = done_ + n;
    const dev::Tensor normed = s.scratch(n * H);
    s.layer_norm(rows, n, H, w_->hidden_norm.w.span(), w_->hidden_norm.b.span(), 1e-5f, normed.span());
    s.linear(*w_->memory_projection, normed.span(), n, device_memory().at(first * W, n * W));
    // The rows the spans and the global row read, as disjoint ranges.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const Span& sp : spans_)
        if (std::max(sp.begin, first) < std::min(sp.end, last))
            ranges.emplace_back(std::max(sp.begin, first), std::min(sp.end, last));
    if (last == T_) ranges.emplace_back(T_ - 1, T_);
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : ranges)
        if (!merged.empty() && r.first <= merged.back().second)
            merged.back().second = std::max(merged.back().second, r.second);
        else
            merged.push_back(r);
    for (const auto& [b, e] : merged) {
        Fetched f{b, e - b, std::vector<float>(static_cast<size_t>((e - b) * H))};
        s.fetch(f.rows.data(), normed.at((b - first) * H, (e - b) * H));
        fetched_.push_back(std::move(f));
    }
    done_ = last;
}

void HeadFeatureBuilder::sum_rows(const float* rows, int64_t first, int64_t n) {
    const int64_t H = w_->cfg.hidden_size, last = first + n;
    for (const Span& s : spans_) {
        const int64_t b = std::max(s.begin, first), e = std::min(s.end, last);
        double* sum = sums_.data() + s.slot * H;
        for (int64_t p = b; p < e; ++p) {
            const float* x = rows + (p - first) * H;
            for (int64_t c = 0; c < H; ++c) sum[c] += x[c];
        }
    }
    if (last == T_) std::copy_n(rows + (n - 1) * H, H, out_.global.data());
}

void HeadFeatureBuilder::settle() {
    for (const Fetched& f : fetched_) sum_rows(f.rows.data(), f.first, f.n);
    fetched_.clear();
}

dev::Span HeadFeatureBuilder::device_memory() {
    if (out_.memory_on_device.empty()) out_.memory_on_device = w_->dev->buffer(T_ * w_->cfg.width);
    return out_.memory_on_device.span();
}

void HeadFeatureBuilder::restore_memory(const float* memory_rows, int64_t n) {
    if (n < 0 || done_ + n > T_) throw Error("joint head: restored rows past the end of the prompt");
    for (const Span& s : spans_)
        if (s.begin < done_ + n)
            throw Error("joint head: a restored prefix covers a question or option span");
    const int64_t W = w_->cfg.width;
    if (w_->dev->is_cpu()) {
        std::copy_n(memory_rows, n * W, out_.memory.data() + done_ * W);
    } else if (n > 0) {
        const std::unique_ptr<dev::Stream> stream = w_->stream();
        stream->upload(device_memory().at(done_ * W, n * W), memory_rows);
        stream->sync();
    }
    done_ += n;
}

const float* HeadFeatureBuilder::memory_rows(int64_t first) {
    const int64_t W = w_->cfg.width;
    if (w_->dev->is_cpu()) return out_.memory.data() + first * W;
    memory_copy_.resize(static_cast<size_t>((done_ - first) * W));
    if (done_ > first)
        w_->stream()->download(memory_copy_.data(), device_memory().at(first * W, (done_ - first) * W));
    return memory_copy_.data();
}

HeadFeatures HeadFeatureBuilder::finish() {
    settle();
    if (done_ != T_)
        throw Error("joint head: only " + std::to_string(done_) + " of " + std::to_string(T_) +
                    " hidden rows given");
    const int64_t H = w_->cfg.hidden_size;
    for (const Span& s : spans_) {
        const double* sum = sums_.data() + s.slot * H;
        float* dst = s.slot < questions_ ? out_.question_mean.data() + s.slot * H
                                         : out_.option_context.data() + (s.slot - questions_) * H;
        const double len = static_cast<double>(s.end - s.begin);
        for (int64_t c = 0; c < H; ++c) dst[c] = static_cast<float>(sum[c] / len);
    }
    if (!w_->dev->is_cpu()) device_memory();  // T = 0: an empty buffer, as the checks expect
    return std::move(out_);
}

// -----------------------------------------------------------------------------------------------------------
// Stage 2: decide

std::vector<std::vector<float>> JointHead::logits(const float* hidden, int64_t T,
                                                  const std::vector<int32_t>& ids,
                                                  const std::vector<HeadQuestion>& questions,
                                                  HeadTrace* trace) const {
    if (!hidden && T > 0) throw Error("joint head: no hidden states");
    HeadFeatureBuilder builder(*this, T, ids, questions);
    const int64_t H = w_->cfg.hidden_size;
    for (int64_t r0 = 0; r0 < T; r0 += kRowBlock)
        builder.add_rows(hidden + r0 * H, std::min(kRowBlock, T - r0));
    return decide(builder.finish(), questions, trace);
}

namespace {

using Weights = JointHead::Weights;
using Rows = std::vector<int64_t>;  // first option row of each question, then the total (Q + 1 entries)

// Option queries: r = W_oc·c + W_ol·ℓ + W_oq·q (the question term shared by that question's options).
dev::Tensor option_queries(const Pass& p, const Weights& w, const HeadFeatures& ft, const Rows& first) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(first.size()) - 1, N = first.back();
    dev::Tensor r = p.scratch(N * W);
    const dev::Tensor tmp = p.scratch(N * W), oq = p.scratch(Q * W);
    p.linear(w.option_context_projection, p.wrap(ft.option_context).span(), N, r.span());
    p.linear(w.option_lexical_projection, p.wrap(ft.option_lexical).span(), N, tmp.span());
    p.s.add(r.span(), tmp.span());
    p.linear(w.option_question_projection, p.wrap(ft.question_mean).span(), Q, oq.span());
    for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = first[i]; j < first[i + 1]; ++j) p.s.add(r.at(j * W, W), oq.at(i * W, W));
    return r;
}

// Evidence routing: options cross-attend to their own LayerNorm of the memory, then a feed-forward block.
void route_evidence(const Pass& p, const Weights& w, const HeadFeatures& ft, dev::Span r, int64_t N,
                    HeadTrace* trace) {
    const int64_t T = ft.length, W = w.cfg.width;
    dev::Tensor hold;
    const dev::Span mem = p.memory(ft, hold);
    const dev::Tensor keys = p.scratch(T * W), values = p.scratch(w.reference ? T * W : 0),
                      x = p.scratch(N * W), tmp = p.scratch(N * W);
    for (const RoutingLayer& l : w.routing) {
        p.norm(l.query_norm, r, N, x.span());
        if (!w.reference) {  // keys holds the normalised memory
            p.norm(l.memory_norm, mem, T, keys.span());
            attend_memory(p, l.attention, w.cfg.heads, W, x.span(), N, keys.span(), T, tmp.span());
        } else {
            memory_kv(p, l.attention, &l.memory_norm, mem, T, W, keys.span(), values.span());
            attend(p, l.attention, w.cfg.heads, W, x.span(), N, keys.span(), values.span(), T, tmp.span());
        }
        p.s.add(r, tmp.span());
        p.norm(l.feedforward_norm, r, N, x.span());
        feedforward(p, l.ff_in, l.ff_out, x.span(), N, tmp.span());
        p.s.add(r, tmp.span());
        if (trace) trace->evidence_layers.push_back(p.s.read(r));
    }
}

// Option summaries: per question, attention of b_i over its options r (keys and values), scale 1/sqrt(W).
dev::Tensor option_summaries(const Pass& p, const Weights& w, dev::Span r, dev::Span b, const Rows& first) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(first.size()) - 1;
    dev::Tensor summary = p.scratch(Q * W);
    for (int64_t i = 0; i < Q; ++i) {
        const int64_t n = first[i + 1] - first[i];
        dev::Attention at;
        at.T = 1, at.kv = n, at.causal = false, at.small = true;
        at.nh = at.nkv = 1, at.hd = static_cast<int>(W);
        at.scale = 1.f / std::sqrt(static_cast<float>(W));
        at.q = b.at(i * W, W), at.k = at.v = r.at(first[i] * W, n * W), at.out = summary.at(i * W, W);
        p.s.attention(at);
    }
    return summary;
}

// Field vectors f = b + LN_sum(s) + W_g·g + T[type], b = W_q·q.
dev::Tensor field_vectors(const Pass& p, const Weights& w, const HeadFeatures& ft, dev::Span r,
                          const std::vector<HeadQuestion>& questions, const Rows& first, HeadTrace* trace) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(questions.size());
    dev::Tensor f = p.scratch(Q * W);
    const dev::Tensor b = p.scratch(Q * W), summary_norm = p.scratch(Q * W), global_proj = p.scratch(W);
    p.linear(w.question_projection, p.wrap(ft.question_mean).span(), Q, b.span());
    const dev::Tensor summary = option_summaries(p, w, r, b.span(), first);
    p.norm(w.option_summary_norm, summary.span(), Q, summary_norm.span());
    p.linear(w.global_projection, p.wrap(ft.global).span(), 1, global_proj.span());
    p.s.copy(b.span(), f.span());
    p.s.add(f.span(), summary_norm.span());
    for (int64_t i = 0; i < Q; ++i) {
        p.s.add(f.at(i * W, W), global_proj.span());
        p.s.add(f.at(i * W, W), w.type_embedding.at(questions[i].type * W, W));
    }
    if (trace) {
        trace->question_projection = p.s.read(b.span());
        trace->option_summary_norm = p.s.read(summary_norm.span());
        trace->global_projection = p.s.read(global_proj.span());
    }
    return f;
}

// Field layers (pre-norm decoder layers): questions attend to each other, then to the raw memory.
void field_layers(const Pass& p, const Weights& w, const HeadFeatures& ft, dev::Span f, int64_t Q,
                  HeadTrace* trace) {
    const int64_t T = ft.length, W = w.cfg.width;
    const int heads = w.cfg.heads;
    dev::Tensor hold;
    const dev::Span mem = p.memory(ft, hold);
    const dev::Tensor fx = p.scratch(Q * W), ftmp = p.scratch(Q * W), qk = p.scratch(Q * W),
                      qv = p.scratch(Q * W), keys = p.scratch(w.reference ? T * W : 0),
                      values = p.scratch(w.reference ? T * W : 0);
    for (const FieldLayer& l : w.layers) {
        p.norm(l.norm1, f, Q, fx.span());
        memory_kv(p, l.self_attn, nullptr, fx.span(), Q, W, qk.span(), qv.span());
        attend(p, l.self_attn, heads, W, fx.span(), Q, qk.span(), qv.span(), Q, ftmp.span());
        p.s.add(f, ftmp.span());
        p.norm(l.norm2, f, Q, fx.span());
        if (!w.reference) {
            attend_memory(p, l.cross_attn, heads, W, fx.span(), Q, mem, T, ftmp.span());
        } else {
            memory_kv(p, l.cross_attn, nullptr, mem, T, W, keys.span(), values.span());
            attend(p, l.cross_attn, heads, W, fx.span(), Q, keys.span(), values.span(), T, ftmp.span());
        }
        p.s.add(f, ftmp.span());
        p.norm(l.norm3, f, Q, fx.span());
        feedforward(p, l.linear1, l.linear2, fx.span(), Q, ftmp.span());
        p.s.add(f, ftmp.span());
        if (trace) trace->layers.push_back(p.s.read(f));
    }
}

// The host's part of question i's logits: per option its lexical prior P · cos(lexical mean, q_i + g), its
// cosine with the field, and the residual scorer's input row [field | option | field * option | |field -
// option|] into feat (n rows of 4W); double sums of the normalised options and the field from the device.
void question_terms(const Weights& w, const HeadFeatures& ft, const float* options, const float* field,
                    int64_t i, const Rows& first, float* feat, float* prior, float* cosine) {
    const int64_t H = w.cfg.hidden_size, W = w.cfg.width, n = first[i + 1] - first[i];
    std::vector<double> anchor(static_cast<size_t>(H));  // normalize(q_i + g)
    double ss = 0.0;
    for (int64_t c = 0; c < H; ++c) {
        anchor[c] = static_cast<double>(ft.question_mean[i * H + c]) + ft.global[c];
        ss += anchor[c] * anchor[c];
    }
    const double anorm = std::max(std::sqrt(ss), kNormalizeEps);
    double fss = 0.0;
    for (int64_t c = 0; c < W; ++c) fss += static_cast<double>(field[c]) * field[c];
    const double fnorm = std::max(std::sqrt(fss), kCosineEps);
    for (int64_t j = 0; j < n; ++j) {
        const float* lex = ft.option_lexical.data() + (first[i] + j) * H;
        double lss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < H; ++c) {
            lss += static_cast<double>(lex[c]) * lex[c];
            dot += lex[c] * anchor[c];
        }
        prior[j] =
            static_cast<float>(w.prior_scale * dot / (std::max(std::sqrt(lss), kNormalizeEps) * anorm));
        const float* o = options + j * W;
        double oss = 0.0, fo = 0.0;
        float* fr = feat + j * 4 * W;
        for (int64_t c = 0; c < W; ++c) {
            oss += static_cast<double>(o[c]) * o[c];
            fo += static_cast<double>(field[c]) * o[c];
            fr[c] = field[c];
            fr[W + c] = o[c];
            fr[2 * W + c] = field[c] * o[c];
            fr[3 * W + c] = std::fabs(field[c] - o[c]);
        }
        cosine[j] = static_cast<float>(fo / (fnorm * std::max(std::sqrt(oss), kCosineEps)));
    }
}

// The logits of every question: lexical prior + gate · (J · cosine(field, option) + residual scorer). The
// normalised options and the fields come from the device in one copy, the cosines and the scorer's input rows
// are formed on the host in double, and the scorer runs on the device, its outputs back in a second copy.
std::vector<std::vector<float>> score_questions(const Pass& p, const Weights& w, const HeadFeatures& ft,
                                                dev::Span r, dev::Span field_rows, const Rows& first,
                                                HeadTrace* trace) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(first.size()) - 1, N = first.back();
    const dev::Tensor normed = p.scratch(N * W);
    for (int64_t i = 0; i < Q; ++i) {
        const int64_t n = first[i + 1] - first[i];
        p.norm(w.option_norm, r.at(first[i] * W, n * W), n, normed.at(first[i] * W, n * W));
    }
    std::vector<float> fields(static_cast<size_t>(Q * W)), options(static_cast<size_t>(N * W));
    p.s.fetch(fields.data(), field_rows);
    p.s.fetch(options.data(), normed.span());
    p.s.sync();
    if (trace) trace->field_norm = fields;
    std::vector<float> feat(static_cast<size_t>(N * 4 * W), 0.f), cosine(static_cast<size_t>(N)),
        prior(static_cast<size_t>(N));
    for (int64_t i = 0; i < Q; ++i)
        question_terms(w, ft, options.data() + first[i] * W, fields.data() + i * W, i, first,
                       feat.data() + first[i] * 4 * W, prior.data() + first[i], cosine.data() + first[i]);
    const dev::Tensor x = p.scratch(N * 4 * W), h = p.scratch(N * W), res = p.scratch(N);
    p.s.upload(x.span(), feat.data());
    for (int64_t i = 0; i < Q; ++i) {
        const int64_t n = first[i + 1] - first[i];
        p.linear(w.scorer_in, x.at(first[i] * 4 * W, n * 4 * W), n, h.at(first[i] * W, n * W));
        p.s.gelu(h.at(first[i] * W, n * W), n, false);
        p.linear(w.scorer_out, h.at(first[i] * W, n * W), n, res.at(first[i], n));
    }
    const std::vector<float> residual = p.s.read(res.span());
    std::vector<std::vector<float>> result;
    for (int64_t i = 0; i < Q; ++i) {
        std::vector<float> row;
        for (int64_t j = first[i]; j < first[i + 1]; ++j)
            row.push_back(prior[j] + w.gate * (w.joint_scale * cosine[j] + residual[j]));
        if (trace) {
            trace->option_norm.emplace_back(options.begin() + first[i] * W,
                                            options.begin() + first[i + 1] * W);
            trace->residual_scorer.emplace_back(residual.begin() + first[i], residual.begin() + first[i + 1]);
        }
        result.push_back(std::move(row));
    }
    return result;
}

}  // namespace

std::vector<std::vector<float>> JointHead::decide(const HeadFeatures& ft,
                                                  const std::vector<HeadQuestion>& questions,
                                                  HeadTrace* trace) const {
    const Weights& w = *w_;
    const int64_t T = ft.length;
    check_questions(T, questions);
    const int64_t H = w.cfg.hidden_size, W = w.cfg.width;
    const int64_t Q = static_cast<int64_t>(questions.size());
    Rows first(static_cast<size_t>(Q) + 1, 0);
    for (int64_t i = 0; i < Q; ++i)
        first[i + 1] = first[i] + static_cast<int64_t>(questions[i].option_spans.size());
    const int64_t N = first.back();
    const size_t memory =
        ft.memory_on_device.empty() ? ft.memory.size() : static_cast<size_t>(ft.memory_on_device.size());
    if (memory != static_cast<size_t>(T * W) || ft.global.size() != static_cast<size_t>(H) ||
        ft.question_mean.size() != static_cast<size_t>(Q * H) ||
        ft.option_context.size() != static_cast<size_t>(N * H) ||
        ft.option_lexical.size() != static_cast<size_t>(N * H))
        throw Error("joint head: features do not match the questions");
    const std::unique_ptr<dev::Stream> stream = w.stream();
    const Pass p{*stream, *w.dev};
    if (trace) {
        *trace = HeadTrace{};
        trace->memory_projection =
            ft.memory_on_device.empty() ? ft.memory : p.s.read(ft.memory_on_device.span());
    }
    const dev::Tensor r = option_queries(p, w, ft, first);
    route_evidence(p, w, ft, r.span(), N, trace);
    const dev::Tensor f = field_vectors(p, w, ft, r.span(), questions, first, trace);
    field_layers(p, w, ft, f.span(), Q, trace);
    const dev::Tensor field_rows = p.scratch(Q * W);
    p.norm(w.field_norm, f.span(), Q, field_rows.span());
    return score_questions(p, w, ft, r.span(), field_rows.span(), first, trace);
}

}  // namespace clef
