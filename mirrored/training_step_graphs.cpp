// The training step captured into graphs (strategy.cuda_graph): a step from one launch.
#include <algorithm>
#include <string>
#include <vector>

#include "mirrored/training_step.h"

namespace mirrored {

void TrainingStep::choose_graphs() {
    if (!set_.config().cuda_graph) return;
    if (!set_.traits().asynchronous)
        graph_note_ = "CPU replicas run each op as it is issued: there is nothing to capture";
    else if (!set_.traits().nccl_capturable && set_.config().cross_device_ops == "nccl")
        graph_note_ =
            std::string("NCCL on ") + set_.traits().display + " replicas cannot be captured; use ring or direct";
    else graphs_on_ = true;
    if (graphs_on_) graph_fork_ = set_.replica(0).device->event_create();
}

// Per step the host stages each replica's shard and step values (copies, events and the loader's
// release callback: a fixed number per replica), makes replica 0's compute stream wait for every
// replica's, launches the step's graph there, and makes every compute stream wait for its end.
// The graph holds every replica's forward, backward, bucketed all-reduce (the ring's cross-device
// event joins become edges) and update: no replica thread, barrier or per-bucket call on the host.
bool TrainingStep::graph_step(const Batch& batch, int64_t step, float lr, uint64_t seed) {
    const int buf = set_.replica(0).next_buffer;  // every replica stages into the same buffer index
    const int rows = batch.global_rows;           // read before staging: once released, the loader refills the batch
    const std::pair<int, int> key{buf, rows};
    auto found = std::find_if(graphs_.begin(), graphs_.end(),
                              [&](const StepGraph& g) { return g.buf == buf && g.global_rows == rows; });
    if (found == graphs_.end()) {
        if (std::find(graph_warm_.begin(), graph_warm_.end(), key) == graph_warm_.end()) {
            if (graph_warm_.size() < 2 * kMaxGraphs) graph_warm_.push_back(key);
            return false;  // a shape's first step runs uncaptured: libraries initialise outside the capture
        }
        if (graphs_.size() >= kMaxGraphs) return false;
    }
    Replica& R0 = set_.replica(0);
    Device& d0 = *R0.device;
    const Stream cs0 = d0.compute_stream();
    // Every optimizer has the same configuration: one step's values serve every replica.
    const StepValues values = R0.optimizer->step_values(step, lr);
    std::vector<StepShape>& shapes = graph_shapes_;  // sized once: nothing is allocated per step
    shapes.resize(size_t(set_.replicas()));
    for (int r = 0; r < set_.replicas(); ++r) {
        shapes[size_t(r)] = stage_step(r, batch, &values);
        if (r > 0) {  // the launch follows replica r's earlier work (staging, metrics) too
            Device& d = *set_.replica(r).device;
            d.event_record(set_.replica(r).step_ready, d.compute_stream());
            d0.stream_wait_event(cs0, set_.replica(r).step_ready);
        }
    }
    if (found == graphs_.end()) {
        try {
            graphs_.push_back({buf, rows, capture_step(shapes, step, lr, seed)});
        } catch (const DeviceError& e) {  // the path that has not run on every GPU: say how to avoid it
            throw DeviceError(std::string("strategy.cuda_graph: capturing step ") + std::to_string(step) + " failed: " +
                                  e.what() + "; rerun with --set strategy.cuda_graph=false to resume without graphs",
                              e.device());
        }
        found = graphs_.end() - 1;
    }
    // cppcheck-suppress derefInvalidIteratorRedundantCheck ; a new shape's graph was just pushed
    d0.graph_launch(found->graph, cs0);
    d0.event_record(R0.graph_done, cs0);
    for (int r = 0; r < set_.replicas(); ++r) {
        Replica& R = set_.replica(r);
        Device& d = *R.device;
        if (r > 0) d.stream_wait_event(d.compute_stream(), R0.graph_done);
        set_.inputs_consumed(R, shapes[size_t(r)].buf, d.compute_stream());
    }
    return true;
}

// One capture on replica 0's compute stream: the other replicas' compute streams join it by the
// fork event, their comm streams by the bucket events, and all join back before it ends. The
// replica threads issue the work as in an uncaptured step (their barriers order the capture,
// not the replays).
Graph TrainingStep::capture_step(const std::vector<StepShape>& shapes, int64_t step, float lr, uint64_t seed) {
    Device& d0 = *set_.replica(0).device;
    const Stream cs0 = d0.compute_stream();
    d0.capture_begin(cs0);
    d0.event_record(graph_fork_, cs0);
    for (int r = 1; r < set_.replicas(); ++r) {
        Device& d = *set_.replica(r).device;
        d.stream_wait_event(d.compute_stream(), graph_fork_);
    }
    set_.threads().run([&](int r) {
        Replica& R = set_.replica(r);
        const StepShape& shape = shapes[size_t(r)];
        replica_compute(r, shape, step, lr, seed, false, R.step_values[size_t(shape.buf)].data());
    });
    for (int r = 1; r < set_.replicas(); ++r) {  // graph_done of the others: their part's end
        Replica& R = set_.replica(r);
        R.device->event_record(R.graph_done, R.device->compute_stream());
        d0.stream_wait_event(cs0, R.graph_done);
    }
    return d0.capture_end(cs0);
}

void TrainingStep::destroy_graphs() noexcept {
    if (set_.replicas() == 0) return;
    Device& d0 = *set_.replica(0).device;
    for (const StepGraph& g : graphs_) d0.graph_destroy(g.graph);
    graphs_.clear();
    if (graph_fork_.handle) d0.event_destroy(graph_fork_);
    graph_fork_ = {};
}

}  // namespace mirrored
