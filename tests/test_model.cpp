// Sequential model: layout and names, finite-difference gradient checks of every layer and the
// loss, gradient accumulation, and an MLP overfitting a small fixed batch on each backend.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/device.h"
#include "kernels/error.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

LayerSpec dense(int units, Activation act, bool bias = true) {
    LayerSpec s;
    s.type = LayerSpec::Type::dense;
    s.units = units;
    s.activation = act;
    s.bias = bias;
    s.init = act == Activation::none ? InitKind::glorot_uniform : InitKind::he_uniform;
    return s;
}
LayerSpec dropout(float rate) {
    LayerSpec s;
    s.type = LayerSpec::Type::dropout;
    s.rate = rate;
    return s;
}
LayerSpec flatten() { return LayerSpec{}; }

// Mean softmax cross-entropy over the batch, computed in double from the model's logits.
double loss_of(Device& d, const Model& m, Activations& acts, const std::vector<float>& params,
               const DeviceBuffer<float>& x, const std::vector<int32_t>& labels, const PassContext& ctx) {
    auto p = upload(d, params);
    const float* logits = m.forward(ctx, p.data(), x.data(), acts);
    const int classes = m.output_features();
    std::vector<float> z(size_t(ctx.rows) * classes);
    d.copy_to_host(ctx.stream, z.data(), logits, z.size() * 4);
    d.synchronize();
    double loss = 0;
    for (int i = 0; i < ctx.rows; ++i) {
        const float* r = &z[size_t(i) * classes];
        double mx = r[0];
        for (int j = 1; j < classes; ++j) mx = std::max(mx, double(r[j]));
        double s = 0;
        for (int j = 0; j < classes; ++j) s += std::exp(r[j] - mx);
        loss += std::log(s) + mx - r[labels[i]];
    }
    return loss / ctx.rows;
}

// Backprop gradients vs finite differences for every parameter. At a ReLU kink the central
// difference straddles two linear pieces; there one of the one-sided differences must agree.
void check_gradients(Device& d, const Model& m, int rows, uint64_t salt) {
    Rng rng(salt);
    const auto xh = rng.uniform(size_t(rows) * m.input_features(), -1.0f, 1.0f);
    const auto labels = rng.labels(rows, m.output_features());
    auto x = upload(d, xh);
    auto y = upload(d, labels);
    Activations acts(d, m, rows);
    PassContext ctx{&d, d.compute_stream(), rows, 3, base_seed(), 9, true};

    DeviceBuffer<float> params(d, m.flat_size()), grads(d, m.flat_size());
    DeviceBuffer<double> metrics(d, kMetricSlots);
    m.init_params(d, ctx.stream, params.data());
    d.fill(ctx.stream, m.flat_size(), 0.0f, grads.data());
    d.fill(ctx.stream, 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics.data()));
    const float* logits = m.forward(ctx, params.data(), x.data(), acts);
    float* dl = m.dlogits_buffer(acts);
    d.softmax_xent(ctx.stream, rows, m.output_features(), logits, y.data(), 1.0f / rows, dl, metrics.data());
    int callbacks = 0;
    m.backward(ctx, params.data(), grads.data(), dl, acts, false, [&](int) { ++callbacks; });
    const auto bp = download(d, grads);
    auto p = download(d, params);

    const double h = 1e-3;
    int checked = 0, failures = 0;
    for (const auto& t : m.tensors())
        for (size_t i = 0; i < t.count; ++i) {
            const size_t k = t.offset + i;
            const float orig = p[k];
            p[k] = orig + float(h);
            const double up = loss_of(d, m, acts, p, x, labels, ctx);
            p[k] = orig - float(h);
            const double down = loss_of(d, m, acts, p, x, labels, ctx);
            p[k] = orig;
            const double at = loss_of(d, m, acts, p, x, labels, ctx);
            const double g = bp[k];
            const double central = (up - down) / (2 * h);
            const bool ok = std::fabs(central - g) <= 3e-4 + 1e-2 * std::fabs(g) ||
                            std::fabs((up - at) / h - g) <= 2e-3 + 3e-2 * std::fabs(g) ||
                            std::fabs((at - down) / h - g) <= 2e-3 + 3e-2 * std::fabs(g);
            if (!ok && ++failures <= 5)
                MESSAGE(t.name << "[" << i << "]: backprop " << g << " vs finite difference " << central);
            ++checked;
        }
    CHECK(failures == 0);
    CHECK(checked == int(m.param_count()));
    int dense_layers = 0;
    for (const auto& l : m.layers()) dense_layers += l.type == LayerSpec::Type::dense;
    CHECK(callbacks == dense_layers);
}

