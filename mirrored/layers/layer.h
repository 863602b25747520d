// Layers as modules. Each layer type lives in its own file in this folder and registers one
// LayerKind (registry.cpp): how its config keys are read and written back, and how it is built.
// A layer is shared by every replica: it holds only its shapes and where its tensors live in the
// flat buffers; what differs per replica (saved inputs, activation buffers) lives in the
// replica's Activations, in the layer's slot.
//
// Activations are NHWC ([n, h, w, c] images, [n, c] vectors) in the device's activation type;
// parameters and gradients are f32 offsets into one flat buffer each, named as PyTorch names the
// equivalent nn.Module's state (layers.3.weight, layers.5.running_mean), with PyTorch's layouts
// ([out, in] for linear, [out, in, kh, kw] for conv).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/registry.h"
#include "base/spec_reader.h"
#include "kernels/device.h"

namespace mirrored {

// The shape of one sample: an image [h, w, c], a sequence [w, c] (w positions of c values: a
// language model's tokens) or a vector [c] (a sequence of one position).
struct Shape {
    int h = 1, w = 1, c = 1;
    bool image = false;  // [h, w, c]; otherwise [w, c] with h = 1
    size_t size() const { return size_t(h) * size_t(w) * size_t(c); }
    // Rows of c values a sample has for the layers that work on each position alone (dense,
    // layernorm, the loss): a sequence's length, 1 for a vector.
    int positions() const { return image ? 1 : h * w; }
    std::string str() const;
    bool operator==(const Shape&) const = default;
    static Shape vector(int c) { return Shape{1, 1, c, false}; }
    static Shape picture(int h, int w, int c) { return Shape{h, w, c, true}; }
    static Shape sequence(int t, int c) { return Shape{1, t, c, false}; }
};

// One entry of model.layers: its type, the type's own keys (its LayerKind reads them), and the
// layers of a container (residual).
struct LayerSpec {
    std::string type = "dense";
    OptionsPtr options;
    std::vector<LayerSpec> layers;

