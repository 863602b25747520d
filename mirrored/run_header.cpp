#include "mirrored/run_header.h"

#include <algorithm>
#include <vector>

#include "base/io.h"
#include "base/output.h"
#include "mirrored/software.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

// "every 1000 steps and every 30 min": when checkpoints are written (the last step and a stop too).
std::string checkpoint_policy(const CheckpointConfig& k) {
    std::vector<std::string> when;
    if (k.every_steps > 0) when.push_back("every " + std::to_string(k.every_steps) + " steps");
    if (k.every_epochs > 0) when.push_back("every " + std::to_string(k.every_epochs) + " epoch(s)");
    if (k.every_minutes > 0) when.push_back("every " + number_str(k.every_minutes) + " min");
    std::string s;
    for (size_t i = 0; i < when.size(); ++i) s += (i ? i + 1 == when.size() ? " and " : ", " : "") + when[i];
    return s.empty() ? "at the end and on a stop only" : s;
}

// shard: gradients where its staging slots outweigh the saving. A slot holds a bucket whole and
// a bucket splits only between gradient pieces (a dense weight's blocks of rows; any other tensor
// whole): where the buckets are larger than the largest piece, smaller buckets help; where that
// piece fills a bucket alone, shard: optimizer keeps less.
void print_staging_note(std::FILE* out, const MirroredStrategy& st) {
    const Model& model = st.model();
    const uint64_t whole = uint64_t(model.grad_size()) * sizeof(float);
    if (st.memory_plan().grads <= whole) return;
    size_t piece = 0, at = 0;  // the largest piece, floats, and its offset
    for (const GradientPiece& p : model.gradient_pieces())
        if (p.end - p.begin > piece) piece = p.end - p.begin, at = p.begin;
    const TensorInfo* tensor = nullptr;
    for (const TensorInfo& t : model.tensors())
        if (t.trainable && at >= t.offset && at < t.offset + t.count) tensor = &t;
    if (!tensor) return;
    size_t bucket = 0;  // the largest trainable bucket, floats
    for (const Bucket& b : st.buckets())
        if (b.begin < model.trainable_size()) bucket = std::max(bucket, b.end - b.begin);
    // a block of a split weight is about a bucket: smaller buckets make smaller blocks
    const bool smaller_buckets_help = bucket > 2 * piece || piece < tensor->count;
    std::fprintf(out,
                 "  note: shard: gradients keeps more gradient memory here than unsharded (%s against %s): its "
                 "staging slots (%s) each hold a bucket whole, the largest bucket is %s, and a bucket splits only "
                 "a dense layer's weight, by rows (the largest piece, of %s, is %s); %s\n",
                 format_bytes(st.memory_plan().grads).c_str(), format_bytes(whole).c_str(),
                 format_bytes(uint64_t(st.gradient_slot_floats()) * sizeof(float)).c_str(),
                 format_bytes(uint64_t(bucket) * sizeof(float)).c_str(), tensor->name.c_str(),
                 format_bytes(uint64_t(piece) * sizeof(float)).c_str(),
                 smaller_buckets_help ? "a smaller strategy.bucket_mb makes smaller slots"
                                      : "that piece fills its slot alone, so strategy.shard: optimizer keeps less "
                                        "on this model");
}

// How the strategy runs: the ops `auto` chose, shared parameters, captured steps - each when it
// applies, and why not when the config asked for it and it does not.
void print_strategy_choices(std::FILE* out, const Config& cfg, const MirroredStrategy& st) {
    if (!st.cross_device_ops_choice().empty())
        std::fprintf(out, "  cross-device ops: %s\n", st.cross_device_ops_choice().c_str());
    if (st.shared_parameters())
        std::fprintf(out,
                     "  shared parameters: the %s keep one parameter copy; each sums its slice of the gradients over "
                     "the replicas and updates that slice\n",
                     st.device_traits().one_memory ? "CPU replicas" : "replicas on one GPU");
    else if (cfg.strategy.shared_parameters && st.replicas() > 1)
        std::fprintf(
            out,
            "  shared parameters apply to replicas in one memory (CPU replicas, or replicas sharing one GPU on "
            "one node): each of these replicas keeps its own copy\n");
    if (st.sharded_optimizer())
        std::fprintf(out,
                     "  shard: %s - each replica keeps the optimizer state of its own chunk of every gradient "
                     "bucket (%s of %s); gradients are reduce-scattered, the updated parameters all-gathered\n",
                     st.sharded_gradients() ? "gradients" : "optimizer",
                     format_bytes(st.memory_plan().optimizer).c_str(),
                     format_bytes(uint64_t(st.model().trainable_size()) * sizeof(float) *
                                  uint64_t(optimizer_state_buffers(cfg.optimizer)))
                         .c_str());
    if (st.sharded_gradients()) {
        std::fprintf(out,
                     "  and gradients: each replica keeps only its own chunks' summed gradients, backward writing "
                     "the buckets into %d reused staging slot(s) (gradients %s per replica, unsharded %s)\n",
                     st.gradient_slots(), format_bytes(st.memory_plan().grads).c_str(),
                     format_bytes(uint64_t(st.model().grad_size()) * sizeof(float)).c_str());
        print_staging_note(out, st);
    } else if (cfg.strategy.shard != StrategyConfig::Shard::none && st.shared_parameters()) {
        std::fprintf(out,
                     "  shard: %s - the shared parameter copy's optimizer state is already held once, "
                     "each replica updating its slice; the gradients stay whole per replica (summed in place by "
                     "slices)\n",
                     shard_name(cfg.strategy.shard));
    }
    if (st.cuda_graph())
        std::fprintf(out,
                     "  cuda_graph: each step shape is captured once and replayed with one launch (not yet measured on "
                     "a GPU)\n");
    if (st.cuda_graph() && st.device_traits().gpu && std::string(st.cross_device_ops_name()) == "nccl")
        std::fprintf(out,
                     "  cuda_graph with nccl: NCCL documents that capturing several GPUs of one process can deadlock "
                     "in a graph launch; the watchdog stops a run that hangs, and the ring needs no NCCL\n");
    else if (!st.cuda_graph_note().empty())
        std::fprintf(out, "  cuda_graph is off: %s\n", st.cuda_graph_note().c_str());
    if (cfg.strategy.fused_epilogues) std::fprintf(out, "  fused_epilogues: %s\n", st.device_traits().fused_epilogues);
}

}  // namespace

