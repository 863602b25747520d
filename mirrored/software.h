// The software a run is made of - this build and the libraries it runs on - as one process sees
// it: what `mirrored --version` prints, what summary.json and every checkpoint record, and what
// every node of a job must share. Nodes that run other builds of mirrored, another CUDA runtime,
// NCCL or MPI are refused at the start, naming the difference, instead of hanging in their first
// collective or training on subtly different code (docs/ARCHITECTURE.md, "Versions").
#pragma once

#include <string>
#include <vector>

namespace mirrored {

struct SoftwareEntry {
    std::string name;   // "mirrored", "compiler", "CUDA runtime", "CUDA driver", "cuBLAS", "NCCL", "BLAS", "MPI"
    std::string value;  // "36e49da2c1f0", "g++ 12.2.0", "13.0", "none", ...
    bool nodes_must_match = false;  // a difference between nodes refuses the job; otherwise it is a note
};

// This build's `git describe --always --dirty` ("unknown" when it was not built from a checkout).
std::string mirrored_version();
// Every entry, in a fixed order.
std::vector<SoftwareEntry> software();
// "mirrored 36e49da2c1f0" and one "  name: value" line per other entry, for --version (no
// newline at the end).
std::string version_text();
// One line for the run's header: "mirrored 36e49da2c1f0 (g++ 12.2.0), CUDA runtime 13.0, ...".
std::string software_line();
// The entries as a JSON object's text {"mirrored": "...", ...}: summary.json and checkpoints.
std::string software_json();

// What node 0 and the other nodes differ in, from the entries each node serialised with
// software_fingerprint() (index = node). `refusal` is empty when every entry that must match
// does; `notes` name the differences that only cost bit-identity with a one-node run.
struct SoftwareComparison {
    std::string refusal;
    std::vector<std::string> notes;
};
std::string software_fingerprint();
SoftwareComparison compare_software(const std::vector<std::string>& fingerprints);

}  // namespace mirrored
