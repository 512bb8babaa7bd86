// Tests of the built-in model descriptions: presets, checks, layers, parameter counts.
#include <gtest/gtest.h>

#include "models/registry.h"

namespace stagehand {
namespace {

ModelSpec Resolved(const std::string& preset, ModelSpec overrides = {}) {
  const ModelDescription* d = FindBuiltinModel(preset);
  EXPECT_NE(d, nullptr) << preset;
  absl::StatusOr<ModelSpec> s = d->Resolve(preset, overrides);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : ModelSpec();
}

TEST(FindBuiltinModel, PresetsAndFamilies_AreFound) {
  EXPECT_EQ(FindBuiltinModel("tiny")->family(), "gpt");
  EXPECT_EQ(FindBuiltinModel("gpt")->family(), "gpt");
  EXPECT_EQ(FindBuiltinModel("llama-tiny")->family(), "llama");
  EXPECT_EQ(FindBuiltinModel("tinyllama-1.1b")->family(), "llama");
  EXPECT_EQ(FindBuiltinModel("allreduce"), nullptr);
  EXPECT_EQ(BuiltinPresets(), (std::vector<std::string>{"tiny", "gpt-1.3b", "llama-tiny", "tinyllama-1.1b"}));
}

TEST(GptDescription, Gpt13b_HasReferenceSizesAndParameters) {
  const ModelSpec s = Resolved("gpt-1.3b");
  EXPECT_EQ(s.vocab(), 32768);
  EXPECT_EQ(s.hidden(), 2048);
  EXPECT_EQ(s.layers(), 24);
  EXPECT_EQ(s.attention(), "cudnn");
  const ModelDescription& d = *FindBuiltinModel("gpt");
  EXPECT_EQ(d.NumLayers(s), 50);
  // 2.606e14 FLOPs per step at GB = 32 (../shared/targets.md).
  EXPECT_NEAR(d.FlopsPerStep(s, 32, false), 2.606e14, 0.001e14);
  EXPECT_EQ(d.ParameterCount(s), 2 * 32768 * 2048 + 24 * (12 * 2048 * 2048 + 13 * 2048) + 2 * 2048);
}

TEST(LlamaDescription, TinyLlama_HasPublishedSizesAndParameters) {
  const ModelSpec s = Resolved("tinyllama-1.1b");
  EXPECT_EQ(s.heads(), 32);
  EXPECT_EQ(s.kv_heads(), 4);
  EXPECT_EQ(s.ffn_hidden(), 5632);
  EXPECT_EQ(s.layers(), 22);
  // 1.100e9 parameters (../shared/targets.md; TinyLlama-1.1B's config).
  EXPECT_NEAR(static_cast<double>(FindBuiltinModel("llama")->ParameterCount(s)), 1.100e9, 0.001e9);
}

TEST(Resolve, OverridesWin_ZeroKeepsPreset) {
  ModelSpec o;
  o.set_layers(6);
  const ModelSpec s = Resolved("llama-tiny", o);
  EXPECT_EQ(s.layers(), 6);
  EXPECT_EQ(s.hidden(), 64);
  EXPECT_EQ(s.family(), "llama");
  EXPECT_EQ(s.preset(), "llama-tiny");
}

TEST(Resolve, BadSizes_AreInvalidArgumentSayingWhatToChange) {
  ModelSpec o;
  o.set_hidden(66);
  absl::Status s = FindBuiltinModel("tiny")->Resolve("tiny", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--hidden=66 is not divisible by --heads=4"), std::string::npos) << s;
  o = ModelSpec();
  o.set_kv_heads(3);
  s = FindBuiltinModel("llama-tiny")->Resolve("llama-tiny", o).status();
  EXPECT_NE(s.message().find("--kv_heads=3 must divide --heads=4"), std::string::npos) << s;
  s = FindBuiltinModel("tiny")->Resolve("tiny", o).status();
  EXPECT_NE(s.message().find("Llama's sizes"), std::string::npos) << s;
  o = ModelSpec();
  o.set_attention("fast");
  s = FindBuiltinModel("tiny")->Resolve("tiny", o).status();
  EXPECT_NE(s.message().find("use cudnn, flash or torch"), std::string::npos) << s;
}

TEST(Estimate, OneCostPerLayer_HeadKeepsTheMostActivations) {
  const ModelSpec s = Resolved("tiny");
  const LayerProfile p = FindBuiltinModel("tiny")->Estimate(s, 4);
  ASSERT_EQ(p.layers_size(), 10);
  EXPECT_EQ(p.micro_batch(), 4);
  EXPECT_EQ(p.layers(1).forward_ms(), p.layers(3).forward_ms());  // every attention half alike
  EXPECT_GT(p.layers(9).activation_bytes(), p.layers(1).activation_bytes());  // the logits
}

}  // namespace
}  // namespace stagehand