    template <typename T>
    const T& get() const {
        return options_as<T>(options);
    }
    Fields fields() const { return options ? options->fields() : Fields{}; }
    std::string field(const std::string& key) const;  // a key's value as the config writes it ("" if none)
    bool operator==(const LayerSpec& o) const {
        return type == o.type && same_options(options, o.options) && layers == o.layers;
    }
};

class Layer;
class Builder;

// A layer type: its name, how its own keys are read (written back by the Options they make), and
// how it is built. A container's `layers` are read by read_layer_list before its own keys.
struct LayerKind {
    const char* name;
    OptionsPtr (*read)(SpecReader& r, const std::string& path);
    std::unique_ptr<Layer> (*create)(const LayerSpec& s);
    bool container = false;
    // As a model's first layer, reads token ids (kept f32 at every precision), not values.
    bool reads_token_ids = false;
};
template <typename L>
std::unique_ptr<Layer> create_layer(const LayerSpec& s) {
    return std::make_unique<L>(s);
}
const Registry<LayerKind>& layer_kinds();  // layers/registry.cpp lists every type
// Reads the list of layers at `path` (model.layers, or a residual block's layers).
std::vector<LayerSpec> read_layer_list(SpecReader& r, const std::string& path);
// A layer's spec from its keys as a config would give them (`{units: 10}` as {{"units", "10"}}),
// read by its type's reader: how code and tests make a layer without a config file.
LayerSpec make_layer_spec(const std::string& type, const Fields& keys = {}, std::vector<LayerSpec> layers = {});
// "conv2d filters=32 kernel=3 ..." with sub-layers in brackets: what the checkpoint hash covers.
std::string layer_spec_summary(const LayerSpec& s);

// Shared helpers for the layer types' readers.
Activation read_activation(SpecReader& r, const std::string& path);
InitKind read_init(SpecReader& r, const std::string& path, Activation act);
// A window's keys, shared by conv2d and the pools: kernel_size, stride, padding.
struct WindowKeys {
    int kernel = 3, stride = 1;
    int padding = 0;    // zeros on each side ...
    bool same = false;  // ... or (kernel - 1) / 2 ("same")
    int pad() const { return same ? (kernel - 1) / 2 : padding; }
    std::string padding_text() const { return same ? "same" : padding == 0 ? "valid" : std::to_string(padding); }
    bool operator==(const WindowKeys&) const = default;
};
// padding: same | valid | N, into w.padding and w.same (w.kernel read before).
void read_padding(SpecReader& r, const std::string& path, WindowKeys& w);

class Activations;
class StatsSync;

// Generation with a key/value cache (`generate`): a pass over one new position of each of
// `sequences` sequences, all at `position`, through a model built for sequences of one.
// Position-wise layers run as on any batch; position_embedding adds its row `position`; each
// attention layer appends each sequence's new q, k, v row to that sequence's part of its cache
// (positions 0..capacity-1) and attends over the rows so far instead of recomputing the window.
class DecodeState {
public:
    DecodeState(Device& d, int capacity, int sequences = 1) : dev_(d), capacity_(capacity), sequences_(sequences) {}
    int position = 0;
    int capacity() const { return capacity_; }
    int sequences() const { return sequences_; }
    // A layer's cache of `bytes_per_position` per position of each sequence (the layer's slot keys
    // it; sequence r's positions from r * capacity), allocated at its first use and kept for the
    // whole generation.
    void* cache(int slot, size_t bytes_per_position);

private:
    Device& dev_;
    int capacity_, sequences_;
    std::vector<std::pair<int, std::shared_ptr<void>>> caches_;
};

// Where the flat layout's gradients lie in a replica's gradient buffer: each piece [begin, end)
// of the flat layout (a bucket) at buffer index `at`. Without pieces, every offset is its index.
// strategy.shard: gradients places the trainable buckets in a few reused staging slots.
struct GradientPlacement {
    struct Piece {
        size_t begin = 0, end = 0, at = 0;
    };
    std::vector<Piece> pieces;  // sorted by begin, disjoint
    size_t index(size_t offset) const;
};

// Profiling (bench-step --layers): marked on the pass's stream after each top-level layer's
// forward (label: the layer's index) and backward (label: layers + index), so that the time
// between marks is the layer's - an event on GPUs, the clock on CPUs. The training step marks its
// other phases with the negative labels of StepPhase: a step is begin, input, [layer forwards,
// loss, layer backwards] per micro-batch, reduced, end; and reduced after a layer whose gradient
// buckets it reduces during backward (CPU replicas do so on their thread).
class LayerProbe {
public:
    enum StepPhase : int { kBegin = -1, kInput = -2, kLoss = -3, kReduced = -4, kEnd = -5 };
    virtual ~LayerProbe() = default;
    virtual void mark(Device& d, Stream s, int label) = 0;
};

// Everything one forward or backward call on one replica needs besides the data.
struct Pass {
    Device* dev = nullptr;
    Stream stream;
    int rows = 0;            // samples in this (micro-)batch on this replica
    int global_rows = 0;     // in the micro-batch over every replica (synchronised statistics)
    int64_t row_offset = 0;  // their offset in the global batch (dropout masks)
    uint64_t seed = 0;
    uint32_t step = 0;                   // global micro-step (dropout masks)
    const StepValues* values = nullptr;  // device: the step from here (a captured step)
    bool training = true;
    const float* params = nullptr;                 // f32 master parameters (flat)
    const void* weights = nullptr;                 // their compute copy in the activation type (= params for f32)
    float* grads = nullptr;                        // f32 gradients (see grad()); the state region gets statistics
    size_t frozen_from = SIZE_MAX;                 // offsets from here are frozen tensors': no gradient
    const GradientPlacement* placement = nullptr;  // where grad() finds a tensor (null: at its offset)
    bool accumulate = false;                       // add to grads (gradient accumulation) instead of writing
    Activations* acts = nullptr;
    StatsSync* sync = nullptr;    // cross-replica sums for synchronised batch statistics
    float stats_weight = 1.0f;    // 1 / (replicas x micro-batches): running-statistics weight
    DType vt = DType::f32;        // the activations' value type (Device::value_dtype)
    LayerProbe* probe = nullptr;  // profiling: the top-level layers mark their ends
    // A recomputed block's forward run again in its backward (train.recompute: blocks): the same
    // activations, but batch statistics are not counted into the running ones a second time.
    bool recomputing = false;
    // Called with a gradient unit's number once its backward has enqueued its parameter
    // gradients (Builder::begin_unit), so that the step can reduce them while backward goes on.
    const std::function<void(int unit)>* on_unit_done = nullptr;
    DecodeState* decode = nullptr;  // generation with a key/value cache: one new position

