// The rope_scaling keys an attention and a llama_block share (Hugging Face's config.json
// rope_scaling, flattened): rope_scaling: none | linear | llama3, rope_factor,
// rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions.
#pragma once

#include <string>

#include "base/spec_reader.h"
#include "kernels/ops/rope.h"
#include "mirrored/util.h"

namespace mirrored {

inline const char* rope_scaling_name(RopeScaling::Kind k) {
    return k == RopeScaling::Kind::linear ? "linear" : k == RopeScaling::Kind::llama3 ? "llama3" : "none";
}

inline RopeScaling read_rope_scaling(SpecReader& r, const std::string& p) {
    RopeScaling s;
    const std::string kind = r.choice(p + ".rope_scaling", "none", {"none", "linear", "llama3"});
    if (kind == "none") return s;
    s.kind = kind == "linear" ? RopeScaling::Kind::linear : RopeScaling::Kind::llama3;
    s.factor = float(r.number(p + ".rope_factor", 0.0, 0.0, 1e6));
    if (!(s.factor >= 1.0f))
        r.fail(p + ".rope_factor", "required with rope_scaling: " + kind + ": how many times the context grew (>= 1)");
    if (s.kind == RopeScaling::Kind::llama3) {
        s.low_freq_factor = float(r.number_above(p + ".rope_low_freq_factor", 1.0, 0.0, 1e6));
        s.high_freq_factor = float(r.number_above(p + ".rope_high_freq_factor", 4.0, 0.0, 1e6));
        if (!(s.high_freq_factor > s.low_freq_factor))
            r.fail(p + ".rope_high_freq_factor", "must be above rope_low_freq_factor");
        s.original_positions = int(r.integer(p + ".rope_original_max_positions", 8192, 1, int64_t(1) << 24));
    }
    return s;
}

// The keys of a scaling that is not none (none writes nothing: older checkpoints' hashes stay).
inline void add_rope_scaling_fields(Fields& f, const RopeScaling& s) {
    if (s.kind == RopeScaling::Kind::none) return;
    f.push_back({"rope_scaling", rope_scaling_name(s.kind)});
    f.push_back({"rope_factor", decimal_text(s.factor)});
    if (s.kind != RopeScaling::Kind::llama3) return;
    f.push_back({"rope_low_freq_factor", decimal_text(s.low_freq_factor)});
    f.push_back({"rope_high_freq_factor", decimal_text(s.high_freq_factor)});
    f.push_back({"rope_original_max_positions", std::to_string(s.original_positions)});
}

}  // namespace mirrored
