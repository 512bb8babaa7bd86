// The export layout without LibTorch: GPT's names, the tensor lists, config.json checked both ways.
#include "models/export_layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "gtest/gtest.h"
#include "models/registry.h"

namespace stagehand {
namespace {

// Runs `read` with `fifo` (a FIFO no one writes) in some input's place: it must come back at once. A
// reader left waiting for a writer (the defect) is released after 10 s by opening the FIFO's other
// end, and the test fails.
template <typename F>
auto WithinTenSeconds(const std::string& fifo, F read) -> decltype(read()) {
  auto result = std::async(std::launch::async, read);
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "still waiting on the FIFO " << fifo << " after 10 s";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  return result.get();
}

std::string MakeFifo(const std::string& path) {
  ::unlink(path.c_str());
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

ModelSpec Resolved(const std::string& preset) {
  absl::StatusOr<ModelSpec> s = FindBuiltinModel(preset)->Resolve(preset, ModelSpec());
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(ExportName, Gpt_MapsPipelineLayersToPeerNames) {
  const ModelSpec s = Resolved("tiny");  // 4 blocks: layers 0..9
  EXPECT_EQ(ExportName(s, "layers.0.weight"), "tok.weight");
  EXPECT_EQ(ExportName(s, "layers.1.qkv.weight"), "blocks.0.qkv.weight");
  EXPECT_EQ(ExportName(s, "layers.4.fc2.bias"), "blocks.1.fc2.bias");
  EXPECT_EQ(ExportName(s, "layers.9.ln_f.weight"), "ln_f.weight");
  EXPECT_EQ(ExportName(s, "layers.9.lm_head.weight"), "head.weight");
}

TEST(ExportName, Llama_IsHuggingFacesAlready) {
  EXPECT_EQ(ExportName(Resolved("llama-tiny"), "model.layers.2.mlp.up_proj.weight"),
            "model.layers.2.mlp.up_proj.weight");
}

TEST(ExportedTensors, CountsAndShapes) {
  absl::StatusOr<std::vector<ExportTensor>> gpt = ExportedTensors(Resolved("tiny"));
  ASSERT_TRUE(gpt.ok());
  EXPECT_EQ(gpt->size(), 1 + 4 * 12 + 3u);
  absl::StatusOr<std::vector<ExportTensor>> llama = ExportedTensors(Resolved("llama-tiny"));
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->size(), 1 + 4 * 9 + 2u);
  EXPECT_EQ((*llama)[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ((*llama)[3].shape, (std::vector<int64_t>{32, 64}));  // 2 kv heads of 16
  ModelSpec other;
  other.set_family("mine");
  EXPECT_TRUE(absl::IsNotFound(ExportedTensors(other).status()));
}

TEST(CheckExportMatches, ConfigOfOtherSizes_IsRefusedNamingTheFlag) {
  ModelSpec s = Resolved("llama-tiny");
  ExportDirectory e;
  e.dir = "/x";
  e.config_json = ExportConfigJson("llama-tiny", s);
  s.set_ffn_hidden(128);
  absl::Status st = CheckExportMatches(e, s);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("intermediate_size 176 but this job's model has 128; pass --ffn_hidden=176"),
            std::string::npos)
      << st.message();
}

TEST(CheckExportMatches, MissingTensor_IsRefusedNamingIt) {
  const ModelSpec s = Resolved("llama-tiny");
  ExportDirectory e;
  e.dir = "/x";
  e.config_json = ExportConfigJson("llama-tiny", s);
  e.files = {"model.safetensors"};
  e.headers.resize(1);
  absl::Status st = CheckExportMatches(e, s);
  EXPECT_NE(st.message().find("has no tensor model.embed_tokens.weight"), std::string::npos) << st.message();
}

TEST(ReadExportDirectory, NoConfig_IsOneLine) {
  absl::StatusOr<ExportDirectory> e = ReadExportDirectory("/nonexistent-export");
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_NE(e.status().message().find("config.json is missing"), std::string::npos);
}

TEST(ReadExportDirectory, FifoInPlaceOfConfigOrShard_RefusedAtOnce) {
  const std::string dir = ::testing::TempDir() + "/export_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string config = MakeFifo(dir + "/config.json");
  absl::StatusOr<ExportDirectory> e = WithinTenSeconds(config, [&] { return ReadExportDirectory(dir); });
  EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();
  EXPECT_NE(e.status().message().find(config + ": not a regular file but a FIFO"), std::string::npos) << e.status();
  ::unlink(config.c_str());
  std::ofstream(config) << ExportConfigJson("llama-tiny", Resolved("llama-tiny"));
  const std::string shard = MakeFifo(dir + "/model.safetensors");
  e = WithinTenSeconds(shard, [&] { return ReadExportDirectory(dir); });
  EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();
  EXPECT_NE(e.status().message().find(shard + ": not a regular file but a FIFO"), std::string::npos) << e.status();
}

TEST(ExportShardName, HuggingFacesNames) {
  EXPECT_EQ(ExportShardName(0, 1), "model.safetensors");
  EXPECT_EQ(ExportShardName(1, 3), "model-00002-of-00003.safetensors");
}

}  // namespace
}  // namespace stagehand
