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

// --model_option names are the family's fused paths or the engine's, values true or false; a typo, a
// Llama option on the GPT or an "off" is refused in one line that names what is known.
TEST(Resolve, ModelOptions_KnownNamesAndBooleansOnly) {
  ModelSpec o;
  (*o.mutable_options())["cutlass_residual_gemm"] = "false";
  (*o.mutable_options())["fused_optimizer"] = "true";
  EXPECT_EQ(Resolved("gpt-1.3b", o).options().at("cutlass_residual_gemm"), "false");
  EXPECT_EQ(Resolved("tinyllama-1.1b", o).options().at("fused_optimizer"), "true");
  o = ModelSpec();
  (*o.mutable_options())["cutlas_residual_gemm"] = "false";
  absl::Status s = FindBuiltinModel("gpt")->Resolve("gpt-1.3b", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--model_option=cutlas_residual_gemm=false: gpt has no such option; it knows "
                             "fused_optimizer, inference_bf16_weights, deferred_wgrad, fused_qkv_grad"),
            std::string::npos)
      << s;
  o = ModelSpec();
  (*o.mutable_options())["fused_gelu"] = "false";  // the GPT's, not Llama's
  s = FindBuiltinModel("llama")->Resolve("llama-tiny", o).status();
  EXPECT_NE(s.message().find("llama has no such option"), std::string::npos) << s;
  o = ModelSpec();
  (*o.mutable_options())["fused_rotary"] = "off";
  s = FindBuiltinModel("llama")->Resolve("llama-tiny", o).status();
  EXPECT_NE(s.message().find("--model_option=fused_rotary=off: use fused_rotary=true or fused_rotary=false"),
            std::string::npos)
      << s;
}

TEST(Estimate, OneCostPerLayer_HeadKeepsTheMostActivations) {
  const ModelSpec s = Resolved("tiny");
  const LayerProfile p = FindBuiltinModel("tiny")->Estimate(s, 4);
  ASSERT_EQ(p.layers_size(), 10);
  EXPECT_EQ(p.micro_batch(), 4);
  EXPECT_EQ(p.layers(1).forward_ms(), p.layers(3).forward_ms());              // every attention half alike
  EXPECT_GT(p.layers(9).activation_bytes(), p.layers(1).activation_bytes());  // the logits
}

}  // namespace
}  // namespace stagehand
