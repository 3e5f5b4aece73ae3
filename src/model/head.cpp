#include "model/head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "device/linear.h"
#include "model/tensors.h"
#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/gemm.h"
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

// A torch.nn.Linear is model/linear.h's Linear: fp32 weights packed once (Precision::Exact) on the fast path,
// the scalar ops::linear on a head loaded with reference = true.
using Dense = Linear;

// A torch.nn.LayerNorm with affine weight and bias, eps 1e-5 (model/linear.h).
using Norm = LayerNorm;

// A torch.nn.MultiheadAttention: packed in-projection rows [q; k; v] with bias, then out_proj.
struct Attn {
    Dense q, k, v;  // the rows [0, W), [W, 2W), [2W, 3W) of in_proj_weight / in_proj_bias
    Dense out;
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

// Takes tensors out of the head file by name with their expected shape, and remembers which were used.
class TensorTaker {
public:
    TensorTaker(const WeightSource& f, bool pack) : f_(f), pack_(pack) {}

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
    std::vector<float> param(const ModuleRef& m) { return take(m.weight, m.shape); }
    Dense dense(const ModuleRef& m) {
        const int64_t out = m.shape[0], in = m.shape[1];
        std::vector<float> w = take(m.weight, m.shape);
        return Dense(std::move(w), out, in, path(),
                     m.bias.empty() ? std::vector<float>{} : take(m.bias, {out}));
    }
    Norm norm(const ModuleRef& m) {
        Norm n;
        n.weight = take(m.weight, m.shape);
        n.bias = take(m.bias, m.shape);
        return n;
    }
    // A MultiheadAttention: the packed in-projection in_proj and its out_proj.
    Attn attn(const ModuleRef& in_proj, const ModuleRef& out_proj) {
        Attn a;
        const int64_t w = in_proj.shape[1];
        const std::vector<float> in_w = take(in_proj.weight, in_proj.shape);
        const std::vector<float> in_b = take(in_proj.bias, {3 * w});
        Dense* parts[3] = {&a.q, &a.k, &a.v};
        for (int i = 0; i < 3; ++i)
            *parts[i] = Dense(std::vector<float>(in_w.begin() + i * w * w, in_w.begin() + (i + 1) * w * w), w,
                              w, path(), std::vector<float>(in_b.begin() + i * w, in_b.begin() + (i + 1) * w),
                              /*keep_f32=*/i > 0);  // attend_memory reads k's and v's rows
        a.out = dense(out_proj);
        return a;
    }
    LinearPath path() const { return pack_ ? LinearPath::Fast : LinearPath::Reference; }
    // Strict load: every tensor of the file must have been taken.
    void check_all_used() const {
        for (const std::string& name : f_.names())
            if (!used_.count(name)) throw Error(f_.description() + ": joint head: unexpected tensor " + name);
    }

private:
    const WeightSource& f_;
    bool pack_;
    std::set<std::string> used_;
};

}  // namespace

struct JointHead::Weights {
    HeadConfig cfg;
    TensorView lm_head;  // mapped, not copied (unless lm_quant holds the table)
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
    std::vector<float> type_embedding;  // [3][W]
    std::vector<RoutingLayer> routing;
    Norm option_summary_norm;
    std::vector<FieldLayer> layers;
    Norm field_norm, option_norm;
    Dense scorer_in, scorer_out;  // residual_scorer.0, residual_scorer.3
    float prior_scale = 0.f, joint_scale = 0.f, gate = 0.f;
};

namespace {

using Weights = JointHead::Weights;

// K and V rows of an attention over `rows` memory rows, optionally LayerNorm-ed first (block by block, so no
// normalised copy of the whole memory is kept).
void memory_kv(const Attn& a, const Norm* norm, const float* mem, int64_t rows, int64_t W, float* k,
               float* v) {
    std::vector<float> normed;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        const int64_t n = std::min(kRowBlock, rows - r0);
        const float* x = mem + r0 * W;
        if (norm) {
            normed.resize(static_cast<size_t>(n * W));
            norm->forward(x, n, normed.data());
            x = normed.data();
        }
        a.k.forward(x, n, k + r0 * W);
        a.v.forward(x, n, v + r0 * W);
    }
}