    // A tensor's gradient (its offset in the flat layout). Layers write gradients only through
    // here: with strategy.shard: gradients a tensor's gradient lies in its bucket's staging slot.
    // Null for a frozen tensor: its layer skips that gradient's work.
    float* grad(size_t offset) const;
    // The compute copy of a tensor's weights (its offset in the activation type's elements).
    const void* weight(size_t offset) const {
        return static_cast<const char*>(weights) + offset * (weights == params ? 4 : dev->act_bytes(1));
    }
    GemmTypes types(DType c) const { return {vt, vt, c}; }
};

// The cross-replica sum the synchronised batch normalisation needs during forward and backward:
// every replica calls all_reduce with the same n in the same order; the sums are in buffer()
// (device memory of this replica) before and after.
class StatsSync {
public:
    virtual ~StatsSync() = default;
    virtual float* buffer() = 0;
    virtual size_t capacity() const = 0;  // floats
    virtual void all_reduce(size_t n) = 0;
};

// Fine-tuning part of a model (model.lora, model.freeze): the tensors kept fixed (frozen: no
// gradient, no optimizer state, not reduced) and the low-rank adapters (LoRA) beside some weights.
struct LoraSlice {
    int row = 0, rows = 0;  // the weight's output rows the adapter adds to
    std::string name;       // its tensors: name.lora_A.weight [rank, in], name.lora_B.weight [rows, rank]
    bool operator==(const LoraSlice&) const = default;
};
struct Adaptation {
    std::vector<std::string> freeze;  // glob patterns (fnmatch) of tensor names
    bool freeze_all = false;          // every tensor but the adapters (LoRA)
    int lora_rank = 0;                // 0: no adapters
    float lora_scale = 0.0f;          // alpha / rank
    double lora_alpha = 0;
    double lora_dropout = 0;                             // the rate each adapter's input is dropped at in training
    std::map<std::string, std::vector<LoraSlice>> lora;  // weight name -> its adapters
    bool operator==(const Adaptation&) const = default;
};

// The model's layout while it is built: tensors in the flat buffers and per-replica buffers.
class Builder {
public:
    struct Tensor {
        std::string name;
        std::vector<int> shape;
        size_t count = 0;
        InitArgs init;
        bool trainable = true;
        bool frozen = false;    // a parameter kept fixed (Adaptation)
        float fill = 0.0f;      // state tensors start at this value ...
        float momentum = 0.0f;  // ... and move this far towards each step's statistics
        int top_layer = 0;
        int unit = -1;       // the gradient unit that declared it
        bool tied = false;   // another layer uses it too (an LM head tied to the token embedding)
        int tied_unit = -1;  // ... the gradient unit that does
        // split_rows: floats per gradient piece, whole rows (0: one piece), and the pieces. Piece k
        // is the gradient unit `unit + k`; backward writes the last piece first.
        size_t piece_floats = 0;
        int pieces = 1;
    };
    struct Buffer {
        bool act = true;     // activation type, else f32
        size_t per_row = 0;  // elements per sample
        size_t fixed = 0;    // plus this many elements
        int region = -1;     // the recomputed block whose storage it is (shared), or -1 (its own)
    };
    struct Slot {
        std::vector<Buffer> buffers;
    };

