// Unit tests of job resolution: defaults, flags over the job file, the device choice against fake
// device inventories (0, 2 or 4 GPUs), and every refusal naming what to change.
#include "launcher/job.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr char kNoGpuNote[] = "no CUDA driver (libcuda.so.1)";

std::string Uuid(int i) { return absl::StrCat("GPU-0000000", i, "-aaaa-bbbb-cccc-dddddddddddd"); }

// A machine with `n` GPUs; with `cuda_visible_devices`, as if the variable were set to it.
DeviceInventory Inventory(int n, const std::string* cuda_visible_devices = nullptr) {
  DeviceInventory inv;
  for (int i = 0; i < n; ++i) {
    GpuInfo g;
    g.ordinal = i;
    g.uuid = Uuid(i);
    g.name = "NVIDIA H200";
    g.total_bytes = int64_t{141} << 30;
    inv.gpus.push_back(g);
  }
  if (cuda_visible_devices != nullptr) {
    inv.cuda_visible_devices = *cuda_visible_devices;
    inv.cuda_visible_devices_set = true;
  }
  if (n == 0) inv.note = kNoGpuNote;
  return inv;
}

std::vector<std::string> Uuids(const ResolvedJob& job) {
  std::vector<std::string> out;
  for (const GpuInfo& g : job.gpus) out.push_back(g.uuid);
  return out;
}

// Writes `text` to a fresh file under the test's temporary folder; returns its path.
std::string WriteJobFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

void ExpectInvalidArgument(const absl::StatusOr<ResolvedJob>& job, const std::string& fragment) {
  ASSERT_FALSE(job.ok()) << "resolved to workers=" << job->spec.workers();
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_THAT(std::string(job.status().message()), HasSubstr(fragment));
}

TEST(JobTest, ResolveJob_NoFlags_AppliesDefaults) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(JobRequest(), Inventory(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const JobSpec& spec = job->spec;
  // No --model: the reference GPT on the GPUs, for long enough to show what they give.
  EXPECT_EQ(spec.steps(), 30);
  EXPECT_EQ(spec.model(), "gpt-1.3b");
  EXPECT_EQ(spec.name(), "gpt-1.3b");
  EXPECT_EQ(spec.tensor_elements(), 1 << 20);
  EXPECT_EQ(spec.timeouts().register_ms(), 60000);
  EXPECT_EQ(spec.timeouts().heartbeat_interval_ms(), 100);
  EXPECT_EQ(spec.timeouts().heartbeat_timeout_ms(), 10000);
  EXPECT_EQ(spec.timeouts().progress_timeout_ms(), 300000);
  EXPECT_EQ(spec.timeouts().nccl_init_ms(), 60000);
  EXPECT_EQ(spec.timeouts().grace_ms(), 3000);
}

TEST(JobTest, ResolveJob_GpusFlag_TakesFirstNGpus) {
  JobRequest r;
  r.gpus = 2;
  r.model = "allreduce";
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CUDA);
  EXPECT_EQ(job->spec.workers(), 2);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1)));
  EXPECT_THAT(job->notes, IsEmpty());
}

TEST(JobTest, ResolveJob_NoGpusFlag_TakesAllVisible) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(JobRequest(), Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CUDA);
  EXPECT_EQ(job->spec.workers(), 4);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1), Uuid(2), Uuid(3)));
}

TEST(JobTest, ResolveJob_NoGpuNoFlags_RunsTwoCpuWorkersWithNote) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(JobRequest(), Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CPU);
  EXPECT_EQ(job->spec.workers(), 2);
  EXPECT_THAT(job->gpus, IsEmpty());
  ASSERT_THAT(job->notes, SizeIs(2));
  EXPECT_THAT(job->notes[0], AllOf(HasSubstr("--device=cpu"), HasSubstr(kNoGpuNote)));
  // No --model either: the tiny GPT, which learns visibly within seconds on CPU workers.
  EXPECT_EQ(job->spec.model(), "tiny");
  EXPECT_EQ(job->spec.steps(), 200);
  EXPECT_DOUBLE_EQ(job->spec.lr(), 3e-3);
  EXPECT_THAT(job->notes[1], HasSubstr("no --model given: training tiny for 200 steps"));
}

TEST(JobTest, ResolveJob_NoModelWithSteps_KeepsTheSteps) {
  JobRequest r;
  r.steps = 7;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "tiny");
  EXPECT_EQ(job->spec.steps(), 7);
}

