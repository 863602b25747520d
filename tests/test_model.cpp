// The model and its layers: layout and PyTorch names, configuration errors naming the key,
// finite-difference gradient checks of every layer type (dense, dropout, flatten, conv2d, pools,
// batchnorm, layernorm, residual with and without projection), gradient accumulation, and a
// small model overfitting a fixed batch on each backend.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/device.h"
#include "base/error.h"
#include "kernels/ops/losses.h"
#include "kernels/ops/flat.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "tests/helpers.h"
#include "tests/layers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

// One model on one device with its buffers: runs forward + loss + backward as a replica does.
struct Harness {
    Device& d;
    const Model& m;
    int rows;
    DeviceBuffer<float> x, params, grads;
    DeviceBuffer<int32_t> y;
    DeviceBuffer<double> metrics;
    Activations acts;
    std::vector<float> xh;
    std::vector<int32_t> yh;

    Harness(Device& dev, const Model& model, int r, uint64_t salt)
        : d(dev),
          m(model),
          rows(r),
          params(dev, model.flat_size()),
          grads(dev, model.flat_size()),
          metrics(dev, kMetricSlots),
          acts(model.make_activations(dev, r)) {
        Rng rng(salt);
        xh = rng.uniform(size_t(rows) * m.input_features(), -1.0f, 1.0f);
        yh = rng.labels(rows, m.output_features());
        x = upload(d, xh);
        y = upload(d, yh);
        m.init_params(d, d.compute_stream(), params.data());
        fill_floats(d, d.compute_stream(), m.flat_size(), 0.0f, grads.data());
    }

    Pass pass(bool training = true) {
        Pass p = training_pass(d, rows, params.data(), grads.data(), acts, base_seed());
        p.row_offset = 3;
        p.step = 9;
        p.training = training;
        return p;
    }

    // Mean softmax cross-entropy over the batch, in double from the model's logits.
    double loss(const std::vector<float>& p_host) {
        d.copy_to_device(d.compute_stream(), params.data(), p_host.data(), p_host.size() * sizeof(float));
        Pass p = pass();
        const void* logits = m.forward(p, x.data());
        const int classes = m.output_features();
        std::vector<float> z(size_t(rows) * classes);
        d.copy_to_host(d.compute_stream(), z.data(), logits, z.size() * 4);
        d.synchronize();
        double loss = 0;
        for (int i = 0; i < rows; ++i) {
            const float* r = &z[size_t(i) * classes];
            double mx = r[0];
            for (int j = 1; j < classes; ++j) mx = std::max(mx, double(r[j]));
            double s = 0;
            for (int j = 0; j < classes; ++j) s += std::exp(r[j] - mx);
            loss += std::log(s) + mx - r[yh[size_t(i)]];
        }
        return loss / rows;
    }

    // Backprop gradients; records the gradient units backward reports, in its order.
    std::vector<float> backprop(std::vector<int>* units = nullptr, bool accumulate = false) {
        fill_floats(d, d.compute_stream(), 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics.data()));
        Pass p = pass();
        p.accumulate = accumulate;
        const void* logits = m.forward(p, x.data());
        void* dl = m.dlogits_buffer(acts);
        softmax_xent(d, d.compute_stream(), rows, m.output_features(), logits, y.data(), 1.0f / rows, nullptr, dl,
                     metrics.data());
        m.backward(p, dl, [&](int unit) {
            if (units) units->push_back(unit);
        });
        return download(d, grads);
    }
};