// out[lq][W] = MHA(xq, keys, values) given the projected K and V rows; no masks.
void attend(const Attn& a, int heads, int64_t W, const float* xq, int64_t lq, const float* k, const float* v,
            int64_t lk, float* out) {
    std::vector<float> q(static_cast<size_t>(lq * W)), ctx(static_cast<size_t>(lq * W));
    a.q.forward(xq, lq, q.data());
    const int dh = static_cast<int>(W / heads);
    ops::attention(q.data(), W, k, W, v, W, lq, lk, heads, heads, dh, 1.f / std::sqrt(static_cast<float>(dh)),
                   false, ctx.data(), W);
    a.out.forward(ctx.data(), lq, out);
}

// Fast form of memory_kv + attend for memory rows `mem` [T][W] (already normalised if the layer norms them),
// equal up to rounding: per head h, q_h·(W_k,h m + b_k,h) = (W_k,hᵀ q_h)·m + a constant (the constant cancels
// in the softmax), and Σ_j p_j (W_v,h m_j + b_v,h) = W_v,h (Σ_j p_j m_j) + b_v,h since Σ_j p_j = 1. The T
// memory rows are never projected: O(T·W·heads·lq) work instead of O(T·W²).
void attend_memory(const Attn& a, int heads, int64_t W, const float* xq, int64_t lq, const float* mem,
                   int64_t T, float* out) {
    const int64_t dh = W / heads, R = lq * heads;
    std::vector<float> q(static_cast<size_t>(lq * W)), qt(static_cast<size_t>(R * W)),
        ctx(static_cast<size_t>(R * W)), ch(static_cast<size_t>(lq * W)), oh(static_cast<size_t>(lq * dh)),
        o(static_cast<size_t>(lq * W));
    a.q.forward(xq, lq, q.data());
    const float scale = 1.f / std::sqrt(static_cast<float>(dh));
    // Row (i, h) of qt = scale · q_i,h · W_k,h: the query of head h in memory space ([lq][heads][W]).
    for (int64_t h = 0; h < heads; ++h)
        ops::small_gemm_acc(lq, W, dh, scale, q.data() + h * dh, W, a.k.f32() + h * dh * W, W,
                            qt.data() + h * W, heads * W);
    // heads query heads of width W over one kv head, the memory rows as keys and values.
    ops::attention_fast(qt.data(), heads * W, mem, W, mem, W, lq, T, heads, 1, static_cast<int>(W), 1.f,
                        false, ctx.data(), heads * W);
    for (int64_t h = 0; h < heads; ++h) {  // o_i,h = W_v,h · ctx_i,h + b_v,h
        for (int64_t i = 0; i < lq; ++i) std::copy_n(ctx.data() + (i * heads + h) * W, W, ch.data() + i * W);
        ops::linear(ch.data(), lq, W, a.v.f32() + h * dh * W, dh, a.v.bias().data() + h * dh, oh.data());
        for (int64_t i = 0; i < lq; ++i) std::copy_n(oh.data() + i * dh, dh, o.data() + i * W + h * dh);
    }
    a.out.forward(o.data(), lq, out);
}

