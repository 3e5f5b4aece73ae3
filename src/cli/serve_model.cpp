#include "cli/serve_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/model_card.h"
#include "model/serve_plan.h"
#include "tools/make_model.h"
#include "util/error.h"
#include "util/memory.h"
#include "util/text.h"

namespace clef {

namespace {

// On a Vulkan device: what --gpu-memory (or the device's memory less 10 %) leaves beside the weights the
// device plan puts there, and a decision's device need (its state and activations).
void device_budget(DecisionMemoryBudget& m, const ServeModel& s, const MemoryPlanner& planner,
                   MemoryPlanInput base, const Engine& e) {
    const dev::Device& d = e.device();
    if (d.is_cpu()) return;
    const uint64_t limit = gpu_memory_budget(s.load, d);
    if (limit == 0) return;  // no bound known: decisions that do not fit get 503 from the device
    base.device = true;
    base.device_layers = e.backbone().device_layers();
    base.device_max_buffer = d.memory().max_buffer;
    const uint64_t weights = planner(base).device->weights();
    m.device_budget = limit > weights ? limit - weights : 0;
    m.device_limit = fmt::format("{} {} MiB less the weights' {} MiB",
                                 s.load.gpu_memory > 0 ? "--gpu-memory" : "the device's memory less 10 %:",
                                 with_thousands(static_cast<int64_t>(limit >> 20)),
                                 with_thousands(static_cast<int64_t>(weights >> 20)));
    m.device_need = [planner, base](int64_t tokens) {
        MemoryPlanInput in = base;
        in.tokens = std::max<int64_t>(tokens, 1);
        in.schema_tokens = std::min(in.schema_tokens, in.tokens);
        const DevicePlan p = *planner(in).device;
        return p.state + p.activations;
    };
}

// The memory left for decisions once the model is loaded: the limit less the weights as held and the state
// cache's budget; each decision's need is its memory plan (model/serve_plan.h).
DecisionMemoryBudget memory_budget(const ServeModel& s, const Engine& e) {
    const LoadOptions& lo = s.load;
    const MemoryPlanner planner = memory_planner(s.dir, s.head);
    MemoryPlanInput base = machine_plan_input(1, s.backbone);
    base.unpack_quantised = lo.unpack_quantised;
    const uint64_t weights = planner(base).weights.total();
    const int64_t limit_mib = s.memory_limit_mib;
    const uint64_t limit = limit_mib >= 0 ? static_cast<uint64_t>(limit_mib) << 20 : memory_limit_bytes();
    DecisionMemoryBudget m;
    const uint64_t fixed = weights + lo.cache_bytes;
    m.budget = limit > fixed ? limit - fixed : 0;
    m.limit = fmt::format("{} {} MiB, less the weights' {} MiB and the state cache's {} MiB",
                          limit_mib >= 0 ? "--memory-limit-mib" : "this machine's memory",
                          with_thousands(static_cast<int64_t>(limit >> 20)),
                          with_thousands(static_cast<int64_t>(weights >> 20)),
                          with_thousands(static_cast<int64_t>(lo.cache_bytes >> 20)));
    m.need = [planner, base](int64_t tokens) {
        MemoryPlanInput in = base;
        in.tokens = std::max<int64_t>(tokens, 1);
        in.schema_tokens = std::min(in.schema_tokens, in.tokens);
        return planner(in).decision.peak;
    };
    device_budget(m, s, planner, base, e);
    return m;
}

}  // namespace

Server::Loader serve_loader(ServeModel s) {
    return [s] {
        LoadedModel m(Engine::load(s.dir, s.head, s.load), describe_model(s.dir, s.head, s.load.mmproj));
        if (s.demo) m.card->file_name.clear();
        const int64_t context = m.engine->config().text.context_length();
        if (context > 0 && s.max_tokens > context)
            throw Error(fmt::format("--max-tokens {} exceeds the model's context of {} tokens", s.max_tokens,
                                    context));
        m.memory = memory_budget(s, *m.engine);
        return m;
    };
}

void make_demo_model(const std::string& dir) {
    MakeModelOptions mk;
    mk.preset = "tiny";
    mk.seed = 20261201;
    mk.vision = false;
    make_model(mk, dir);
}

}  // namespace clef