void overfit(Device& d, OptimizerConfig::Type type) {
    Rng rng(77);
    const int rows = 32, features = 20, classes = 4;
    Model m({features}, {dense(64, Activation::relu), dense(64, Activation::gelu), dense(classes, Activation::none)}, 5);
    auto x = upload(d, rng.normal(size_t(rows) * features));
    auto y = upload(d, rng.labels(rows, classes));
    Activations acts(d, m, rows);
    DeviceBuffer<float> params(d, m.flat_size()), grads(d, m.flat_size());
    DeviceBuffer<double> metrics(d, kMetricSlots);
    m.init_params(d, d.compute_stream(), params.data());
    d.fill(d.compute_stream(), m.flat_size(), 0.0f, grads.data());
    OptimizerConfig oc;
    oc.type = type;
    oc.lr = type == OptimizerConfig::Type::sgd ? 0.1 : 0.01;
    Optimizer opt(d, oc, m.flat_size());
    PassContext ctx{&d, d.compute_stream(), rows, 0, 1, 0, true};
    float first = 0, last = 0;
    for (int step = 0; step < 300; ++step) {
        d.fill(ctx.stream, 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics.data()));
        const float* logits = m.forward(ctx, params.data(), x.data(), acts);
        float* dl = m.dlogits_buffer(acts);
        d.softmax_xent(ctx.stream, rows, classes, logits, y.data(), 1.0f / rows, dl, metrics.data());
        m.backward(ctx, params.data(), grads.data(), dl, acts, false, nullptr);
        opt.apply(ctx.stream, params.data(), grads.data(), step, float(oc.lr), nullptr);
        const float loss = download(d, metrics)[kMetricLossSum] / rows;
        if (step == 0) first = loss;
        last = loss;
    }
    CHECK(first > 1.0f);
    CHECK(last < 0.01f);
}

}  // namespace

TEST_CASE("model layout: PyTorch names and shapes, aligned offsets, parameter count") {
    Model m({28, 28, 1}, {flatten(), dense(512, Activation::relu), dropout(0.1f), dense(10, Activation::none)}, 1);
    REQUIRE(m.tensors().size() == 4);
    CHECK(m.tensors()[0].name == "layers.1.weight");
    CHECK(m.tensors()[0].shape == std::vector<int>{512, 784});
    CHECK(m.tensors()[1].name == "layers.1.bias");
    CHECK(m.tensors()[2].name == "layers.3.weight");
    CHECK(m.tensors()[3].shape == std::vector<int>{10});
    CHECK(m.param_count() == size_t(784 * 512 + 512 + 512 * 10 + 10));
    for (const auto& t : m.tensors()) CHECK(t.offset % Model::kTensorAlign == 0);
    CHECK(m.flat_size() >= m.param_count());
    CHECK(m.input_features() == 784);
    CHECK(m.output_features() == 10);
}

