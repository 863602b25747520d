// libFuzzer entry point for one target, chosen at compile time (-DMIRRORED_FUZZ_TARGET=idx).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    mirrored::fuzz::MIRRORED_FUZZ_TARGET(data, size);
    return 0;
}