TEST(JobTest, ResolveJob_DeviceCpuWithWorkers_RunsThatManyCpuWorkersWithoutNote) {
  JobRequest r;
  r.device = "cpu";
  r.workers = 4;
  r.model = "allreduce";
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));  // GPUs visible, CPU asked for
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CPU);
  EXPECT_EQ(job->spec.workers(), 4);
  EXPECT_THAT(job->gpus, IsEmpty());
  EXPECT_THAT(job->notes, IsEmpty());
}

TEST(JobTest, ResolveJob_MoreGpusThanVisible_NamesVisibleCount) {
  const std::string cvd = "0,1";
  JobRequest r;
  r.gpus = 4;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2, &cvd));
  ExpectInvalidArgument(job, "asked for 4 GPUs but 2 are visible");
  EXPECT_THAT(std::string(job.status().message()),
              AllOf(HasSubstr("CUDA_VISIBLE_DEVICES=0,1"), HasSubstr("--gpus=2 or fewer")));
}

TEST(JobTest, ResolveJob_MoreGpusThanVisibleWithoutCudaVisibleDevices_DoesNotMentionIt) {
  JobRequest r;
  r.gpus = 4;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--gpus=2 or fewer");
  EXPECT_THAT(std::string(job.status().message()), Not(HasSubstr("CUDA_VISIBLE_DEVICES")));
}

TEST(JobTest, ResolveJob_ZeroGpus_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.gpus = 0;
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--gpus=0");
}

TEST(JobTest, ResolveJob_NegativeGpus_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.gpus = -1;
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--gpus=-1");
}

TEST(JobTest, ResolveJob_ZeroWorkers_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.device = "cpu";
  r.workers = 0;
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "--workers=0");
}

// --steps=0 is as meaningless as --gpus=0; it must not silently become the default of 10.
TEST(JobTest, ResolveJob_ZeroSteps_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.steps = 0;
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--steps=0");
}

TEST(JobTest, ResolveJob_NegativeSteps_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.steps = -3;
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--steps=-3");
}

TEST(JobTest, ResolveJob_HeartbeatTimeoutBelowTwoIntervals_IsInvalidArgument) {
  JobRequest r;
  r.heartbeat_timeout_ms = 150;  // the interval is 100 ms
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--heartbeat_timeout");
}

TEST(JobTest, ResolveJob_UnknownDevice_IsInvalidArgumentListingDevices) {
  JobRequest r;
  r.device = "tpu";
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--device=tpu");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("cuda, cpu or auto"));
}

TEST(JobTest, ResolveJob_UnknownModel_ListsKnownModels) {
  JobRequest r;
  r.model = "bert";
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--model=bert");
  ASSERT_THAT(KnownModels(), Not(IsEmpty()));
  for (const std::string& m : KnownModels()) EXPECT_THAT(std::string(job.status().message()), HasSubstr(m));
}

TEST(JobTest, ResolveJob_GpusWithDeviceCpu_Contradict) {
  JobRequest r;
  r.device = "cpu";
  r.gpus = 2;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--gpus and --device=cpu contradict");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("--workers=N"));
}

TEST(JobTest, ResolveJob_WorkersDifferFromGpusWithCuda_IsInvalidArgument) {
  JobRequest r;
  r.device = "cuda";
  r.gpus = 2;
  r.workers = 3;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ExpectInvalidArgument(job, "--workers=3 with 2 GPUs");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("one worker per GPU"));
}

TEST(JobTest, ResolveJob_CudaWithoutGpu_IsInvalidArgumentSuggestingCpu) {
  JobRequest r;
  r.device = "cuda";
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ExpectInvalidArgument(job, "none is visible");
  EXPECT_THAT(std::string(job.status().message()), AllOf(HasSubstr(kNoGpuNote), HasSubstr("--device=cpu")));
}

TEST(JobTest, ResolveJob_GpusWithoutGpu_IsInvalidArgumentSuggestingCpu) {
  JobRequest r;
  r.gpus = 2;
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "--device=cpu");
}

constexpr char kJobText[] = R"pb(
  name: "from-file"
  device: DEVICE_KIND_CPU
  workers: 3
  steps: 25
  model: "allreduce"
  tensor_elements: 4096
  seed: 7
  timeouts { heartbeat_timeout_ms: 5000 grace_ms: 1000 }
)pb";

