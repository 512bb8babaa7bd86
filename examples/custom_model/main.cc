// A worker binary of the user's own: stagehand's worker main with the "mlp-lm" family registered.
// Run it through the launcher: --model=mlp-lm-tiny --worker_binary=PATH_TO_THIS (docs/custom_model.md).
#include <cstdio>
#include <string>

#include "examples/custom_model/mlp_lm_family.h"
#include "models/model_family.h"
#include "worker/worker_main.h"

int main(int argc, char** argv) {
  if (absl::Status s = stagehand::RegisterModelFamily(stagehand::examples::MakeMlpLmFamily()); !s.ok()) {
    std::fprintf(stderr, "mlp_worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return stagehand::WorkerMain(argc, argv);
}
