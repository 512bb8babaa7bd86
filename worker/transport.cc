// Helpers shared by every transport: the size of each element type.
#include "worker/transport.h"

namespace stagehand {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
  }
  return 0;  // Unreachable for valid enum values; keeps -Wreturn-type quiet.
}

}  // namespace stagehand
