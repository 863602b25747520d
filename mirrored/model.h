// The model: a list of layers (mirrored/layers) over a fixed input shape. The Model holds only the
// layout - where each tensor lives in the flat buffers - and the forward/backward algorithms;
// parameters, gradients and activations belong to each replica and are passed in.
//
// The flat buffer: the trainable tensors first (the optimizer, weight decay and clipping cover
// [0, trainable_size())), then the mirrored state (batchnorm running statistics), then the frozen
// tensors (model.freeze, LoRA's base weights). The gradient buffer has the same layout up to the
// frozen ones (grad_size()); its state region carries each step's batch statistics, summed over
// the replicas by the same all-reduce as the gradients.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/layers/sequential.h"

namespace mirrored {

const char* layer_type_name(const LayerSpec& s);

// One named tensor in the flat buffers: parameters, gradients and optimizer state share it.
struct TensorInfo {
    std::string name;        // "layers.1.weight": the name PyTorch gives the module's state
    std::vector<int> shape;  // PyTorch's layout: [out, in] linear, [out, in, kh, kw] conv
    size_t offset = 0;       // floats from the start of the buffer (aligned to kTensorAlign)
    size_t count = 0;
    int layer = 0;  // the top-level layer it belongs to
    int unit = 0;   // the gradient unit (Builder::begin_unit) whose backward completes its gradient
    // The first gradient unit whose backward (last unit first) writes its gradient: its own, its
    // last block's (Builder::split_rows), or a later one tied to it (an LM head sharing the token
    // embedding's table).
    int written_from = 0;
    InitArgs init;
    bool trainable = true;  // false: mirrored state (running statistics), or frozen
    bool frozen = false;    // a parameter kept fixed (model.freeze, LoRA's base): after the state
    float fill = 0.0f;      // state: initial value
    float momentum = 0.0f;  // state: the exponential average's step
};

// A range of the trainable region whose gradient one gradient unit writes: a tensor, or a block
// of a split one's rows (Builder::split_rows). written_from as TensorInfo's.
struct GradientPiece {
    size_t begin = 0, end = 0;  // floats
    int unit = 0, written_from = 0;
};

// Everything one forward/backward call needs besides buffers (see Pass in mirrored/layers).
using PassContext = Pass;

class Model {
public:
    static constexpr size_t kTensorAlign = 64;  // floats (256 bytes): vector loads, tidy buckets

    // recompute_blocks: train.recompute: blocks (Builder::begin_recompute). gradient_piece_floats:
    // write a dense layer's weight gradient in blocks of the fewest rows that hold this many
    // floats, each its own gradient unit (Builder::split_rows; strategy.shard: gradients), 0: whole
    // tensors.
    // adaptation: the tensors kept fixed and the LoRA adapters (mirrored/adaptation.h makes it).
    Model(std::vector<int> input_shape, std::vector<LayerSpec> layers, uint64_t seed, bool recompute_blocks = false,
          size_t gradient_piece_floats = 0, Adaptation adaptation = {});
    ~Model();