// Backprop gradients vs finite differences for (a sample of) every trainable parameter, with
// the parameters perturbed first so that no gamma is exactly 1 and no bias 0. At a ReLU kink or
// a max-pool tie the central difference straddles two linear pieces; there one of the one-sided
// differences must agree. A first-layer weight moves every activation behind a batchnorm, so
// +-eps can cross a kink on both sides; only then the differences are taken again with eps / 4,
// and once more with eps / 16, central only (each four times less likely to cross one; float32
// logits make them noisier, hence the wider bound, which one-sided differences would widen past
// a 5% error in backprop). Which point lands near a kink depends on the products'
// rounding, so on the kernels measured on the machine: a clean clone's run met one at both 1e-3
// and 2.5e-4 (differences 0.293 and 0.334, moving towards backprop's 0.370).
void check_gradients(Device& d, const Model& m, int rows, uint64_t salt, size_t per_tensor = 40) {
    Harness h(d, m, rows, salt);
    Rng rng(salt + 100);
    auto p = download(d, h.params);
    for (const auto& t : m.tensors())
        if (t.trainable)
            for (size_t i = 0; i < t.count; ++i) p[t.offset + i] += 0.05f * rng.normal(1)[0];
    d.copy_to_device(d.compute_stream(), h.params.data(), p.data(), p.size() * sizeof(float));
    std::vector<int> units;
    const auto bp = h.backprop(&units);
    int checked = 0, failures = 0;
    // Does backprop's g agree with the differences at step eps (the absolute bound scales with
    // the float32 noise, 1/eps)? Returns the central difference.
    auto agrees = [&](size_t k, double g, double eps, double& central, bool one_sided = true) {
        const float orig = p[k];
        p[k] = orig + float(eps);
        const double up = h.loss(p);
        p[k] = orig - float(eps);
        const double down = h.loss(p);
        p[k] = orig;
        const double at = h.loss(p);
        const double noise = 1e-3 / eps;
        central = (up - down) / (2 * eps);
        return std::fabs(central - g) <= 3e-4 * noise + 1e-2 * std::fabs(g) ||
               (one_sided && (std::fabs((up - at) / eps - g) <= 2e-3 * noise + 3e-2 * std::fabs(g) ||
                              std::fabs((at - down) / eps - g) <= 2e-3 * noise + 3e-2 * std::fabs(g)));
    };
    for (const auto& t : m.tensors()) {
        if (!t.trainable) continue;
        for (size_t s = 0; s < std::min(t.count, per_tensor); ++s) {
            const size_t i = t.count <= per_tensor ? s : size_t(rng.integer(0, int(t.count) - 1));
            const size_t k = t.offset + i;
            const double g = bp[k];
            double central = 0, fine = 0, finer = 0;
            const bool ok =
                agrees(k, g, 1e-3, central) || agrees(k, g, 2.5e-4, fine) || agrees(k, g, 6.25e-5, finer, false);
            if (!ok && ++failures <= 5)
                MESSAGE(t.name << "[" << i << "]: backprop " << g << " vs finite differences " << central
                               << " (eps 1e-3), " << fine << " (eps 2.5e-4), " << finer << " (eps 6.25e-5)");
            ++checked;
        }
    }
    CHECK(failures == 0);
    CHECK(checked > 0);
    CHECK(reported_every_unit(m, units));
}

void overfit(Device& d, const std::string& type) {
    Rng rng(77);
    const int rows = 32, classes = 4;
    Model m({6, 6, 1},
            {conv(4, 3, 1, true, Activation::relu), maxpool(2), flatten(), dense(64, Activation::gelu),
             dense(classes, Activation::none)},
            5);
    Harness h(d, m, rows, 78);
    OptimizerConfig oc;
    oc.type = type;
    oc.lr = type == "sgd" ? 0.1 : 0.01;
    const auto opt = make_optimizer(d, oc, m.trainable_size());
    float first = 0, last = 0;
    for (int step = 0; step < 300; ++step) {
        h.backprop();
        opt->apply(d.compute_stream(), h.params.data(), h.grads.data(), step, float(oc.lr), nullptr, nullptr, false);
        const float loss = float(download(d, h.metrics)[kMetricLossSum] / rows);
        if (step == 0) first = loss;
        last = loss;
    }
    CHECK(first > 1.0f);
    CHECK(last < 0.01f);
}

}  // namespace

TEST_CASE("model layout: PyTorch names and shapes, aligned offsets, trainable tensors before the state") {
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
    CHECK(!m.has_state());
    CHECK(m.input_features() == 784);
    CHECK(m.output_features() == 10);

    Model c(
        {8, 8, 3},
        {conv(16, 3, 1, true, Activation::none), batchnorm(false, Activation::relu),
         residual({conv(16, 3, 1, true, Activation::none), batchnorm(false, Activation::none)}, "", Activation::relu),
         residual({conv(32, 3, 2, true, Activation::none), batchnorm(false, Activation::none)}, "conv1x1",
                  Activation::relu),
         global_avgpool(), dense(10, Activation::none)},
        2);
    CHECK(c.find("layers.0.weight")->shape == std::vector<int>{16, 3, 3, 3});  // [out, in, kh, kw]
    CHECK(c.find("layers.1.running_var")->trainable == false);
    CHECK(c.find("layers.2.layers.0.weight")->shape == std::vector<int>{16, 16, 3, 3});
    CHECK(c.find("layers.3.shortcut.0.weight")->shape == std::vector<int>{32, 16, 1, 1});
    CHECK(c.find("layers.3.shortcut.1.running_mean") != nullptr);
    CHECK(c.find("layers.3.layers.1.weight")->layer == 3);  // inner tensors belong to their top-level block
    CHECK(c.has_state());
    for (const auto& t : c.tensors())
        CHECK((t.trainable ? t.offset + t.count <= c.trainable_size() : t.offset >= c.trainable_size()));
    CHECK(c.output_features() == 10);
}