    explicit Builder(uint64_t seed) : seed_(seed) {}
    // A trainable tensor (returns its index; frozen where the adaptation says) and a mirrored,
    // untrained state tensor.
    int param(const std::string& name, std::vector<int> shape, InitArgs init);
    bool frozen(int tensor) const { return tensors_[size_t(tensor)].frozen; }
    void set_adaptation(Adaptation a) { adapt_ = std::move(a); }
    const Adaptation& adaptation() const { return adapt_; }
    // A weight's LoRA adapters (none: empty); their tensors are declared with adapter_param,
    // never frozen.
    const std::vector<LoraSlice>& lora_slices(const std::string& weight) const;
    int adapter_param(const std::string& name, std::vector<int> shape, InitArgs init);
    int state(const std::string& name, std::vector<int> shape, float fill, float momentum);
    int new_slot();                                              // per-replica storage of one layer
    int act_buffer(int slot, size_t per_row, size_t fixed = 0);  // in the activation type
    int f32_buffer(int slot, size_t per_row, size_t fixed = 0);
    // Scratch shared by every layer in turn, per row (image) of the layer using it: sized for
    // the rows a block of Device::column_block_images holds, not the whole batch.
    void scratch(size_t per_row) { scratch_rows_.push_back(per_row); }
    // A layer whose statistics are summed over every replica (one all-reduce each way per step):
    // the shared buffer is the largest such layer's.
    void stats(size_t floats) {
        stats_floats_ = std::max(stats_floats_, floats);
        ++stats_syncs_;
    }
    // A layer's input or output positions (Layer::build): the most any layer's products run over
    // per sample, inside the model as at its ends (a sequence flattened before the head).
    void note_positions(int n) { positions_ = std::max(positions_, n); }
    int most_positions() const { return positions_; }
    void set_top_layer(int l) { top_layer_ = l; }
    // The token embedding's table, which an LM head may tie its weights to (-1: none yet).
    void set_token_embedding(int tensor) { token_embedding_ = tensor; }
    int token_embedding() const { return token_embedding_; }
    void tie(int tensor) {
        if (tensors_[size_t(tensor)].pieces > 1)  // its blocks' units would be written out of order
            throw std::logic_error("a tensor written in blocks of rows cannot be tied: " +
                                   tensors_[size_t(tensor)].name);
        tensors_[size_t(tensor)].tied = true;
        tensors_[size_t(tensor)].tied_unit = unit_here();
    }

    // Gradient units: a layer that declares trainable tensors itself, or ties one, is a unit; its
    // backward writes their gradients. Units are numbered in build order and backward completes
    // them in the reverse order (a container runs its layers' backward last built first), so a
    // bucket of gradients is whole once its lowest unit is done. Layer::build opens and closes
    // each layer's frame; end_unit() returns the layer's unit, or -1.
    void begin_unit() { frames_.push_back(Frame{}); }
    int end_unit() {
        const int u = frames_.back().first;
        frames_.pop_back();
        return u;
    }
    // strategy.shard: gradients keeps a bucket whole in a staging slot, so a tensor larger than a
    // bucket would need a slot of its size. A layer that can write its weight's gradient a block
    // of rows at a time calls split_rows(tensor, row_floats) right after declaring it: with
    // set_piece_floats(n) (n > 0, a bucket's floats) and the tensor larger than n floats, each
    // block of the fewest rows that hold n floats, rounded up to a multiple of 8 (the last block:
    // the rest), becomes its own gradient unit, numbered up from the tensor's. The layer's
    // tensors declared after it belong to the last block's unit, so its backward writes them
    // first, then the blocks last to first, reporting each block's unit but the first (which the
    // layer's own report covers). Returns the rows per block (all the rows: not split).
    void set_piece_floats(size_t n) { piece_floats_ = n; }
    int split_rows(int tensor, size_t row_floats);
    int units() const { return int(unit_layers_.size()); }
    int unit_layer(int unit) const { return unit_layers_[size_t(unit)]; }  // its top-level layer

    // Activation recomputation (train.recompute: blocks). A block (transformer_block, residual)
    // declares the buffers it needs only during its own forward and backward (its layers' and its
    // own, not its output) between begin_recompute() and end_recompute(); every recomputed block's
    // such buffers share one region of memory (the largest block's), and the block runs its
    // forward again at the start of its backward. begin_recompute() says whether this block recomputes: not when the model does
    // not, nor inside a block that does (which recomputes it whole). Call both either way.
    void set_recompute(bool on) { recompute_ = on; }
    bool begin_recompute();
    void end_recompute();
    bool in_recomputed_block() const { return region_ >= 0; }

    const std::vector<Tensor>& tensors() const { return tensors_; }
    const std::vector<Slot>& slots() const { return slots_; }
    const std::vector<size_t>& scratch_per_row() const { return scratch_rows_; }
    size_t stats_floats() const { return stats_floats_; }
    int stats_syncs() const { return stats_syncs_; }

private:
    int add_tensor(const std::string& name, std::vector<int> shape, InitArgs init);
    int unit_here() {  // the open frame's unit for a new tensor, numbered at its first one
        if (frames_.empty()) return -1;
        if (frames_.back().first < 0) {
            frames_.back().first = frames_.back().current = units();
            unit_layers_.push_back(top_layer_);
        }
        return frames_.back().current;
    }
    struct Frame {
        int first = -1;    // the layer's unit: backward reports it last
        int current = -1;  // the unit of its tensors from here (past a split tensor's blocks)
    };

