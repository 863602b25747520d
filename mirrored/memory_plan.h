// What a set of replicas plans before it allocates anything: the gradients' buckets and their
// staging, the pieces a model is laid out in, whether replicas share one parameter copy, the
// micro-batches' rows, and the memory one replica will allocate (checked against the device,
// reported at start-up, priced by `mirrored plan`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backends.h"
#include "kernels/device.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "mirrored/strategy_config.h"

namespace mirrored {

// The memory one replica will allocate, by purpose, in bytes: checked against what the machine
// has before anything is allocated, and reported at start-up.
struct MemoryPlan {
    uint64_t params = 0, grads = 0, optimizer = 0, activations = 0, inputs = 0, workspace = 0;
    uint64_t weight_copy = 0;  // bf16/fp16: the weights in the activation type
    uint64_t wire = 0;         // allreduce_dtype bf16: the gradients' 16-bit copy
    uint64_t total() const {
        return params + grads + optimizer + activations + inputs + workspace + weight_copy + wire;
    }
    std::string describe() const;  // "params 1.2 MiB, grads ..., total ..."
};
// A contiguous range of the flat gradient buffer, reduced as one unit.
struct Bucket {
    size_t begin = 0, end = 0;  // floats
    int ready_after_unit = 0;   // backward has produced all of it once this gradient unit is done
};
// The trainable region in buckets of about bucket_mb in reverse layer order (0: one bucket), then
// the state region (batch statistics) as a last bucket reduced after backward (ready_after_unit
// -1).
std::vector<Bucket> make_buckets(const Model& model, double bucket_mb);
// The gradient pieces (Model's gradient_piece_floats) a model for this strategy is built with:
// where gradients are staged (shard: gradients, several replicas with their own parameters) a
// bucket's floats, so that a dense layer's weight is written and reduced a bucket at a time and a
// staging slot need not hold it whole; else 0 (whole tensors). shared: parameters_shared().
size_t gradient_piece_floats(const StrategyConfig& strategy, int replicas, bool shared);
// The model as such a run lays it out: `model` itself where its pieces are those, else a copy
// (Model::with_gradient_pieces) held in `keep`.
const Model& model_for(const Model& model, const StrategyConfig& strategy, int replicas, bool shared,
                       std::unique_ptr<Model>& keep);

// strategy.shard: gradients. Backward writes each trainable bucket into a staging slot; once the
// bucket is reduce-scattered, the replica adds its own chunk into a compact store laid out as its
// optimizer state, and the slot is free for a later bucket. Slots are planned by walking
// backward's order (last gradient unit first): a bucket takes a slot before its first writer's backward
// and frees it after its last writer's, so a slot is reused only by a bucket written wholly after
// the one before it was reduced; one spare slot beyond the most ever in use lets a bucket's
// reduce-scatter overlap the next layers' backward. The state region (batch statistics) follows
// the slots, whole.
struct GradientStaging {
    GradientPlacement placement;  // each bucket's place in the buffer
    size_t buffer = 0;            // floats: the slots, then the state region
    int slots = 0;
    std::vector<int> slot_of;  // per bucket (-1: the state region)
    // Per bucket: the gradient unit after whose backward it takes its slot (-1:
    // before backward begins), and, where its slot serves other buckets too, the buffer ranges
    // (index, count) no tensor of it covers (alignment gaps: zeroed then, so that the
    // reduce-scatter adds zeros).
    std::vector<int> claim_after;
    std::vector<std::vector<std::pair<size_t, size_t>>> gaps;
    size_t index(size_t offset) const { return placement.index(offset); }
};
GradientStaging plan_gradient_staging(const Model& model, const std::vector<Bucket>& buckets);

// strategy.shard: replica r's own chunk of every trainable bucket (the chunk the ring's
// reduce-scatter leaves it), sorted: the parameters whose optimizer state it keeps.
std::vector<std::pair<size_t, size_t>> owned_ranges(const std::vector<Bucket>& buckets, size_t trainable, int replicas,
                                                    int r);

// Whether strategy.shared_parameters applies to these devices: several CPU replicas, or several
// replicas of one GPU (one node).
bool parameters_shared(const StrategyConfig& strategy, const DeviceList& devices, bool several_nodes = false);
// shared: parameters_shared() for the devices (one copy, counted in shares).
// label_bytes: one sample's label on the device (loss.h's label_bytes).
// buckets: the gradients' buckets where they are built already (else made from strategy.bucket_mb).
// rows_met: micro_batch_rows() of the run's batches, where known (the CPU kernels' scratch
// depends on them; else any count up to micro_rows is planned for).
MemoryPlan plan_memory(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                       const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared = false,
                       size_t label_bytes = sizeof(int32_t), const std::vector<Bucket>* buckets = nullptr,
                       const std::vector<int>& rows_met = {});

// The rows of every micro-batch a replica computes for these global batches (a full one, an
// epoch's last and evaluation's last, partial ones), split over all_replicas and accumulation
// steps as the step splits them: sorted, each once, without zeros.
std::vector<int> micro_batch_rows(const std::vector<int>& global_batches, int all_replicas, int accumulation);

// When a replica's plan does not fit `capacity` bytes: the first sharding beyond the configured
// one (strategy.shard optimizer, then gradients) whose plan does, as "strategy.shard: gradients
// (1.2 GiB per replica)"; "" when none does or nothing can be shared (one replica, or one shared
// parameter copy). The arguments are plan_memory's.
std::string fitting_shard(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                          const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared,
                          size_t label_bytes, uint64_t capacity, const std::vector<int>& rows_met = {});

}  // namespace mirrored