TEST_CASE("the model rejects impossible layer lists with the key that is wrong") {
    CHECK_THROWS_WITH_AS(Model({28, 28}, {dense(10, Activation::none)}, 1),
                         doctest::Contains("model.layers.0: dense needs a vector input"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({4}, {conv(3, 3, 1, true, Activation::none), dense(2, Activation::none)}, 1),
                         doctest::Contains("model.layers.0: conv2d needs an image input"), ConfigError);
    CHECK_THROWS_WITH_AS(
        Model({4, 4, 1}, {conv(3, 5, 1, false, Activation::none), flatten(), dense(2, Activation::none)}, 1),
        doctest::Contains("model.layers.0: a 5x5 kernel does not fit"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({8, 8, 2},
                               {residual({conv(4, 3, 1, true, Activation::none)}, "", Activation::relu), flatten(),
                                dense(2, Activation::none)},
                               1),
                         doctest::Contains("add shortcut: conv1x1"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({8, 8, 2}, {conv(4, 3, 1, true, Activation::none)}, 1),
                         doctest::Contains("ends with an image"), ConfigError);
    CHECK_THROWS_AS(Model({4}, {flatten()}, 1), ConfigError);  // nothing trainable
}

TEST_CASE("gradients match finite differences: dense, dropout, flatten (NCHW order), loss") {
    auto d = make_cpu_device(0);
    check_gradients(*d,
                    Model({2, 3, 2},
                          {flatten(), dense(9, Activation::relu), dropout(0.25f), dense(7, Activation::gelu),
                           dense(5, Activation::none)},
                          11),
                    6, 1);
    check_gradients(*d, Model({6}, {dense(5, Activation::gelu, false), dense(4, Activation::none, false)}, 12), 5, 2);
}

TEST_CASE("a dense weight's gradient in blocks of rows: each block a gradient unit, the same gradients") {
    auto d = make_cpu_device(0);
    const std::vector<LayerSpec> layers = {dense(20, Activation::relu), dropout(0.25f), dense(17, Activation::gelu),
                                           dense(5, Activation::none, false)};
    const Model whole({6}, layers, 11);
    const Model pieced({6}, layers, 11, false, 14);  // blocks of 8 rows (the fewest that hold 14 floats, in 8s)
    REQUIRE(whole.tensors().size() == pieced.tensors().size());
    for (size_t i = 0; i < whole.tensors().size(); ++i) CHECK(whole.tensors()[i].offset == pieced.tensors()[i].offset);
    // 3 + 1 (bias) + 3 + 1 + 1 (5 rows: one block) pieces, end to end over each tensor, units rising with offsets
    const auto& pieces = pieced.gradient_pieces();
    REQUIRE(pieces.size() == 9);
    CHECK(whole.gradient_pieces().size() == 5);
    CHECK(pieced.gradient_units() == 3 + 3 + 1);
    for (size_t k = 0; k + 1 < pieces.size(); ++k) {
        CHECK(pieces[k].unit <= pieces[k + 1].unit);
        CHECK(pieces[k].unit == pieces[k].written_from);
        if (pieces[k + 1].begin != pieces[k].end)  // a tensor's end: the next starts at its aligned offset
            CHECK(pieces[k + 1].begin % Model::kTensorAlign == 0);
    }
    const TensorInfo* w1 = pieced.find("layers.2.weight");
    CHECK(w1->unit == 3);  // its first rows' block: the last backward reports
    CHECK(w1->written_from == 5);
    CHECK(pieced.find("layers.2.bias")->unit == 5);  // written with the last block, first
    CHECK(pieces[4].begin == w1->offset);
    CHECK(pieces[4].end == w1->offset + 8 * 20);
    CHECK(pieces[6].end - pieces[6].begin == 20);  // the rest: one row
    CHECK(pieced.find("layers.3.weight")->written_from == 6);
    // the same gradients, written and accumulated, every unit reported once and last first (a
    // block's product may take another kernel than the whole one's, which adds the rows in another
    // order: within rounding)
    Harness a(*d, whole, 6, 4), b(*d, pieced, 6, 4);
    std::vector<int> units;
    CHECK(rel_error(b.backprop(&units), a.backprop()) < 1e-6);
    CHECK(reported_every_unit(pieced, units));
    CHECK(rel_error(b.backprop(nullptr, true), a.backprop(nullptr, true)) < 1e-6);
    check_gradients(*d, pieced, 5, 2);
}

TEST_CASE("gradients match finite differences: conv2d (padding, stride, 1x1), pools, batchnorm, layernorm, rmsnorm") {
    auto d = make_cpu_device(0);
    // same padding, max pool, valid conv, batchnorm with relu, padded average pool, global pool, layernorm
    check_gradients(*d,
                    Model({6, 6, 2},
                          {conv(3, 3, 1, true, Activation::relu), maxpool(2), conv(4, 2, 1, false, Activation::none),
                           batchnorm(false, Activation::relu), avgpool(2, 1, 1), global_avgpool(), layernorm(),
                           dense(3, Activation::none)},
                          21),
                    5, 3);
    // stride 2 with explicit padding, a direct 1x1 convolution, overlapping padded max windows, gelu
    check_gradients(
        *d,
        Model({7, 7, 3},
              {conv_pad(4, 3, 2, 2, Activation::gelu), conv(5, 1, 1, false, Activation::none), maxpool_pad(3, 2, 1),
               flatten(), layernorm(), dense(6, Activation::gelu), rmsnorm(), dense(4, Activation::none)},
              22),
        4, 4);
}

TEST_CASE("gradients match finite differences: residual blocks, identity and projection shortcuts") {
    auto d = make_cpu_device(0);
    check_gradients(*d,
                    Model({4, 4, 3},
                          {conv(4, 3, 1, true, Activation::relu),
                           residual({conv(4, 3, 1, true, Activation::none), batchnorm(false, Activation::relu),
                                     conv(4, 3, 1, true, Activation::none), batchnorm(false, Activation::none)},
                                    "", Activation::relu),
                           residual({conv(6, 3, 2, true, Activation::none), batchnorm(false, Activation::relu),
                                     conv(6, 3, 1, true, Activation::none), batchnorm(false, Activation::none)},
                                    "conv1x1", Activation::relu),
                           global_avgpool(), dense(3, Activation::none)},
                          31),
                    4, 5, 20);
    // GELU keeps its pre-activation (batchnorm's and the join's); a join without activation
    check_gradients(*d,
                    Model({4, 4, 3},
                          {conv(4, 3, 1, true, Activation::none),
                           residual({conv(4, 3, 1, true, Activation::none), batchnorm(false, Activation::gelu),
                                     conv(4, 3, 1, true, Activation::none), batchnorm(false, Activation::none)},
                                    "", Activation::gelu),
                           residual({conv(4, 3, 1, true, Activation::none), batchnorm(false, Activation::relu)}, "",
                                    Activation::none),
                           global_avgpool(), dense(3, Activation::none)},
                          32),
                    4, 5, 20);
}

TEST_CASE("gradient accumulation adds backward passes; batchnorm's running statistics accumulate too") {
    auto d = make_cpu_device(0);
    Model m({4, 4, 2},
            {conv(3, 3, 1, true, Activation::relu), batchnorm(false, Activation::none), flatten(),
             dense(3, Activation::none)},
            4);
    Harness h(*d, m, 5, 3);
    const auto once = h.backprop();
    const auto twice = h.backprop(nullptr, true);
    for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]).epsilon(1e-5));
    const TensorInfo* rv = m.find("layers.1.running_var");
    CHECK(once[rv->offset] > 0.0f);  // this batch's (weighted) statistics
}

