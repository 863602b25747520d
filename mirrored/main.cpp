// mirrored command line (work in progress: commands land with their subsystems).
#include <cstdio>
#include <string>

#include "kernels/device.h"

int main(int argc, char** argv) {
    if (argc >= 2 && std::string(argv[1]) == "devices") {
        const int n = mirrored::cuda_device_count();
        std::printf("%d CUDA device(s)%s\n", n, n ? "" : (": " + mirrored::cuda_unavailable_reason()).c_str());
        return 0;
    }
    std::fprintf(stderr, "usage: mirrored devices\n");
    return 2;
}
