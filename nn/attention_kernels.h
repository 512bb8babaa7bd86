// The attention kernels a job may name (ModelSpec.attention), for the job check and the models.
#ifndef STAGEHAND_NN_ATTENTION_KERNELS_H_
#define STAGEHAND_NN_ATTENTION_KERNELS_H_

#include <string>

namespace stagehand {

inline constexpr const char* kAttentionKernels[] = {"cudnn", "flash", "torch"};

inline bool IsAttentionKernel(const std::string& name) {
  for (const char* k : kAttentionKernels) {
    if (name == k) return true;
  }
  return false;
}

// "cudnn, flash or torch", for messages that say what to pass instead.
inline std::string AttentionKernelChoices() {
  std::string s;
  constexpr size_t n = sizeof(kAttentionKernels) / sizeof(kAttentionKernels[0]);
  for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kAttentionKernels[i];
  return s;
}

}  // namespace stagehand

#endif  // STAGEHAND_NN_ATTENTION_KERNELS_H_