// Feed-forward block with exact GELU: out = second(gelu(first(x))).
void feedforward(const Dense& first, const Dense& second, const float* x, int64_t rows, float* out) {
    std::vector<float> h(static_cast<size_t>(rows * first.out()));
    first.forward(x, rows, h.data());
    ops::gelu_erf_inplace(h.data(), static_cast<int64_t>(h.size()));
    second.forward(h.data(), rows, out);
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
                     bool reference)
    : JointHead(cfg, head_weights, reference, [&lm_head](Weights& w) {
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
                     bool reference)
    : JointHead(cfg, head_weights, reference, [&lm_head](Weights& w) {
          if (lm_head.cols != w.cfg.hidden_size)
              throw Error("lm_head: has " + std::to_string(lm_head.cols) + " columns, expected hidden_size " +
                          std::to_string(w.cfg.hidden_size));
          lm_head.validate("lm_head");
          w.lm_quant = std::make_unique<QuantMatrix>(lm_head);
          w.vocab = lm_head.rows;
      }) {}

JointHead::JointHead(const HeadConfig& cfg, const WeightSource& head_weights, bool reference,
                     const std::function<void(Weights&)>& set_lexical) {
    const std::string& path = head_weights.description();
    if (cfg.hidden_size <= 0 || cfg.width <= 0 || cfg.heads <= 0 || cfg.feedforward <= 0 ||
        cfg.routing_layers < 0 || cfg.layers < 0)
        throw Error(path + ": joint head: config has a non-positive size");
    if (cfg.width % cfg.heads != 0)
        throw Error(path + ": joint head: width " + std::to_string(cfg.width) +
                    " is not divisible by heads " + std::to_string(cfg.heads));
    auto w = std::make_shared<Weights>();
    w->cfg = cfg;
    set_lexical(*w);

    TensorTaker t(head_weights, !reference);
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
    out_.memory.assign(static_cast<size_t>(T * W), 0.f);
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
    const int64_t H = w_->cfg.hidden_size, W = w_->cfg.width;
    normed_.resize(static_cast<size_t>(n * H));
    w_->hidden_norm.forward(rows, n, normed_.data());
    w_->memory_projection.forward(normed_.data(), n, out_.memory.data() + done_ * W);
    const int64_t first = done_, last = done_ + n;
    for (const Span& s : spans_) {
        const int64_t b = std::max(s.begin, first), e = std::min(s.end, last);
        double* sum = sums_.data() + s.slot * H;
        for (int64_t p = b; p < e; ++p) {
            const float* x = normed_.data() + (p - first) * H;
            for (int64_t c = 0; c < H; ++c) sum[c] += x[c];
        }
    }
    if (last == T_) std::copy_n(normed_.data() + (n - 1) * H, H, out_.global.data());
    done_ = last;
}

void HeadFeatureBuilder::restore_memory(const float* memory_rows, int64_t n) {
    if (n < 0 || done_ + n > T_) throw Error("joint head: restored rows past the end of the prompt");
    for (const Span& s : spans_)
        if (s.begin < done_ + n)
            throw Error("joint head: a restored prefix covers a question or option span");
    const int64_t W = w_->cfg.width;
    std::copy_n(memory_rows, n * W, out_.memory.data() + done_ * W);
    done_ += n;
}

const float* HeadFeatureBuilder::memory_rows(int64_t first) const {
    return out_.memory.data() + first * w_->cfg.width;
}

HeadFeatures HeadFeatureBuilder::finish() {
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
std::vector<float> option_queries(const Weights& w, const HeadFeatures& ft, const Rows& first) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(first.size()) - 1, N = first.back();
    std::vector<float> r(static_cast<size_t>(N * W)), tmp(static_cast<size_t>(N * W));
    w.option_context_projection.forward(ft.option_context.data(), N, r.data());
    w.option_lexical_projection.forward(ft.option_lexical.data(), N, tmp.data());
    ops::add_inplace(r.data(), tmp.data(), r.size());
    std::vector<float> oq(static_cast<size_t>(Q * W));
    w.option_question_projection.forward(ft.question_mean.data(), Q, oq.data());
    for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = first[i]; j < first[i + 1]; ++j)
            ops::add_inplace(r.data() + j * W, oq.data() + i * W, W);
    return r;
}

// Evidence routing: options cross-attend to their own LayerNorm of the memory, then a feed-forward block.
void route_evidence(const Weights& w, const HeadFeatures& ft, std::vector<float>& r, int64_t N,
                    HeadTrace* trace) {
    const int64_t T = ft.length, W = w.cfg.width;
    std::vector<float> keys(static_cast<size_t>(T * W)), values(static_cast<size_t>(T * W));
    std::vector<float> x(static_cast<size_t>(N * W)), tmp(static_cast<size_t>(N * W));
    for (const RoutingLayer& l : w.routing) {
        l.query_norm.forward(r.data(), N, x.data());
        if (l.attention.k.has_fast()) {  // fast path: keys holds the normalised memory
            l.memory_norm.forward(ft.memory.data(), T, keys.data());
            attend_memory(l.attention, w.cfg.heads, W, x.data(), N, keys.data(), T, tmp.data());
        } else {
            memory_kv(l.attention, &l.memory_norm, ft.memory.data(), T, W, keys.data(), values.data());
            attend(l.attention, w.cfg.heads, W, x.data(), N, keys.data(), values.data(), T, tmp.data());
        }
        ops::add_inplace(r.data(), tmp.data(), r.size());
        l.feedforward_norm.forward(r.data(), N, x.data());
        feedforward(l.ff_in, l.ff_out, x.data(), N, tmp.data());
        ops::add_inplace(r.data(), tmp.data(), r.size());
        if (trace) trace->evidence_layers.push_back(r);
    }
}