TEST_CASE("model rejects bad layer lists with the key that is wrong") {
    CHECK_THROWS_WITH_AS(Model({28, 28}, {dense(10, Activation::none)}, 1),
                         doctest::Contains("model.layers.0: dense needs a flat input"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({4}, {dense(0, Activation::none)}, 1),
                         doctest::Contains("model.layers.0.units"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({4}, {dense(3, Activation::none), dropout(1.0f)}, 1),
                         doctest::Contains("model.layers.1.rate"), ConfigError);
    CHECK_THROWS_AS(Model({4}, {flatten()}, 1), ConfigError);
}

TEST_CASE("gradients match finite differences: dense none/relu/gelu, dropout, flatten, loss") {
    auto d = make_cpu_device(0);
    check_gradients(*d, Model({2, 3, 2}, {flatten(), dense(9, Activation::relu), dropout(0.25f),
                                          dense(7, Activation::gelu), dense(5, Activation::none)}, 11),
                    6, 1);
    check_gradients(*d, Model({6}, {dense(5, Activation::gelu, false), dense(4, Activation::none, false)}, 12), 5, 2);
}

TEST_CASE("gradient accumulation adds backward passes") {
    auto d = make_cpu_device(0);
    Rng rng(3);
    Model m({8}, {dense(6, Activation::relu), dense(3, Activation::none)}, 4);
    const int rows = 5;
    auto x = upload(*d, rng.normal(rows * 8));
    auto y = upload(*d, rng.labels(rows, 3));
    Activations acts(*d, m, rows);
    DeviceBuffer<float> params(*d, m.flat_size()), grads(*d, m.flat_size());
    DeviceBuffer<double> metrics(*d, kMetricSlots);
    m.init_params(*d, d->compute_stream(), params.data());
    d->fill(d->compute_stream(), m.flat_size(), 0.0f, grads.data());  // alignment gaps stay zero
    PassContext ctx{d.get(), d->compute_stream(), rows, 0, 1, 0, true};
    std::vector<float> once;
    for (int pass = 0; pass < 2; ++pass) {
        const float* logits = m.forward(ctx, params.data(), x.data(), acts);
        d->softmax_xent(ctx.stream, rows, 3, logits, y.data(), 1.0f, m.dlogits_buffer(acts), metrics.data());
        m.backward(ctx, params.data(), grads.data(), m.dlogits_buffer(acts), acts, pass > 0, nullptr);
        if (pass == 0) once = download(*d, grads);
    }
    const auto twice = download(*d, grads);
    for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]).epsilon(1e-6));
}

TEST_CASE("an MLP overfits a small fixed batch on the CPU backend (SGD and AdamW)") {
    auto d = make_cpu_device(0);
    overfit(*d, OptimizerConfig::Type::sgd);
    overfit(*d, OptimizerConfig::Type::adamw);
}

TEST_CASE("an MLP overfits a small fixed batch on the CUDA backend (SGD and AdamW)") {
    SKIP_WITHOUT_CUDA();
    auto d = make_cuda_device(0);
    overfit(*d, OptimizerConfig::Type::sgd);
    overfit(*d, OptimizerConfig::Type::adamw);
}

TEST_CASE("CUDA forward/backward of a whole model match CPU on the same weights") {
    SKIP_WITHOUT_CUDA();
    Rng rng(21);
    Model m({3, 5, 1}, {flatten(), dense(33, Activation::gelu), dropout(0.2f), dense(17, Activation::relu),
                        dense(6, Activation::none)}, 8);
    const int rows = 19;
    const auto xh = rng.normal(size_t(rows) * m.input_features());
    const auto yh = rng.labels(rows, 6);
    std::vector<std::vector<float>> results;
    for (bool cuda : {false, true}) {
        auto d = cuda ? make_cuda_device(0) : make_cpu_device(0);
        auto x = upload(*d, xh);
        auto y = upload(*d, yh);
        Activations acts(*d, m, rows);
        DeviceBuffer<float> params(*d, m.flat_size()), grads(*d, m.flat_size());
        DeviceBuffer<double> metrics(*d, kMetricSlots);
        d->fill(d->compute_stream(), 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics.data()));
        m.init_params(*d, d->compute_stream(), params.data());
        d->fill(d->compute_stream(), m.flat_size(), 0.0f, grads.data());
        PassContext ctx{d.get(), d->compute_stream(), rows, 40, 3, 2, true};
        const float* logits = m.forward(ctx, params.data(), x.data(), acts);
        d->softmax_xent(ctx.stream, rows, 6, logits, y.data(), 1.0f / rows, m.dlogits_buffer(acts), metrics.data());
        m.backward(ctx, params.data(), grads.data(), m.dlogits_buffer(acts), acts, false, nullptr);
        results.push_back(download(*d, grads));
        auto p = download(*d, params);
        results.push_back(p);
    }
    CHECK(results[3] == results[1]);  // identical initial weights
    CHECK(rel_error(results[2], results[0]) < 1e-4);
}
