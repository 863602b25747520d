#include "mirrored/tools/plan_measure.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "base/error.h"
#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/flat.h"
#include "kernels/ops/gemm.h"
#include "mirrored/model.h"
#include "mirrored/session.h"
#include "mirrored/strategy.h"
#include "mirrored/tools/timed_steps.h"
#include "mirrored/util.h"

namespace mirrored {

LocalShape local_shape(const Model& model, int rows, int accumulation, bool gpu_here, double budget_flops) {
    LocalShape s;
    s.rows = rows;
    if (gpu_here) return s;
    const double per_sample = std::max(1.0, model.train_flops_per_sample());
    // the fewest rows per micro-batch the model trains on (batch statistics need two)
    const int micro_batches = std::max(accumulation, 1);
    int per_micro = 1;
    for (;; ++per_micro) {
        try {
            model.check_batch(per_micro, per_micro);
            break;
        } catch (const ConfigError&) {
            if (per_micro * micro_batches >= rows) break;
        }
    }
    const double fewest = std::min(rows, per_micro * micro_batches);
    s.rows = int(std::clamp(std::floor(budget_flops / per_sample), fewest, double(rows)));
    if (per_sample * s.rows > budget_flops) s.warmup = s.steps = 1;
    return s;
}

namespace {

// One thread reading samples as a loader thread does (decoded, transformed) in a shuffled order,
// for about half a second.
double loader_rate(const Dataset& d) {
    std::vector<float> x(d.feature_size());
    std::vector<int32_t> labels(size_t(d.label_size));
    size_t n = 0;
    const double start = now_s();
    double elapsed = 0;
    do {
        const size_t i = (n * 2654435761u) % d.count();
        read_sample(d, i, 0, x.data(), d.has_targets() ? nullptr : labels.data());
        ++n;
        elapsed = now_s() - start;
    } while (elapsed < 0.5 || n < 8);
    return double(n) / elapsed;
}

// The config with synthetic data of the model's shape, and one local device: compute measured
// here does not depend on the data's values.
Config local_config(const Config& base, const std::vector<int>& shape, int classes, int rows, int steps,
                    const std::string& devices) {
    Config c = base;
    std::vector<std::string> dims;
    for (int d : shape) dims.push_back(std::to_string(d));
    // a language model reads token ids: windows of random tokens over its vocabulary
    const Model model(shape, base.model.layers, base.run.seed);
    Fields keys = {{"input_shape", yaml_list(dims)},
                   {"classes", std::to_string(std::max(classes, 2))},
                   {"train_samples", std::to_string(size_t(rows) * size_t(steps + 2))},
                   {"test_samples", std::to_string(rows)}};
    if (model.reads_token_ids()) keys.push_back({"vocab", std::to_string(model.output_classes())});
    c.data = make_data_config("synthetic", keys);
    c.data.normalize = DataConfig::Normalize::none;
    c.model.loss = LossConfig{};  // synthetic data has classes; the loss is a sliver of a step's time
    c.model.input_shape = shape;
    c.strategy.devices = devices;
    c.train.global_batch_size = rows;
    c.optimizer.lr = 0.01;  // the rate the measured steps have always run at (the config's own is not needed)
    return c;
}

double gemm_ceiling(Device& d) {
    const int n = d.traits().gpu ? 4096 : 1024;
    const size_t count = size_t(n) * n;
    const DType t = d.value_dtype();
    DeviceBuffer<unsigned char> a(d, d.act_bytes(count)), b(d, d.act_bytes(count));
    DeviceBuffer<float> c(d, count), f(d, count);
    const Stream s = d.compute_stream();
    fill_floats(d, s, count, 0.5f, f.data());
    convert_values(d, s, count, f.data(), DType::f32, a.data(), t);
    convert_values(d, s, count, f.data(), DType::f32, b.data(), t);
    auto once = [&] {
        gemm(d, s, false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n,
             GemmTypes{t, t, DType::f32});
    };
    once();
    d.synchronize();
    int iters = 0;
    const double t0 = now_s();
    do {
        once();
        d.synchronize();
        ++iters;
    } while (now_s() - t0 < 0.3);
    return 2.0 * n * double(n) * n * iters / (now_s() - t0);
}

}  // namespace

TrainSet train_set(const Config& cfg, bool count) {
    try {
        Datasets d;
        try {
            d = load_datasets(cfg.data, cfg.base_dir, cfg.run.seed);
        } catch (const std::bad_alloc&) {  // data the planner does not need may be too large to read
            throw DataError("the training data does not fit in the memory available");
        }
        TrainSet t;
        t.shape = cfg.model.input_shape.empty() ? d.train.shape : cfg.model.input_shape;
        t.samples = d.train.count();
        t.name = d.train.name;
        try {  // a sample that fails to decode costs the estimate, not the plan
            if (d.train.count() > 0) t.samples_per_thread = loader_rate(d.train);
        } catch (const Error& e) {
            t.why_not = e.what();
        }
        return t;
    } catch (const Error& e) {
        if (!cfg.model.input_shape.empty() && !count) return {cfg.model.input_shape, 0, "", 0, e.what()};
        if (cfg.model.input_shape.empty())
            throw ConfigError("model.input_shape", std::string("needed to size the model, and the data cannot "
                                                               "tell it (") +
                                                       e.what() + "): set model.input_shape");
        throw ConfigError("--price", std::string("the run's length needs the training set's size, and the data "
                                                 "cannot be read (") +
                                         e.what() + "): make it readable, or set train.steps");
    }
}

LocalStep measure_local(const Config& base, const std::vector<int>& shape, int classes, const LocalShape& at) {
    const int rows = at.rows;
    LocalStep out;
    out.device = cuda_device_count() > 0 ? "cuda:0" : "cpu:1";
    {
        const Config c = local_config(base, shape, classes, rows, at.warmup + at.steps, out.device);
        auto s = start_timed_session(c, nullptr, nullptr);
        out.seconds = time_steps(*s, at.warmup, at.steps, at.steps, nullptr, false).elapsed_s / at.steps;
        s->train_loader->stop();
        auto d = s->strategy->backend().make(0);  // a device or an exception, never null
        // cppcheck-suppress nullPointer
        d->set_precision(base.train.precision);
        out.gemm_flops = gemm_ceiling(*d);
    }
    {  // the kernels a step launches, as the simulated GPU counts them (one replica)
        const Config c = local_config(base, shape, classes, rows, 3, "sim:0");
        auto s = start_timed_session(c, nullptr, nullptr);
        out.launches = time_steps(*s, 1, 1, 1, nullptr, false).host_work.launches;
        s->train_loader->stop();
    }
    return out;
}

}  // namespace mirrored