// Option summaries: per question, attention of b_i over its options r (keys and values), scale 1/sqrt(W).
std::vector<float> option_summaries(const Weights& w, const std::vector<float>& r,
                                    const std::vector<float>& b, const Rows& first) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(first.size()) - 1;
    std::vector<float> summary(static_cast<size_t>(Q * W), 0.f);
    const float inv_sqrt_w = 1.f / std::sqrt(static_cast<float>(W));
    const int d = static_cast<int>(W);
    for (int64_t i = 0; i < Q; ++i) {
        const float* ri = r.data() + first[i] * W;
        ops::attention(b.data() + i * W, W, ri, W, ri, W, 1, first[i + 1] - first[i], 1, 1, d, inv_sqrt_w,
                       false, summary.data() + i * W, W);
    }
    return summary;
}

// Field vectors f = b + LN_sum(s) + W_g·g + T[type], b = W_q·q.
std::vector<float> field_vectors(const Weights& w, const HeadFeatures& ft, const std::vector<float>& r,
                                 const std::vector<HeadQuestion>& questions, const Rows& first,
                                 HeadTrace* trace) {
    const int64_t W = w.cfg.width, Q = static_cast<int64_t>(questions.size());
    std::vector<float> b(static_cast<size_t>(Q * W));
    w.question_projection.forward(ft.question_mean.data(), Q, b.data());
    const std::vector<float> summary = option_summaries(w, r, b, first);
    std::vector<float> f(static_cast<size_t>(Q * W)), summary_norm(static_cast<size_t>(Q * W)),
        global_proj(static_cast<size_t>(W));
    w.option_summary_norm.forward(summary.data(), Q, summary_norm.data());
    w.global_projection.forward(ft.global.data(), 1, global_proj.data());
    for (int64_t i = 0; i < Q; ++i)
        for (int64_t c = 0; c < W; ++c)
            f[i * W + c] = b[i * W + c] + summary_norm[i * W + c] + global_proj[c] +
                           w.type_embedding[questions[i].type * W + c];
    if (trace) {
        trace->question_projection = b;
        trace->option_summary_norm = summary_norm;
        trace->global_projection = global_proj;
    }
    return f;
}

// Field layers (pre-norm decoder layers): questions attend to each other, then to the raw memory.
void field_layers(const Weights& w, const HeadFeatures& ft, std::vector<float>& f, int64_t Q,
                  HeadTrace* trace) {
    const int64_t T = ft.length, W = w.cfg.width;
    const int heads = w.cfg.heads;
    std::vector<float> fx(static_cast<size_t>(Q * W)), ftmp(static_cast<size_t>(Q * W));
    std::vector<float> qk(static_cast<size_t>(Q * W)), qv(static_cast<size_t>(Q * W));
    std::vector<float> keys, values;
    for (const FieldLayer& l : w.layers) {
        l.norm1.forward(f.data(), Q, fx.data());
        memory_kv(l.self_attn, nullptr, fx.data(), Q, W, qk.data(), qv.data());
        attend(l.self_attn, heads, W, fx.data(), Q, qk.data(), qv.data(), Q, ftmp.data());
        ops::add_inplace(f.data(), ftmp.data(), f.size());
        l.norm2.forward(f.data(), Q, fx.data());
        if (l.cross_attn.k.has_fast()) {
            attend_memory(l.cross_attn, heads, W, fx.data(), Q, ft.memory.data(), T, ftmp.data());
        } else {
            keys.resize(static_cast<size_t>(T * W));
            values.resize(static_cast<size_t>(T * W));
            memory_kv(l.cross_attn, nullptr, ft.memory.data(), T, W, keys.data(), values.data());
            attend(l.cross_attn, heads, W, fx.data(), Q, keys.data(), values.data(), T, ftmp.data());
        }
        ops::add_inplace(f.data(), ftmp.data(), f.size());
        l.norm3.forward(f.data(), Q, fx.data());
        feedforward(l.linear1, l.linear2, fx.data(), Q, ftmp.data());
        ops::add_inplace(f.data(), ftmp.data(), f.size());
        if (trace) trace->layers.push_back(f);
    }
}

