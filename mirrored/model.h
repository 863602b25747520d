// Sequential model: a list of layer specs over a fixed input shape. The Model holds only the
// layout (shapes, where each tensor lives in the flat parameter buffer) and the forward/backward
// algorithms; parameters, gradients and activations belong to each replica and are passed in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"

namespace mirrored {

struct LayerSpec {
    enum class Type { flatten, dense, dropout };
    Type type = Type::flatten;
    int units = 0;                        // dense
    Activation activation = Activation::none;  // dense
    InitKind init = InitKind::he_uniform;      // dense weights (biases start at zero)
    bool bias = true;                     // dense
    float rate = 0.0f;                    // dropout
};
const char* layer_type_name(LayerSpec::Type t);

// One named tensor in the flat buffers: parameters, gradients and optimizer state share it.
struct TensorInfo {
    std::string name;          // "layers.1.weight": the name PyTorch gives a ModuleList entry
    std::vector<int> shape;    // [out, in] for weights, as torch.nn.Linear stores them
    size_t offset = 0;         // floats from the start of the buffer (aligned to kTensorAlign)
    size_t count = 0;
    int layer = 0;
    InitArgs init;
};

// Everything one forward/backward call needs besides buffers.
struct PassContext {
    Device* device = nullptr;
    Stream stream;
    int rows = 0;              // this replica's shard
    int64_t row_offset = 0;    // shard start in the global batch (dropout masks)
    uint64_t seed = 0;
    uint32_t step = 0;         // global micro-step (dropout masks)
    bool training = true;
};

class Model;

// A replica's activation memory for up to max_rows samples, allocated once.
class Activations {
public:
    Activations() = default;
    Activations(Device& dev, const Model& model, int max_rows);
    int max_rows() const { return max_rows_; }

private:
    friend class Model;
    int max_rows_ = 0;
    std::vector<DeviceBuffer<float>> out_;  // [layer] output, empty where it aliases the input
    std::vector<DeviceBuffer<float>> pre_;  // [layer] dense pre-activation, empty for act none
    std::vector<const float*> in_;          // [layer] input recorded by the last forward
    DeviceBuffer<float> grad_[2];           // ping-pong activation gradients [max_rows, widest]
};

class Model {
public:
    static constexpr size_t kTensorAlign = 64;  // floats (256 bytes): vector loads, tidy buckets

    Model(std::vector<int> input_shape, std::vector<LayerSpec> layers, uint64_t seed);

    const std::vector<int>& input_shape() const { return input_shape_; }
    const std::vector<LayerSpec>& layers() const { return layers_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    int input_features() const { return widths_.front(); }
    int output_features() const { return widths_.back(); }
    int width(int layer) const { return widths_[layer + 1]; }  // output width of a layer
    int widest() const;
    size_t flat_size() const { return flat_size_; }    // buffer length including alignment gaps
    size_t param_count() const { return param_count_; }  // trainable values
    const TensorInfo* find(const std::string& name) const;
    std::string summary() const;  // one line per layer, for the log
    // GEMM floating-point operations of one training sample (forward, weight and input
    // gradients), the work a throughput is measured against.
    double train_flops_per_sample() const;

    // Floats a replica's Activations hold for max_rows rows (what Activations allocates).
    uint64_t activation_floats(int max_rows) const;

    // Writes initial values of every tensor into params (gaps zeroed).
    void init_params(Device& dev, Stream s, float* params) const;

    // Returns the logits [rows, output_features()] (memory owned by acts).
    const float* forward(const PassContext& ctx, const float* params, const float* x,
                         Activations& acts) const;
    // Uses the inputs recorded by the last forward(); consumes dlogits in place. Writes (or, with
    // accumulate, adds) parameter gradients into grads; calls on_layer_done(layer) once a layer's parameter gradients are enqueued, so a
    // caller can start reducing them while earlier layers are still being computed.
    void backward(const PassContext& ctx, const float* params, float* grads, float* dlogits,
                  Activations& acts, bool accumulate,
                  const std::function<void(int layer)>& on_layer_done) const;
    // The buffer backward() expects the loss gradient in: [rows, output_features()].
    float* dlogits_buffer(Activations& acts) const { return acts.grad_[0].data(); }

private:
    friend class Activations;
    std::vector<int> input_shape_;
    std::vector<LayerSpec> layers_;
    std::vector<int> widths_;           // widths_[0] = input, widths_[l+1] = output of layer l
    std::vector<int> weight_tensor_;    // [layer] index into tensors_, -1 if none
    std::vector<int> bias_tensor_;
    std::vector<TensorInfo> tensors_;
    size_t flat_size_ = 0;
    size_t param_count_ = 0;
};

}  // namespace mirrored