    uint64_t seed_;
    Adaptation adapt_;
    int top_layer_ = 0;
    std::vector<Frame> frames_;
    std::vector<int> unit_layers_;
    size_t piece_floats_ = 0;
    int token_embedding_ = -1;
    std::vector<Tensor> tensors_;
    std::vector<Slot> slots_;
    std::vector<size_t> scratch_rows_;
    size_t stats_floats_ = 0;
    int stats_syncs_ = 0;
    int positions_ = 1;
    bool recompute_ = false;
    int depth_ = 0, region_ = -1, regions_ = 0;  // open recompute blocks, the outermost's region
};

// Where the layout put a tensor: offsets into the flat buffers, filled in once the model is built.
struct TensorRef {
    int index = -1;
    size_t offset = 0, count = 0;
};

class Layer {
public:
    explicit Layer(const LayerSpec& spec) : spec_(spec) {}
    virtual ~Layer() = default;
    Layer(const Layer&) = delete;
    Layer& operator=(const Layer&) = delete;

    const LayerSpec& spec() const { return spec_; }
    const std::string& name() const { return name_; }  // "layers.3": its PyTorch module path
    const Shape& in() const { return in_; }
    const Shape& out() const { return out_; }

    // Checks the input shape (ConfigError naming `key` otherwise), declares tensors and buffers,
    // and sets the output shape. `name` is the module path, `key` the config path.
    void build(Builder& b, const std::string& name, const std::string& key, const Shape& in) {
        name_ = name;
        key_ = key;
        in_ = in;
        out_ = in;
        b.begin_unit();
        declare(b);
        unit_ = b.end_unit();
        b.note_positions(std::max(in_.positions(), out_.positions()));
    }
    // After the layout is final: where each declared tensor lives.
    virtual void place(const std::vector<TensorRef>& refs) { (void)refs; }
    // The output (a buffer of this layer, or x itself when nothing changes).
    // Const: one layer object serves every replica thread at once; per-replica state goes in
    // p.acts, in the slots the layer declared.
    virtual const void* forward(Pass& p, const void* x) const = 0;
    // dy: the gradient of the output, which may be overwritten; dx: where the gradient of the
    // input goes, or null when nothing before needs it. Parameter gradients go into p.grad(offset).
    virtual void backward(Pass& p, void* dy, void* dx) const = 0;
    // backward, then p.on_unit_done where this layer is a gradient unit: how containers run
    // their layers' backward.
    void run_backward(Pass& p, void* dy, void* dx) const {
        backward(p, dy, dx);
        if (unit_ >= 0 && p.on_unit_done) (*p.on_unit_done)(unit_);
    }
    virtual bool has_params() const { return false; }
    // Refuses (ConfigError at its key) training on `rows` samples per replica, `global_rows` in
    // the whole job, when the layer cannot learn from so few (batch statistics over one value).
    virtual void check_batch(int rows, int global_rows) const { (void)rows, (void)global_rows; }
    virtual double forward_flops() const { return 0; }  // GEMM multiply-adds x 2, per sample
    // Runs its forward again in backward (train.recompute: blocks, Builder::begin_recompute).
    virtual bool recomputes() const { return false; }
    virtual std::string detail() const { return ""; }  // for the model summary

protected:
    virtual void declare(Builder& b) = 0;
    [[noreturn]] void fail(const std::string& what) const;  // ConfigError at this layer's key
    // A tensor's gradient, or for a frozen one (Pass::grad null) floats [at, ...) of the layer's
    // f32 buffer (slot, sink): where an op that computes it with dx can put it.
    float* grad_or_sink(const Pass& p, size_t offset, int slot, int sink, size_t at) const;
    // The backward of a weight split by Builder::split_rows into blocks of block_rows rows (the
    // layer's first tensor): dw[units, inputs] (+)= dz[rows, units]^T x[rows, inputs] a block at a
    // time, last first, each block but the first reported as its gradient unit once written.
    void weight_grad_by_blocks(Pass& p, int rows, int units, int inputs, const void* dz, const void* x, size_t w_off,
                               int block_rows) const;

    LayerSpec spec_;
    std::string name_, key_;
    Shape in_, out_;
    int unit_ = -1;  // its gradient unit (Builder::begin_unit), or -1
};

}  // namespace mirrored