TEST(JobTest, ResolveJob_JobFile_ValuesHoldWithoutFlags) {
  JobRequest r;
  r.job_file = WriteJobFile("values_hold.textproto", kJobText);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));  // GPUs visible: the file says CPU
  ASSERT_TRUE(job.ok()) << job.status();
  const JobSpec& spec = job->spec;
  EXPECT_EQ(spec.name(), "from-file");
  EXPECT_EQ(spec.device(), DEVICE_KIND_CPU);
  EXPECT_EQ(spec.workers(), 3);
  EXPECT_EQ(spec.steps(), 25);
  EXPECT_EQ(spec.tensor_elements(), 4096);
  EXPECT_EQ(spec.seed(), 7);
  EXPECT_EQ(spec.timeouts().heartbeat_timeout_ms(), 5000);
  EXPECT_EQ(spec.timeouts().grace_ms(), 1000);
  EXPECT_EQ(spec.timeouts().register_ms(), 60000);  // not in the file: the default
  EXPECT_EQ(spec.model(), "allreduce");
  EXPECT_THAT(job->gpus, IsEmpty());
  EXPECT_THAT(job->notes, IsEmpty());
}

TEST(JobTest, ResolveJob_JobFileAndFlags_FlagsOverride) {
  JobRequest r;
  r.job_file = WriteJobFile("flags_override.textproto", kJobText);
  r.steps = 5;
  r.seed = 9;
  r.grace_ms = 2000;
  r.workers = 4;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  const JobSpec& spec = job->spec;
  EXPECT_EQ(spec.steps(), 5);
  EXPECT_EQ(spec.seed(), 9);
  EXPECT_EQ(spec.timeouts().grace_ms(), 2000);
  EXPECT_EQ(spec.workers(), 4);
  EXPECT_EQ(spec.tensor_elements(), 4096);                  // not overridden
  EXPECT_EQ(spec.timeouts().heartbeat_timeout_ms(), 5000);  // not overridden
}

TEST(JobTest, ResolveJob_JobFileCudaWorkers_TakesThatManyGpus) {
  JobRequest r;
  r.job_file = WriteJobFile("cuda_workers.textproto", "device: DEVICE_KIND_CUDA workers: 2");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CUDA);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1)));
}

// A flag overrides the job file: --gpus asks for GPU workers even where the file says CPU, and the
// user, who never passed --device=cpu, must not be told that --gpus contradicts it.
TEST(JobTest, ResolveJob_JobFileCpuAndGpusFlag_FlagWins) {
  JobRequest r;
  r.job_file = WriteJobFile("cpu_file_gpus_flag.textproto", kJobText);
  r.gpus = 2;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), DEVICE_KIND_CUDA);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1)));
}

TEST(JobTest, ResolveJob_UnreadableJobFile_IsInvalidArgumentNamingPath) {
  JobRequest r;
  r.job_file = absl::StrCat(::testing::TempDir(), "/no_such_job.textproto");
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), r.job_file);
}

TEST(JobTest, ResolveJob_MalformedJobFile_IsInvalidArgumentNamingPath) {
  JobRequest r;
  r.job_file = WriteJobFile("malformed.textproto", "steps: \"many\"\nno_such_field: 1\n");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, r.job_file);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("protobuf text format"));
}

TEST(JobTest, ReadJobFile_ValidText_ParsesFields) {
  absl::StatusOr<JobSpec> spec = ReadJobFile(WriteJobFile("valid.textproto", kJobText));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "from-file");
  EXPECT_EQ(spec->workers(), 3);
  EXPECT_EQ(spec->timeouts().grace_ms(), 1000);
  EXPECT_EQ(spec->timeouts().register_ms(), 0);  // defaults are ResolveJob's business
}

TEST(JobTest, ReadJobFile_MissingFile_IsInvalidArgumentNamingPathAndReason) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/missing.textproto");
  absl::StatusOr<JobSpec> spec = ReadJobFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(HasSubstr(path), HasSubstr("No such file or directory")));
}

// A directory opens as a stream but reads as nothing; it must not pass as an empty (all-default) job.
TEST(JobTest, ReadJobFile_Directory_IsInvalidArgumentNamingPath) {
  const std::string path = ::testing::TempDir();
  absl::StatusOr<JobSpec> spec = ReadJobFile(path);
  ASSERT_FALSE(spec.ok()) << "parsed as: " << spec->ShortDebugString();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace stagehand
