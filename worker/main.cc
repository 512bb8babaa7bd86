// stagehand's worker binary: the GPT and Llama families, then the shared worker main.
#include <cstdio>

#include "models/gpt/gpt_stage.h"
#include "models/llama/llama_stage.h"
#include "models/model_family.h"
#include "worker/worker_main.h"

int main(int argc, char** argv) {
  for (auto* make : {&stagehand::MakeGptFamily, &stagehand::MakeLlamaFamily}) {
    if (absl::Status s = stagehand::RegisterModelFamily(make()); !s.ok()) {
      std::fprintf(stderr, "worker: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return stagehand::WorkerMain(argc, argv);
}
