// The embedding table's gradient added into its .grad in place: each distinct token's rows of the
// incoming gradient summed in token-position order and added to that token's row, touching only the rows
// the batch used. Plain CUDA (no LibTorch headers), compiled by nvcc in a genrule (kernels/BUILD.bazel);
// the LibTorch wrapper is EmbeddingLookup in nn/nn.cc.
#ifndef STAGEHAND_KERNELS_EMBEDDING_KERNELS_H_
#define STAGEHAND_KERNELS_EMBEDDING_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// grad[t, :] += sum over k with sorted_ids[k] == t of g[order[k], :], for every distinct t, where
// sorted_ids (n int64, ascending, equal ids in ascending position: a stable sort) and order (their
// positions in g) come from sorting the batch's flattened token ids; g [n, cols] fp32 and grad [vocab,
// cols] fp32 contiguous, cols a multiple of 4, pointers 16-byte aligned, ids in [0, vocab). Each run of
// equal ids is summed by one block in position order, and distinct ids write distinct rows: the result
// is deterministic. No host synchronisation (CUDA-graph capturable). cudaErrorInvalidValue for a shape
// or alignment it refuses, else the launch's error.
cudaError_t EmbeddingGradAccumulate(const int64_t* sorted_ids, const int64_t* order, const float* g, float* grad,
                                    int64_t n, int64_t cols, cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_EMBEDDING_KERNELS_H_