// CPU convolutions multiply pixel-major columns by permuted weights (Device::pixel_major_columns),
// a cache's worth of images at a time; the GPUs keep PyTorch's column order and the whole batch.
// The same gradients either way, but for the order of the products' sums; micro-batches
// accumulate through the permutation and the blocks too.
TEST_CASE("cpu convolutions with pixel-major columns, image blocks: the gradients of the GPU's column order") {
    const Model m({7, 7, 3},
                  {conv(4, 3, 1, true, Activation::relu), conv_pad(5, 3, 2, 1, Activation::none),
                   batchnorm(false, Activation::relu), conv(6, 1, 1, false, Activation::none),
                   conv(3, 2, 1, false, Activation::gelu, false), flatten(), dense(3, Activation::none)},
                  41);
    auto pixel_major = make_cpu_device(0);
    std::unique_ptr<Device> channel_major;
    {
        ::setenv("MIRRORED_PIXEL_MAJOR_COLUMNS", "0", 1);
        channel_major = make_cpu_device(1);
        ::unsetenv("MIRRORED_PIXEL_MAJOR_COLUMNS");
    }
    REQUIRE(pixel_major->pixel_major_columns());
    REQUIRE_FALSE(channel_major->pixel_major_columns());
    Harness a(*pixel_major, m, 6, 42), b(*channel_major, m, 6, 42);
    const auto ga = a.backprop(), gb = b.backprop();
    CHECK(rel_error(ga, gb) < 1e-5);
    CHECK(rel_error(a.backprop(nullptr, true), b.backprop(nullptr, true)) < 1e-5);  // accumulated: twice

    // Images whose columns outgrow the CPU's block (Device::column_block_bytes): the CPU makes and
    // multiplies them image by image, the simulated GPU (the GPUs' path) all at once.
    const Model big({24, 24, 24},
                    {conv(8, 3, 1, true, Activation::relu), conv_pad(6, 3, 2, 1, Activation::none, false),
                     global_avgpool(), dense(3, Activation::none)},
                    43);
    const size_t per_image = size_t(24) * 24 * 24 * 9 * sizeof(float);
    CHECK(2 * per_image > pixel_major->column_block_bytes());  // one image per block: three blocks
    CHECK(per_image <= pixel_major->column_block_bytes());
    auto sim = make_sim_device(0);
    CHECK(sim->column_block_bytes() == 0);
    Harness c(*pixel_major, big, 3, 44), g(*sim, big, 3, 44);
    // Sums over three images' 484 pixels in other orders: about 1e-5 on 1% of seeds (1.3e-5 seen);
    // fp32's bound for 1452 terms is 1452 x 2^-24 = 8.7e-5.
    CHECK(rel_error(c.backprop(), g.backprop()) < 1e-4);
    CHECK(rel_error(c.backprop(nullptr, true), g.backprop(nullptr, true)) < 1e-4);
    // The scratch holds a block's columns: one image's on the CPU, the batch's on the GPUs' path;
    // what is allocated is what the memory plan says.
    CHECK(c.acts.bytes() == big.activation_bytes(3, sizeof(float), kCpuColumnBlockBytes));
    CHECK(g.acts.bytes() == big.activation_bytes(3, sizeof(float), 0));
    CHECK(g.acts.bytes() - c.acts.bytes() == 2 * per_image);
}

