// How the CUDA backend's column reductions (bias gradients, batchnorm and layernorm parameter
// sums: out[col] = sum over rows) split their rows. Host logic only, so it is tested without a GPU.
//
// A block covers 32 columns with 16 row lanes. One block per 32 columns over all rows leaves an
// H200's 132 SMs mostly idle whenever columns are few or rows many (a 1024-wide bias gradient at
// batch 2048 ran in 32 blocks, a convolution's 16-channel bias gradient over 128 x 32 x 32 rows in
// one; batchnorm's sums, chunked by 4096 rows, in 32), so such a reduction is split into row
// chunks: each block writes its chunk's partial sums to scratch and a second kernel adds them in
// chunk order. Both splits are fixed by the shape, so results repeat.
#pragma once

#include <algorithm>
#include <cstddef>

namespace mirrored::cuda {

constexpr int kColumnTile = 32, kColumnRowLanes = 16;  // one block: 32 columns x 16 row lanes
constexpr int kColumnOnePassRows = 512;                // 32 rows per lane: one pass is cheap enough
constexpr int kColumnMinChunkRows = 256;               // at least 16 rows per lane in a chunk
constexpr int kColumnTargetBlocks = 512;               // about four blocks per SM on an H200
constexpr int kColumnMaxChunks = 1024;

struct ColumnPlan {
    int chunks = 1;      // row chunks (the grid's y); 1: one pass straight into the output
    int chunk_rows = 1;  // rows per chunk, the last may have fewer; never an empty chunk
};

// scratch_floats: room for the partial sums, 2 per column and chunk.
inline ColumnPlan column_plan(int rows, int cols, size_t scratch_floats) {
    rows = std::max(rows, 1);
    cols = std::max(cols, 1);
    ColumnPlan p{1, rows};
    if (rows <= kColumnOnePassRows) return p;
    const long long tiles = (cols + kColumnTile - 1LL) / kColumnTile;
    long long chunks = std::min<long long>((kColumnTargetBlocks + tiles - 1) / tiles, rows / kColumnMinChunkRows);
    chunks = std::min<long long>(chunks, kColumnMaxChunks);
    chunks = std::min<long long>(chunks, static_cast<long long>(scratch_floats / (2 * size_t(cols))));
    if (chunks <= 1) return p;
    p.chunk_rows = static_cast<int>((rows + chunks - 1) / chunks);
    p.chunks = static_cast<int>((static_cast<long long>(rows) + p.chunk_rows - 1) / p.chunk_rows);  // no empty tail
    return p;
}

}  // namespace mirrored::cuda