// The logits of question i: lexical prior + gate · (J · cosine(field, option) + residual scorer).
std::vector<float> score_question(const Weights& w, const HeadFeatures& ft, const std::vector<float>& r,
                                  const float* field, int64_t i, const Rows& first, HeadTrace* trace) {
    const int64_t H = w.cfg.hidden_size, W = w.cfg.width, n = first[i + 1] - first[i];
    std::vector<double> anchor(static_cast<size_t>(H));  // normalize(q_i + g)
    double ss = 0.0;
    for (int64_t c = 0; c < H; ++c) {
        anchor[c] = static_cast<double>(ft.question_mean[i * H + c]) + ft.global[c];
        ss += anchor[c] * anchor[c];
    }
    const double anorm = std::max(std::sqrt(ss), kNormalizeEps);
    std::vector<float> options(static_cast<size_t>(n * W));
    w.option_norm.forward(r.data() + first[i] * W, n, options.data());
    double fss = 0.0;
    for (int64_t c = 0; c < W; ++c) fss += static_cast<double>(field[c]) * field[c];
    const double fnorm = std::max(std::sqrt(fss), kCosineEps);

    std::vector<float> feat(static_cast<size_t>(n * 4 * W), 0.f), cosine(static_cast<size_t>(n)),
        prior(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
        const float* lex = ft.option_lexical.data() + (first[i] + j) * H;
        double lss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < H; ++c) {
            lss += static_cast<double>(lex[c]) * lex[c];
            dot += lex[c] * anchor[c];
        }
        prior[j] =
            static_cast<float>(w.prior_scale * dot / (std::max(std::sqrt(lss), kNormalizeEps) * anorm));
        const float* o = options.data() + j * W;
        double oss = 0.0, fo = 0.0;
        float* fr = feat.data() + j * 4 * W;
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
    std::vector<float> residual(static_cast<size_t>(n)), h(static_cast<size_t>(n * W));
    w.scorer_in.forward(feat.data(), n, h.data());
    ops::gelu_erf_inplace(h.data(), n * W);
    w.scorer_out.forward(h.data(), n, residual.data());
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) row[j] = prior[j] + w.gate * (w.joint_scale * cosine[j] + residual[j]);
    if (trace) {
        trace->option_norm.push_back(std::move(options));
        trace->residual_scorer.push_back(residual);
    }
    return row;
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
    if (ft.memory.size() != static_cast<size_t>(T * W) || ft.global.size() != static_cast<size_t>(H) ||
        ft.question_mean.size() != static_cast<size_t>(Q * H) ||
        ft.option_context.size() != static_cast<size_t>(N * H) ||
        ft.option_lexical.size() != static_cast<size_t>(N * H))
        throw Error("joint head: features do not match the questions");
    if (trace) {
        *trace = HeadTrace{};
        trace->memory_projection = ft.memory;
    }
    std::vector<float> r = option_queries(w, ft, first);
    route_evidence(w, ft, r, N, trace);
    std::vector<float> f = field_vectors(w, ft, r, questions, first, trace);
    field_layers(w, ft, f, Q, trace);
    std::vector<float> fields(static_cast<size_t>(Q * W));
    w.field_norm.forward(f.data(), Q, fields.data());
    if (trace) trace->field_norm = fields;
    std::vector<std::vector<float>> result;
    for (int64_t i = 0; i < Q; ++i)
        result.push_back(score_question(w, ft, r, fields.data() + i * W, i, first, trace));
    return result;
}

}  // namespace clef