void print_run_header(std::FILE* out, const Session& session, Nodes* nodes, const std::string& output_dir,
                      const std::string& continued_without) {
    const Config& cfg = session.cfg;
    const MirroredStrategy& st = *session.strategy;
    const DeviceTraits& traits = st.device_traits();
    const char* kind = traits.display;
    // Every node's devices: collected on every node, printed by node 0.
    const std::vector<std::string> node_devices =
        nodes ? nodes->all_gather(
                    nodes->host() + ": " + st.devices().describe() + ", " + st.replica(0).device->description(),
                    "the exchange of the nodes' devices")
              : std::vector<std::string>{};
    const std::string where = nodes ? std::to_string(nodes->count()) + " nodes x " : std::string();
    std::fprintf(out, "mirrored: run '%s' on %s%d %s replica(s) [%s], cross-device ops %s, %zu bucket(s)\n",
                 cfg.run.name.c_str(), where.c_str(), st.replicas(), kind, st.devices().describe().c_str(),
                 st.cross_device_ops_name(), st.buckets().size());
    if (nodes) {
        std::fprintf(out,
                     "  %d replicas in all over %s; node k's replica r is replica k x %d + r; gradients summed in the "
                     "node, then between the nodes\n",
                     st.all_replicas(), Nodes::library().c_str(), st.replicas());
        for (size_t k = 0; k < node_devices.size(); ++k)
            std::fprintf(out, "  node %zu: %s\n", k, node_devices[k].c_str());
    }
    std::fprintf(out, "  software: %s\n", software_line().c_str());
    print_strategy_choices(out, cfg, st);
    if (!traits.gpu && cuda_status().state != CudaStatus::State::ok)
        std::fprintf(out, "  no GPU: %s\n", cuda_unavailable_reason().c_str());
    if (*traits.note) std::fprintf(out, "  %s\n", traits.note);
    for (int r = 0; r < st.replicas(); ++r)
        if (r == 0 || !traits.replicas_alike)
            std::fprintf(out, "  replica %d: %s\n", r, st.replica(r).device->description().c_str());
    const std::string topo = st.topology_report();
    if (!topo.empty()) std::fprintf(out, "  %s", topo.c_str());
    std::fprintf(out,
                 "  data: %s, %zu train / %zu test samples of %s, %d classes; global batch %d (%d per replica%s), %lld "
                 "steps per epoch\n",
                 cfg.data.dataset.c_str(), session.data->train.count(), session.data->test.count(),
                 shape_str(session.data->train.shape).c_str(), session.data->train.classes, cfg.train.global_batch_size,
                 cfg.train.global_batch_size / st.all_replicas(),
                 cfg.train.grad_accumulation_steps > 1
                     ? (", " + std::to_string(cfg.train.grad_accumulation_steps) + " micro-batches").c_str()
                     : "",
                 static_cast<long long>(session.train_loader->batches_per_epoch()));
    std::fprintf(out, "  model:\n%s", session.model->summary().c_str());
    const Device& d0 = *st.replica(0).device;
    std::fprintf(
        out, "  precision %s, gradients all-reduced in %s; memory per replica: planned %s; allocated %s (measured)%s\n",
        precision_name(cfg.train.precision), dtype_name(cfg.strategy.allreduce_dtype),
        st.memory_plan().describe().c_str(), format_bytes(d0.allocated_bytes()).c_str(),
        traits.gpu ? ("; " + format_bytes(d0.memory_in_use()) + " in use on the GPU").c_str() : "");
    std::fprintf(out, "  output: %s; checkpoints %s, the newest %d kept\n", output_dir.c_str(),
                 checkpoint_policy(cfg.checkpoint).c_str(), cfg.checkpoint.keep);
    if (cfg.strategy.continue_on_failure)
        std::fprintf(out,
                     "  on a device's fault: continue on the others from the last checkpoint (at least %d "
                     "replica%s)\n",
                     cfg.strategy.min_replicas, cfg.strategy.min_replicas == 1 ? "" : "s");
    if (!continued_without.empty())
        std::fprintf(out, "  continuing without %s, which failed\n", continued_without.c_str());
    std::fflush(out);
}

}  // namespace mirrored
