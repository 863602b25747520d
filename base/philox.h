// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based generator, so element i of any random stream is a pure function of
// (key, counter) and CPU and CUDA draw identical numbers in any order and any thread layout.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace mirrored {

struct Philox4 {
    uint32_t v[4];
};

// The multipliers and the key schedule's increments (Weyl constants), and the rounds.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u, kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

MIRRORED_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < kPhiloxRounds; ++round) {
        if (round > 0) {
            k0 += kPhiloxW0;
            k1 += kPhiloxW1;
        }
        const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
        const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return Philox4{{c0, c1, c2, c3}};
}

// 64-bit counter + two 32-bit stream words, keyed by a 64-bit seed.
MIRRORED_HD Philox4 philox(uint64_t seed, uint64_t counter, uint32_t stream_a, uint32_t stream_b) {
    return philox4x32(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), stream_a, stream_b,
                      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// [0, 1) with 24 random bits: exact in float, identical on every device.
MIRRORED_HD float uniform01(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal by Box-Muller in double precision, rounded to float.
MIRRORED_HD float normal_from(uint32_t a, uint32_t b) {
    const double u1 = (static_cast<double>(a >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
    const double u2 = static_cast<double>(b >> 8) * (1.0 / 16777216.0);          // [0, 1)
    return static_cast<float>(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// Stream tags keep the generator's uses apart.
enum PhiloxStream : uint32_t {
    kStreamInit = 1,
    kStreamDropout = 2,
    kStreamShuffle = 3,
    kStreamAugment = 4,
    kStreamSynthetic = 5,
    kStreamWindows = 6,    // where a language model's random token windows start
    kStreamImageCrop = 7,  // an image-folder sample's random-resized crop and flip
};

}  // namespace mirrored