    const std::vector<int>& input_shape() const { return input_shape_; }
    const std::vector<LayerSpec>& layers() const { return specs_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const Shape& input() const { return in_; }
    const Shape& output() const { return out_; }
    int input_features() const { return int(in_.size()); }
    int output_features() const { return int(out_.size()); }  // values per sample
    // A sequence model's loss is taken at each of output_positions() positions over
    // output_classes() values (a classifier: 1 position of output_features() classes).
    int output_positions() const { return out_.positions(); }
    // Positions a sequence model's products run over per sample, the most of any layer's input
    // or output (1: images and vectors).
    int sequence_positions() const;
    bool convolves() const;  // some layer makes im2col columns
    // The widest rows of the products with a weight: its inputs (what a row of the weight
    // multiplies: a dense layer's inputs, a convolution's taps x channels) and outputs (a dense
    // layer's units, a vocabulary), each at least a sequence's positions (attention's scores).
    ProductWidths product_widths() const;
    int output_classes() const { return out_.c; }
    // The first layer reads token ids (an embedding): the inputs stay f32 whatever the precision,
    // so that ids above 256 survive.
    bool reads_token_ids() const;
    // The ids the first layer has a row for (an embedding's vocab; 0 when it reads no token ids):
    // an id at or above it would read nothing.
    int token_vocab() const;
    // The flat ranges of the trainable tensors of two or more dimensions (weights, embeddings),
    // sorted, neighbours merged: where optimizer.weight_decay_on: matrices decays.
    std::vector<std::pair<size_t, size_t>> matrix_ranges() const;
    size_t flat_size() const { return flat_size_; }            // buffer length, gaps included
    size_t trainable_size() const { return trainable_size_; }  // the trainable prefix
    // The gradient buffer's length: the trainable prefix and the state (frozen tensors lie beyond).
    size_t grad_size() const { return grad_size_; }
    // What the compute copy of the weights (16-bit precisions) covers: the trainable prefix, or
    // everything when frozen tensors lie beyond it.
    size_t weights_size() const { return frozen_count_ ? flat_size_ : trainable_size_; }
    size_t frozen_count() const { return frozen_count_; }  // frozen values
    const Adaptation& adaptation() const { return layout_->adaptation(); }
    size_t param_count() const { return param_count_; }  // trainable values
    bool has_state() const { return trainable_size_ < grad_size_; }
    size_t stats_floats() const;  // cross-replica statistics buffer (synchronised batchnorm)
    int stats_syncs() const;      // layers whose statistics are summed over the replicas
    const TensorInfo* find(const std::string& name) const;
    std::string summary() const;  // one line per layer, for the log
    // Each top-level layer in a few words: "layers.0 dense [784] -> [1024] relu".
    std::vector<std::string> layer_descriptions() const;
    // GEMM floating-point operations of one training sample (forward, weight and input
    // gradients), the work a throughput is measured against.
    double train_flops_per_sample() const;
    // The forward FLOPs per sample a step adds by recomputing blocks (train.recompute: blocks):
    // not counted in train_flops_per_sample, which counts the model's work.
    double recomputed_flops_per_sample() const;
    // The same per top-level layer: forward, and backward (weight and input gradients).
    struct LayerFlops {
        double forward = 0, backward = 0;
    };
    std::vector<LayerFlops> layer_flops() const;
    // Device memory a replica's Activations take for max_rows rows of act_elem-byte activations
    // on a device whose Device::column_block_bytes is column_block_bytes.
    uint64_t activation_bytes(int max_rows, size_t act_elem, size_t column_block_bytes) const;
    size_t largest_activation_per_row() const;  // elements: the widest layer output
    Activations make_activations(Device& dev, int max_rows) const;

    // Writes initial values of every tensor into params (gaps zeroed, state at its fill value).
    void init_params(Device& dev, Stream s, float* params) const;

    // Returns the logits [rows, output_features()] (memory owned by p.acts).
    const void* forward(Pass& p, const void* x) const;
    // ConfigError at the first layer that cannot train on `rows` samples per replica
    // (`global_rows` in the job): see Layer::check_batch.
    void check_batch(int rows, int global_rows) const;
    // Uses the inputs recorded by the last forward(); consumes dlogits. Writes (or, with
    // p.accumulate, adds) parameter gradients; calls on_unit_done(unit) once a gradient unit's
    // gradients are enqueued (units last to first; std::logic_error if a layer breaks that order),
    // so a caller can start reducing them while earlier layers are still being computed.
    void backward(Pass& p, void* dlogits, const std::function<void(int unit)>& on_unit_done) const;
    int gradient_units() const { return layout_->units(); }
    // The trainable tensors' gradients by the unit that writes them, in offset order (without
    // the alignment gaps): buckets split only between pieces.
    const std::vector<GradientPiece>& gradient_pieces() const { return pieces_; }
    size_t gradient_piece_floats() const { return piece_floats_; }
    // This model laid out with other gradient pieces (the same tensors at the same offsets).
    std::unique_ptr<Model> with_gradient_pieces(size_t floats) const;
    int unit_layer(int unit) const { return layout_->unit_layer(unit); }  // the unit's top-level layer
    // The buffer backward() expects the loss gradient in: [rows, output_features()].
    void* dlogits_buffer(Activations& acts) const { return acts.act(dlogits_slot_, 0); }

private:
    std::vector<int> input_shape_;
    std::vector<LayerSpec> specs_;
    Shape in_, out_;
    std::unique_ptr<Builder> layout_;
    std::unique_ptr<Sequential> top_;
    int dlogits_slot_ = -1;
    std::vector<TensorInfo> tensors_;
    std::vector<GradientPiece> pieces_;
    uint64_t seed_ = 0;
    bool recompute_ = false;
    size_t piece_floats_ = 0;
    size_t flat_size_ = 0, trainable_size_ = 0, grad_size_ = 0, param_count_ = 0, frozen_count_ = 0;
};

}  // namespace mirrored