TEST_CASE("a small CNN overfits a fixed batch on the CPU backend and on a simulated GPU (SGD and AdamW)") {
    for (DeviceType t : {DeviceType::cpu, DeviceType::sim}) {
        CAPTURE(device_type_name(t));
        auto d = backend_of(t).make(0);
        overfit(*d, "sgd");
        overfit(*d, "adamw");
    }
}

TEST_CASE("a small CNN overfits a fixed batch on the CUDA backend (SGD and AdamW)" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    auto d = make_cuda_device(0);
    overfit(*d, "sgd");
    overfit(*d, "adamw");
}

TEST_CASE(
    "CUDA forward/backward of whole models (MLP, CNN with batchnorm and a residual block) match CPU, fused epilogues "
    "too" *
    doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    const Model mlp({3, 5, 2},
                    {flatten(), dense(33, Activation::gelu), dropout(0.2f), dense(17, Activation::relu),
                     dense(6, Activation::none)},
                    8);
    const Model cnn({8, 8, 3},
                    {conv(8, 3, 1, true, Activation::relu), maxpool(2),
                     residual({conv(8, 3, 1, true, Activation::none), batchnorm(false, Activation::relu),
                               conv(8, 3, 1, true, Activation::none), batchnorm(false, Activation::none)},
                              "", Activation::relu),
                     layernorm(), global_avgpool(), dense(6, Activation::none)},
                    9);
    for (const Model* m : {&mlp, &cnn}) {
        std::vector<std::vector<float>> grads, params;
        for (int run = 0; run < 3; ++run) {  // CPU, CUDA, CUDA with fused epilogues
            auto d = run > 0 ? make_cuda_device(0) : make_cpu_device(0);
            d->set_fused_epilogues(run == 2);
            Harness h(*d, *m, 19, 21);
            grads.push_back(h.backprop());
            params.push_back(download(*d, h.params));
        }
        CHECK(params[1] == params[0]);  // identical initial weights
        CHECK(rel_error(grads[1], grads[0]) < 1e-4);
        CHECK(rel_error(grads[2], grads[0]) < 1e-4);
    }
}
