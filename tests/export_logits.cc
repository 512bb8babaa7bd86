// Our side of tests/export_test.sh's logit comparison: builds the model of a run's resolved job
// (its job.textproto) as STAGES pipeline stages of the real GPT or Llama code, loads an export into
// them with the worker's own import (ImportWeights, what --init_from runs), and writes a fixed batch of
// tokens and the logits of the chained stages (fp32, CPU) to OUT as safetensors ("tokens", "logits").
//   export_logits JOB_TEXTPROTO EXPORT_DIR OUT [STAGES]
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "engine/stage.h"
#include "google/protobuf/text_format.h"
#include "models/gpt/gpt_stage.h"
#include "models/llama/llama_stage.h"
#include "models/model_family.h"
#include "worker/checkpoint.h"

namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "export_logits: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stagehand;
  if (argc < 4) return Fail("usage: export_logits JOB_TEXTPROTO EXPORT_DIR OUT [STAGES]");
  const int stages = argc > 4 ? std::atoi(argv[4]) : 1;
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  JobSpec job;
  if (!in || !google::protobuf::TextFormat::ParseFromString(text.str(), &job)) {
    return Fail(std::string("cannot parse ") + argv[1]);
  }
  for (auto* make : {&MakeGptFamily, &MakeLlamaFamily}) {
    if (absl::Status s = RegisterModelFamily(make()); !s.ok()) return Fail(std::string(s.message()));
  }
  const ModelFamily* family = FindModelFamily(job.model());
  if (family == nullptr) return Fail("no family for --model=" + job.model());
  const ModelSpec& spec = job.model_spec();
  const int layers = family->description().NumLayers(spec);
  if (stages < 1 || stages > layers) return Fail("STAGES must be 1 to the pipeline layers");
  std::vector<std::unique_ptr<Stage>> chain;
  for (int s = 0; s < stages; ++s) {
    StageOptions o;
    o.job = &job;
    o.first_layer = layers * s / stages;
    o.last_layer = layers * (s + 1) / stages;
    o.num_layers = layers;
    o.seed = 7;  // not the run's: only the import may make the logits match
    absl::StatusOr<std::unique_ptr<Stage>> stage = family->MakeStage(o);
    if (!stage.ok()) return Fail(std::string(stage.status().message()));
    if (absl::Status st = ImportWeights(argv[2], spec, (*stage)->NamedParameters()); !st.ok()) {
      return Fail(std::string(st.message()));
    }
    (*stage)->SetTraining(false);
    chain.push_back(*std::move(stage));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = torch::randint(spec.vocab(), {2, spec.seq()}, at::detail::createCPUGenerator(1234),
                                        torch::TensorOptions().dtype(torch::kInt64));
  torch::Tensor x = tokens;
  for (auto& stage : chain) x = stage->Forward(x);
  torch::Tensor logits = x.to(torch::kFloat32).contiguous();
  std::vector<SafetensorsEntry> entries = {{"tokens", "I64", tokens.sizes().vec()},
                                           {"logits", "F32", logits.sizes().vec()}};
  const std::string prefix = SafetensorsPrefix(entries, {});
  std::ofstream out(argv[3], std::ios::binary);
  out.write(prefix.data(), prefix.size());
  out.write(static_cast<const char*>(tokens.data_ptr()), tokens.numel() * 8);
  out.write(static_cast<const char*>(logits.data_ptr()), logits.numel() * 4);
  if (!out) return Fail(std::string("cannot write ") + argv[3]);
  std::printf("export_logits: %d stages, logits %s\n", stages, std::to_string(logits.numel()).c_str());
  return 0;
}
