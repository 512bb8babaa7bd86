// GPU UUIDs in the form nvidia-smi and CUDA_VISIBLE_DEVICES use ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").
#ifndef STAGEHAND_COMMON_GPU_UUID_H_
#define STAGEHAND_COMMON_GPU_UUID_H_

#include <string>

namespace stagehand {

// `bytes`: the 16 bytes of a CUuuid / cudaUUID_t.
std::string FormatGpuUuid(const unsigned char* bytes);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_GPU_UUID_H_
