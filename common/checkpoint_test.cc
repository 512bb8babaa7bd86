// safetensors and checkpoint directories: round trips, a header written by hand as Hugging Face's
// library writes it, incomplete and corrupt checkpoints refused, pruning.
#include "common/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string d = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "_", getpid());
  mkdir(d.c_str(), 0755);
  return d;
}

// Writes a safetensors file of two F32 tensors [2] and [1, 2] holding 0..3.
std::string WriteSample(const std::string& path) {
  std::vector<SafetensorsEntry> t = {{"a.weight", "F32", {2}}, {"b", "F32", {1, 2}}};
  std::string bytes = SafetensorsPrefix(t, {{"step", "4"}});
  const float values[] = {0, 1, 2, 3};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  std::ofstream(path, std::ios::binary) << bytes;
  return bytes;
}

TEST(Safetensors, WriteThenRead_RoundTrips) {
  const std::string path = TempDir("st") + "/x.safetensors";
  const std::string bytes = WriteSample(path);
  EXPECT_EQ((bytes.size() - 16) % 8, 0u);  // the data starts 8-aligned
  absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->metadata.at("step"), "4");
  const SafetensorsEntry* b = h->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{1, 2}));
  float got[2];
  ASSERT_TRUE(ReadSafetensorsData(path, *h, *b, got).ok());
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(got[1], 3);
}

// The header as the Python safetensors library writes it (sorted keys, no spaces), by hand.
TEST(Safetensors, HandWrittenHeader_Parses) {
  const std::string json = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";
  std::string prefix(8, '\0');
  prefix[0] = static_cast<char>(json.size());
  prefix += json;
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsPrefix(prefix, static_cast<int64_t>(prefix.size()) + 6);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors[0].dtype, "BF16");
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(Safetensors, BadHeaders_Refused) {
  auto parse = [](const std::string& json, int64_t data) {
    std::string prefix(8, '\0');
    prefix[0] = static_cast<char>(json.size());
    return ParseSafetensorsPrefix(prefix + json, 8 + json.size() + data).status();
  };
  EXPECT_FALSE(parse(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8).ok());    // 3 floats in 8 bytes
  EXPECT_FALSE(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12).ok());  // a hole
  EXPECT_FALSE(parse(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1).ok());     // unknown dtype
  EXPECT_FALSE(parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8).ok());    // trailing bytes
  EXPECT_FALSE(parse("not json", 0).ok());
  EXPECT_TRUE(parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4).ok());
}

// A checkpoint of one shard at `step` under `run`; with_manifest false leaves it as a write cut short.
CheckpointManifest MakeCheckpoint(const std::string& run, int64_t step, bool with_manifest = true) {
  mkdir(CheckpointsDir(run).c_str(), 0755);
  const std::string dir = CheckpointDir(run, step);
  mkdir(dir.c_str(), 0755);
  absl::StatusOr<DurableFile> f = DurableFile::Create(dir + "/" + ShardName(0));
  EXPECT_TRUE(f.ok());
  const std::string data = absl::StrCat("shard of step ", step);
  EXPECT_TRUE(f->Append(data.data(), data.size()).ok());
  absl::StatusOr<DurableFile::Committed> c = f->Commit();
  EXPECT_TRUE(c.ok());
  CheckpointManifest m;
  m.set_format(1);
  m.set_step(step);
  CheckpointShard& s = *m.add_shards();
  s.set_file(ShardName(0));
  s.set_bytes(c->bytes);
  s.set_sha256(c->sha256);
  if (with_manifest) {
    EXPECT_TRUE(WriteManifest(dir, m).ok());
  }
  return m;
}

TEST(Checkpoint, NewestComplete_SkipsOneWithoutManifest) {
  const std::string run = TempDir("ck_newest");
  MakeCheckpoint(run, 4);
  MakeCheckpoint(run, 8, /*with_manifest=*/false);  // killed in the middle of its write
  absl::StatusOr<FoundCheckpoint> f = NewestCheckpoint(run);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->manifest.step(), 4);
  EXPECT_EQ(f->dir, CheckpointDir(run, 4));
  ASSERT_EQ(f->skipped.size(), 1u);
  EXPECT_TRUE(VerifyShard(f->dir, f->manifest.shards(0)).ok());
  EXPECT_FALSE(access((CheckpointDir(run, 8) + "/MANIFEST.tmp").c_str(), F_OK) == 0);
}

TEST(Checkpoint, NoneComplete_IsNotFound) {
  const std::string run = TempDir("ck_none");
  MakeCheckpoint(run, 4, false);
  EXPECT_EQ(NewestCheckpoint(run).status().code(), absl::StatusCode::kNotFound);
}

TEST(Checkpoint, CorruptShard_RefusedNamingItsPath) {
  const std::string run = TempDir("ck_corrupt");
  CheckpointManifest m = MakeCheckpoint(run, 4);
  const std::string shard = CheckpointDir(run, 4) + "/" + ShardName(0);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2);
    f.put('X');  // same size, other bytes
  }
  absl::Status s = VerifyShard(CheckpointDir(run, 4), m.shards(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(shard), std::string::npos) << s;
  ASSERT_EQ(truncate(shard.c_str(), 3), 0);  // and cut short: the listing refuses it before reading
  absl::StatusOr<FoundCheckpoint> f = NewestCheckpoint(run);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find(shard), std::string::npos) << f.status();
}

TEST(Checkpoint, Prune_KeepsTheNewestN) {
  const std::string run = TempDir("ck_prune");
  for (int step : {2, 4, 6, 8}) MakeCheckpoint(run, step);
  MakeCheckpoint(run, 10, false);  // in flight: kept
  ASSERT_TRUE(PruneCheckpoints(run, 2).ok());
  auto exists = [&](int step) { return access(CheckpointDir(run, step).c_str(), F_OK) == 0; };
  EXPECT_FALSE(exists(2));
  EXPECT_FALSE(exists(4));
  EXPECT_TRUE(exists(6));
  EXPECT_TRUE(exists(8));
  EXPECT_TRUE(exists(10));
}

}  // namespace
}  // namespace stagehand
