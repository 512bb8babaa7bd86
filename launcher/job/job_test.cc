// Unit tests of job resolution: defaults, flags over the job file, the device choice against fake
// device inventories (0, 2 or 4 GPUs), and every refusal naming what to change.
#include "launcher/job/job.h"
#include "models/model_description.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/checkpoint.h"
#include "google/protobuf/text_format.h"
#include "launcher/plan/job_plan.h"
#include "launcher/coordinator/liveness.h"
#include "schedule/schedule.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
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
  inv.cpu_cores = 8;
  inv.memory_bytes = int64_t{64} << 30;
  return inv;
}

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
  EXPECT_EQ(spec.timeouts().heartbeat_timeout_ms(), kDefaultHeartbeatTimeoutMs);  // launcher/coordinator/liveness.h
  EXPECT_EQ(spec.timeouts().progress_timeout_ms(), 300000);
  EXPECT_EQ(spec.timeouts().nccl_init_ms(), 60000);
  EXPECT_EQ(spec.timeouts().grace_ms(), 3000);
}

TEST(JobTest, ResolveJob_GpusFlag_TakesFirstNGpus) {
  JobRequest r;
  r.gpus = 2;
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cuda");
  EXPECT_EQ(job->spec.workers(), 2);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1)));
  EXPECT_THAT(job->notes, IsEmpty());
}

TEST(JobTest, ResolveJob_NoGpusFlag_TakesAllVisible) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(JobRequest(), Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cuda");
  EXPECT_EQ(job->spec.workers(), 4);
  EXPECT_THAT(Uuids(*job), ElementsAre(Uuid(0), Uuid(1), Uuid(2), Uuid(3)));
}

TEST(JobTest, ResolveJob_NoGpuNoFlags_RunsTwoCpuWorkersWithNote) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(JobRequest(), Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cpu");
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
  r.flags.set_steps(7);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "tiny");
  EXPECT_EQ(job->spec.steps(), 7);
}

// --tensor_elements without --model: a model job would ignore it, and a bench would time a training
// step (on one GPU, with no collective at all) as "the first all-reduce".
TEST(JobTest, ResolveJob_TensorElementsWithoutModel_RefusedNamingModelAllreduce) {
  JobRequest r;
  r.gpus = 1;
  r.flags.set_steps(1);
  r.flags.set_tensor_elements(1 << 20);
  ExpectInvalidArgument(ResolveJob(r, Inventory(1)),
                        "with no --model this job would train gpt-1.3b instead: pass "
                        "--model=allreduce, or drop --tensor_elements");
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "allreduce");
  EXPECT_EQ(job->spec.tensor_elements(), 1 << 20);
}

// A program job: a bare name found on PATH, a relative path against the user's directory, the
// arguments as given, the user's directory to run in; not a model job. Refused: not found, not
// executable, --model beside it.
TEST(JobTest, ResolveJob_Program_ResolvedAsAShellWould) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_workers(2);
  r.program = {"sh", "-c", "true"};
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->spec.program_size(), 3);
  EXPECT_TRUE(job->spec.program(0) == "/bin/sh" || job->spec.program(0) == "/usr/bin/sh") << job->spec.program(0);
  EXPECT_EQ(job->spec.program(2), "true");
  EXPECT_FALSE(IsModelJob(job->spec));
  EXPECT_EQ(job->spec.workers(), 2);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/program_", getpid());
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/run.sh") << "#!/bin/sh\n";
  chmod((dir + "/run.sh").c_str(), 0755);
  std::ofstream(dir + "/plain.py") << "print(1)\n";
  setenv("BUILD_WORKING_DIRECTORY", dir.c_str(), 1);
  r.program = {"./run.sh"};
  job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.program(0), dir + "/./run.sh");
  EXPECT_EQ(job->spec.program_cwd(), dir);
  r.program = {"./plain.py"};
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "plain.py is not executable: chmod +x it");
  unsetenv("BUILD_WORKING_DIRECTORY");
  r.program = {"no-such-program-anywhere"};
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "-- no-such-program-anywhere: no such program on PATH");
  r.program = {"sh"};
  r.flags.set_model("tiny");
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "--model=tiny with a program (-- sh): the program is the job");
}

// A program never comes in a job file or a submission (a server's JobSpec): only from the command
// line (a server's command job), so that a submit token cannot make the server run a command. A job
// file's program is refused beside a command-line one too, rather than replaced by it.
TEST(JobTest, ResolveJob_ProgramInTheJobItself_Refused) {
  JobRequest r;
  JobSpec spec;
  spec.set_device("cpu");
  spec.set_workers(1);
  spec.add_program("/bin/sh");
  spec.add_program("-c");
  spec.add_program("touch /tmp/owned");
  r.spec = spec;
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "a program is given on the launcher's command line only");
  JobRequest f;
  f.job_file = WriteJobFile("with_program.textproto", "device: \"cpu\" workers: 1 program: \"/bin/true\"");
  ExpectInvalidArgument(ResolveJob(f, Inventory(0)), "the job names a program");
  f.program = {"sh", "-c", "true"};
  ExpectInvalidArgument(ResolveJob(f, Inventory(0)), "the job names a program");
}

// A command as lines show it: escaped and clipped, since a served command comes from a token.
TEST(JobTest, CommandLine_EscapedAndClipped) {
  JobSpec spec;
  EXPECT_EQ(CommandLine(spec), "");
  spec.add_program("/usr/bin/python3");
  spec.add_program("train.py");
  EXPECT_EQ(CommandLine(spec), "/usr/bin/python3 train.py");
  spec.add_program("a\nb\x1b[2J");
  EXPECT_EQ(CommandLine(spec), "/usr/bin/python3 train.py a\\nb\\x1b[2J");
  spec.add_program(std::string(1000, 'x'));
  EXPECT_EQ(CommandLine(spec).size(), 1038u);  // a run's lines keep a long command whole
  EXPECT_LT(CommandLine(spec, 200).size(), 260u);
  EXPECT_TRUE(absl::StrContains(CommandLine(spec, 200), "... (1034 bytes)")) << CommandLine(spec, 200);
}

TEST(JobTest, ResolveJob_TensorElementsWithAModel_Refused) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("tiny");
  r.flags.set_tensor_elements(4096);
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "not --model=tiny's job: drop --tensor_elements");
}

// A run directory's job.textproto holds every default, tensor_elements among them: run again with
// --job, a model's job file stays valid.
TEST(JobTest, ResolveJob_ModelJobFileWithTensorElements_Accepted) {
  JobRequest r;
  r.job_file = WriteJobFile("model_with_tensor_elements.textproto",
                            "device: \"cpu\" workers: 2 model: \"tiny\" tensor_elements: 1048576");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "tiny");
}

// A server's submission: the spec carries what the client typed.
TEST(JobTest, ResolveJob_SubmittedSpecNoModelWithSteps_KeepsTheStepsAndLr) {
  JobRequest r;
  r.spec.emplace();
  r.spec->set_steps(5);
  r.spec->set_lr(0.01);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "tiny");
  EXPECT_EQ(job->spec.steps(), 5);
  EXPECT_DOUBLE_EQ(job->spec.lr(), 0.01);
}

TEST(JobTest, ResolveJob_DeviceCpuWithWorkers_RunsThatManyCpuWorkersWithoutNote) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_workers(4);
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));  // GPUs visible, CPU asked for
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cpu");
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
  r.flags.set_device("cpu");
  r.flags.set_workers(0);
  ExpectInvalidArgument(ResolveJob(r, Inventory(0)), "--workers=0");
}

// --steps=0 is as meaningless as --gpus=0; it must not silently become the default of 10.
TEST(JobTest, ResolveJob_ZeroSteps_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.flags.set_steps(0);
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--steps=0");
}

TEST(JobTest, ResolveJob_NegativeSteps_IsInvalidArgumentNamingFlag) {
  JobRequest r;
  r.flags.set_steps(-3);
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--steps=-3");
}

TEST(JobTest, ResolveJob_HeartbeatTimeoutBelowTwoIntervals_IsInvalidArgument) {
  JobRequest r;
  r.flags.mutable_timeouts()->set_heartbeat_timeout_ms(150);  // the interval is 100 ms
  ExpectInvalidArgument(ResolveJob(r, Inventory(2)), "--heartbeat_timeout_ms=150");
}

TEST(JobTest, ResolveJob_UnknownDevice_IsInvalidArgumentListingDevices) {
  JobRequest r;
  r.flags.set_device("tpu");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--device=tpu");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("cuda, cpu or auto"));
}

TEST(JobTest, ResolveJob_UnknownModel_ListsKnownModels) {
  JobRequest r;
  r.flags.set_model("bert");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--model=bert");
  ASSERT_THAT(KnownModels(), Not(IsEmpty()));
  for (const std::string& m : KnownModels()) EXPECT_THAT(std::string(job.status().message()), HasSubstr(m));
}

TEST(JobTest, ResolveJob_GpusWithDeviceCpu_Contradict) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.gpus = 2;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ExpectInvalidArgument(job, "--gpus and --device=cpu contradict");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("--workers=N"));
}

TEST(JobTest, ResolveJob_WorkersDifferFromGpusWithCuda_IsInvalidArgument) {
  JobRequest r;
  r.flags.set_device("cuda");
  r.gpus = 2;
  r.flags.set_workers(3);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ExpectInvalidArgument(job, "--workers=3 with 2 GPUs");
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("one worker per GPU"));
}

TEST(JobTest, ResolveJob_CudaWithoutGpu_IsInvalidArgumentSuggestingCpu) {
  JobRequest r;
  r.flags.set_device("cuda");
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
  device: "cpu"
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
  EXPECT_EQ(spec.device(), "cpu");
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
  r.flags.set_steps(5);
  r.flags.set_seed(9);
  r.flags.mutable_timeouts()->set_grace_ms(2000);
  r.flags.set_workers(4);
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
  r.job_file = WriteJobFile("cuda_workers.textproto", "device: \"cuda\" workers: 2");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cuda");
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
  EXPECT_EQ(job->spec.device(), "cuda");
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
  EXPECT_THAT(std::string(spec.status().message()), AllOf(HasSubstr(path), HasSubstr("No such file or directory")));
}

// A directory opens as a stream but reads as nothing; it must not pass as an empty (all-default) job.
TEST(JobTest, ReadJobFile_Directory_IsInvalidArgumentNamingPath) {
  const std::string path = ::testing::TempDir();
  absl::StatusOr<JobSpec> spec = ReadJobFile(path);
  ASSERT_FALSE(spec.ok()) << "parsed as: " << spec->ShortDebugString();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
}

// Refusals are one line: the launcher prints them as its only output before exit 2.
void ExpectOneLineRefusal(const absl::StatusOr<ResolvedJob>& job, const std::string& fragment) {
  ExpectInvalidArgument(job, fragment);
  if (!job.ok()) {
    EXPECT_THAT(std::string(job.status().message()), Not(HasSubstr("\n")));
  }
}

struct FlagCase {
  std::string name;
  std::function<void(JobRequest&)> set;
  std::string message;
};

// Every ranged flag: 0, negatives and absurd values are refused naming the flag and its range, never
// taken for "unset" (the preset's value) or passed on to the workers.
TEST(JobTest, ResolveJob_OutOfRangeFlag_IsOneLineNamingFlagAndRange) {
  const std::vector<FlagCase> cases = {
      {"micro_batches=0", [](JobRequest& r) { r.flags.mutable_pipeline()->set_micro_batches(0); },
       "--micro_batches=0: out of range; pass --micro_batches=N with 1 <= N"},
      {"global_batch=0", [](JobRequest& r) { r.flags.mutable_pipeline()->set_global_batch(0); },
       "--global_batch=0: out of range"},
      {"seq=0", [](JobRequest& r) { r.flags.mutable_model_spec()->set_seq(0); }, "--seq=0: out of range"},
      {"seq=1000000", [](JobRequest& r) { r.flags.mutable_model_spec()->set_seq(1000000); },
       "--seq=1000000: out of range; pass --seq=N with 1 <= N <= 131072"},
      {"heads=0", [](JobRequest& r) { r.flags.mutable_model_spec()->set_heads(0); }, "--heads=0"},
      {"layers=0", [](JobRequest& r) { r.flags.mutable_model_spec()->set_layers(0); }, "--layers=0"},
      {"vocab=0", [](JobRequest& r) { r.flags.mutable_model_spec()->set_vocab(0); }, "--vocab=0"},
      {"hidden=-1", [](JobRequest& r) { r.flags.mutable_model_spec()->set_hidden(-1); }, "--hidden=-1"},
      {"lr=0", [](JobRequest& r) { r.flags.set_lr(0); }, "--lr=0: out of range; pass --lr=X with 0 < X <= 10"},
      {"lr=-1", [](JobRequest& r) { r.flags.set_lr(-1); }, "--lr=-1"},
      {"lr=nan", [](JobRequest& r) { r.flags.set_lr(std::nan("")); }, "--lr=nan"},
      {"lr=inf", [](JobRequest& r) { r.flags.set_lr(HUGE_VAL); }, "--lr=inf"},
      {"steps=0", [](JobRequest& r) { r.flags.set_steps(0); }, "--steps=0"},
      {"heartbeat_timeout_ms=0", [](JobRequest& r) { r.flags.mutable_timeouts()->set_heartbeat_timeout_ms(0); },
       "--heartbeat_timeout_ms=0"},
      {"register_timeout_ms=-5", [](JobRequest& r) { r.flags.mutable_timeouts()->set_register_ms(-5); },
       "--register_timeout_ms=-5"},
      {"grace_period_ms=0", [](JobRequest& r) { r.flags.mutable_timeouts()->set_grace_ms(0); }, "--grace_period_ms=0"},
      {"progress_timeout_ms=0", [](JobRequest& r) { r.flags.mutable_timeouts()->set_progress_timeout_ms(0); },
       "--progress_timeout_ms=0"},
      {"nccl_init_timeout_ms=0", [](JobRequest& r) { r.flags.mutable_timeouts()->set_nccl_init_ms(0); },
       "--nccl_init_timeout_ms=0"},
      {"pipeline_stages=0", [](JobRequest& r) { r.flags.mutable_pipeline()->set_stages(0); }, "--pipeline_stages=0"},
      {"workers=2147483647", [](JobRequest& r) { r.flags.set_workers(2147483647); },
       "--workers=2147483647: out of range"},
      {"tensor_elements=0", [](JobRequest& r) { r.flags.set_tensor_elements(0); }, "--tensor_elements=0"},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.name);
    JobRequest r;
    r.flags.set_device("cpu");
    r.flags.set_model("tiny");
    c.set(r);
    ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), c.message);
  }
}

// A job file's values pass the same validation as flags, and the message names the field and the file.
TEST(JobTest, ResolveJob_OutOfRangeJobFileValue_IsOneLineNamingField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"workers: -3", "workers: -3 is out of range; write workers: N with 1 <= N <= 1024 (or pass --workers=N)"},
      {"timeouts { heartbeat_interval_ms: -5 }", "timeouts.heartbeat_interval_ms: -5 is out of range"},
      {"pipeline { micro_batches: 0 }", "pipeline.micro_batches: 0 is out of range"},
      {"model_spec { seq: 0 }", "model_spec.seq: 0 is out of range"},
      {"lr: -1", "lr: -1 is out of range"},
      {"model_spec { norm_eps: 0 }", "model_spec.norm_eps: 0 is out of range"},
      {"device: \"tpu\"", "--device=tpu: unknown device; use cuda, cpu or auto"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    JobRequest r;
    r.job_file = WriteJobFile("ranged.textproto", absl::StrCat("model: \"tiny\" ", text));
    ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), message);
  }
}

TEST(JobTest, ResolveJob_NameOutsideRuns_IsRefused) {
  for (const std::string name : {"../../x", "a/b", ".hidden", ".."}) {
    SCOPED_TRACE(name);
    JobRequest r;
    r.job_file = WriteJobFile("name.textproto", absl::StrCat("model: \"allreduce\" name: \"", name, "\""));
    ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "names its directory under runs/");
  }
}

// /proc/self/mem opens but every read fails: that is a refusal, never the default job.
TEST(JobTest, ResolveJob_JobFileReadFails_IsRefusedNotDefault) {
  JobRequest r;
  r.job_file = "/proc/self/mem";
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "--job=/proc/self/mem: cannot read it");
}

TEST(JobTest, ResolveJob_MalformedJobFile_IsOneLineWithPosition) {
  JobRequest r;
  r.job_file = WriteJobFile("malformed_one_line.textproto", "steps: 3\nsteps: \"many\"\nno_such_field: 1\n");
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "line 2 column");
}

// Bool flags override the job file both ways: --timing=false over `timing: true`, and back.
TEST(JobTest, ResolveJob_BoolFlagsOverJobFile_FlagWins) {
  JobRequest r;
  r.job_file = WriteJobFile("bools.textproto",
                            "model: \"allreduce\" device: \"cpu\" timing: true cuda_graphs: false save_params: true "
                            "model_spec { fp32: true }");
  r.flags.set_timing(false);
  r.flags.set_cuda_graphs(true);
  r.flags.set_save_params(false);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.timing());
  EXPECT_TRUE(job->spec.cuda_graphs());
  EXPECT_FALSE(job->spec.save_params());
  EXPECT_TRUE(job->spec.model_spec().fp32());  // no flag typed: the file's value holds
}

TEST(JobTest, ResolveJob_NoTimingAnywhere_DefaultsToTimedWithGraphs) {
  JobRequest r;
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.has_timing() && job->spec.timing());
  EXPECT_TRUE(job->spec.has_cuda_graphs() && job->spec.cuda_graphs());
}

// The attention kernels' prebuild is on unless turned off, by the flag or the job file (the flag wins).
TEST(JobTest, ResolveJob_PrebuildAttention_DefaultOnFlagAndFileTurnItOff) {
  JobRequest r;
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.has_prebuild_attention() && job->spec.prebuild_attention());
  r.flags.set_prebuild_attention(false);
  job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.prebuild_attention());
  JobRequest f;
  f.job_file = WriteJobFile("prebuild.textproto", "model: \"allreduce\" device: \"cpu\" prebuild_attention: false");
  job = ResolveJob(f, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.prebuild_attention());
  f.flags.set_prebuild_attention(true);
  job = ResolveJob(f, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.prebuild_attention());
}

TEST(JobTest, ResolveJob_TelemetryAndHealth_DefaultsAndFlagsOverFile) {
  JobRequest r;
  r.flags.set_model("allreduce");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.has_telemetry() && job->spec.telemetry());
  EXPECT_EQ(job->spec.health(), "warn");
  r.job_file = WriteJobFile("telemetry.textproto", "model: \"allreduce\" telemetry: true health: \"strict\"");
  r.flags.set_telemetry(false);
  r.flags.set_health("off");
  job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.telemetry());
  EXPECT_EQ(job->spec.health(), "off");
}

TEST(JobTest, ResolveJob_UnknownHealth_IsOneLineListingModes) {
  JobRequest r;
  r.flags.set_model("allreduce");
  r.flags.set_health("on");
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "--health=on (or the job file's health:): unknown; use off, warn");
}

TEST(JobTest, ResolveJob_CpuWorkersBeyondMemory_IsRefusedWithCount) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("allreduce");
  r.flags.set_workers(1000);
  DeviceInventory inv = Inventory(0);
  inv.memory_bytes = int64_t{4} << 30;  // 16 workers of 256 MiB
  ExpectOneLineRefusal(ResolveJob(r, inv), "pass --workers=16 or fewer");
}

TEST(JobTest, ResolveJob_CpuWorkersBeyondCores_IsRefused) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("allreduce");
  r.flags.set_workers(17);
  DeviceInventory inv = Inventory(0);
  inv.cpu_cores = 2;
  ExpectOneLineRefusal(ResolveJob(r, inv), "more than 8 CPU workers per core on 2 cores; pass --workers=16 or fewer");
}

TEST(JobTest, ResolveJob_CpuWorkersOutnumberCores_WarnsAndRuns) {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("allreduce");
  r.flags.set_workers(4);
  DeviceInventory inv = Inventory(0);
  inv.cpu_cores = 2;
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, inv);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->notes, testing::Contains(HasSubstr("warning: 4 CPU workers on 2 cores")));
}

TEST(JobTest, ResolveJob_JobFileDeviceCpuString_MatchesFlagSpelling) {
  JobRequest r;
  r.job_file = WriteJobFile("device_cpu.textproto", "device: \"cpu\" workers: 3 model: \"allreduce\"");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device(), "cpu");
  EXPECT_EQ(job->spec.workers(), 3);
}

TEST(JobTest, ResolveJob_RelativeJobAndDataUnderBazelRun_ResolvedAgainstUserDirectory) {
  const std::string dir = ::testing::TempDir();
  WriteJobFile("relative.textproto", "model: \"tiny\" device: \"cpu\"");
  std::string tokens(2 * 4096, '\0');  // 4096 zero tokens
  std::ofstream(absl::StrCat(dir, "/relative.bin"), std::ios::binary) << tokens;
  setenv("BUILD_WORKING_DIRECTORY", dir.c_str(), 1);
  JobRequest r;
  r.job_file = "relative.textproto";
  r.flags.set_data("relative.bin");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  unsetenv("BUILD_WORKING_DIRECTORY");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.data(), absl::StrCat(dir, "/relative.bin"));
}

TEST(JobTest, ResolveJob_TokenAboveVocab_IsRefusedBeforeStartNamingPosition) {
  std::string tokens(2 * 5000, '\0');
  tokens[2 * 4321] = '\xff';  // token 255 at position 4321, little-endian
  const std::string path = absl::StrCat(::testing::TempDir(), "/bad_token.bin");
  std::ofstream(path, std::ios::binary) << tokens;
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("tiny");
  r.flags.mutable_model_spec()->set_vocab(200);
  r.flags.set_data(path);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "token 255 at position 4321");
}

// One default per setting: a preset's learning rate is the same whichever way it was chosen.
TEST(JobTest, ResolveJob_PresetLr_SameForModelFlagJobFileAndBareRun) {
  absl::StatusOr<ResolvedJob> bare = ResolveJob(JobRequest(), Inventory(0));
  ASSERT_TRUE(bare.ok()) << bare.status();
  ASSERT_EQ(bare->spec.model(), "tiny");
  JobRequest tiny;
  tiny.flags.set_model("tiny");
  absl::StatusOr<ResolvedJob> typed = ResolveJob(tiny, Inventory(0));
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_DOUBLE_EQ(typed->spec.lr(), bare->spec.lr());
  EXPECT_DOUBLE_EQ(typed->spec.lr(), 3e-3);
  JobRequest file;
  file.job_file = WriteJobFile("preset_lr.textproto", "model: \"llama-tiny\" device: \"cpu\"");
  absl::StatusOr<ResolvedJob> from_file = ResolveJob(file, Inventory(0));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_DOUBLE_EQ(from_file->spec.lr(), 3e-3);
  // A job file without a model: the bare run's choice, still at its preset's rate.
  JobRequest no_model;
  no_model.job_file = WriteJobFile("preset_lr_bare.textproto", "device: \"cpu\" steps: 3");
  absl::StatusOr<ResolvedJob> chosen = ResolveJob(no_model, Inventory(0));
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->spec.model(), "tiny");
  EXPECT_DOUBLE_EQ(chosen->spec.lr(), 3e-3);
  // The large presets keep the reference runs' rate, by preset or by family name; the GPU bare run too.
  for (const char* model : {"gpt-1.3b", "gpt", "tinyllama-1.1b", "llama"}) {
    JobRequest r;
    r.flags.set_model(model);
    absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(2));
    ASSERT_TRUE(job.ok()) << model << ": " << job.status();
    EXPECT_DOUBLE_EQ(job->spec.lr(), 1e-4) << model;
  }
  absl::StatusOr<ResolvedJob> gpu_bare = ResolveJob(JobRequest(), Inventory(2));
  ASSERT_TRUE(gpu_bare.ok()) << gpu_bare.status();
  EXPECT_DOUBLE_EQ(gpu_bare->spec.lr(), 1e-4);
  // --lr wins over the preset's.
  tiny.flags.set_lr(5e-4);
  absl::StatusOr<ResolvedJob> explicit_lr = ResolveJob(tiny, Inventory(0));
  ASSERT_TRUE(explicit_lr.ok()) << explicit_lr.status();
  EXPECT_DOUBLE_EQ(explicit_lr->spec.lr(), 5e-4);
}

TEST(JobTest, PresetLr_EveryBuiltinPresetListed) {
  for (const std::string& model : KnownModels()) {
    if (model == "allreduce") continue;
    const double lr = PresetLr(model);
    EXPECT_TRUE(lr == 3e-3 || lr == 1e-4) << model;
  }
  EXPECT_DOUBLE_EQ(PresetLr("tiny"), 3e-3);
  EXPECT_DOUBLE_EQ(PresetLr("llama-tiny"), 3e-3);
  EXPECT_DOUBLE_EQ(PresetLr("gpt-1.3b"), 1e-4);
  EXPECT_DOUBLE_EQ(PresetLr("tinyllama-1.1b"), 1e-4);
  EXPECT_DOUBLE_EQ(PresetLr("my-family"), 1e-4);
}

// A run directory as a training run leaves it: job.textproto (the job it resolved) and one complete
// checkpoint at `step` (a real shard's bytes, its SHA-256 in the MANIFEST). Returns the run directory.
std::string FakeRun(const std::string& name, const JobRequest& request, int64_t step, bool with_job = true) {
  const std::string run_dir = absl::StrCat(::testing::TempDir(), "/", name);
  absl::StatusOr<ResolvedJob> job = ResolveJob(request, Inventory(0));
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return run_dir;
  std::filesystem::remove_all(run_dir);
  const std::string dir = CheckpointDir(run_dir, step);
  std::filesystem::create_directories(dir);
  if (with_job) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(job->spec, &text);
    std::ofstream(run_dir + "/job.textproto") << text;
  }
  CheckpointManifest m;
  m.set_format(1);
  m.set_step(step);
  m.set_model(job->spec.model());
  *m.mutable_model_spec() = job->spec.model_spec();
  m.set_seed(job->spec.seed());
  m.set_data(job->spec.data());
  absl::StatusOr<DurableFile> shard = DurableFile::Create(dir + "/" + ShardName(0));
  EXPECT_TRUE(shard.ok()) << shard.status();
  EXPECT_TRUE(shard->Append("parameters", 10).ok());
  absl::StatusOr<DurableFile::Committed> done = shard->Commit();
  EXPECT_TRUE(done.ok()) << done.status();
  CheckpointShard* s = m.add_shards();
  s->set_file(ShardName(0));
  s->set_bytes(done->bytes);
  s->set_sha256(done->sha256);
  EXPECT_TRUE(WriteManifest(dir, m).ok());
  return run_dir;
}

JobRequest TinyAtLowLr() {
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("tiny");
  r.flags.set_lr(1e-4);
  r.flags.set_steps(50);
  r.flags.set_seed(7);
  r.flags.mutable_pipeline()->set_global_batch(16);
  r.flags.set_warmup_steps(5);
  r.flags.set_checkpoint_every(5);
  r.flags.mutable_model_spec()->set_fp32(true);
  return r;
}

// The command a SIGTERM checkpoint prints (--resume=RUN_DIR alone) continues that job: its model,
// learning rate, schedule, batch, seed and step target, not the bare run's defaults.
TEST(ResumeTest, ResumeAlone_ContinuesTheCheckpointedJob) {
  const std::string run = FakeRun("resume_alone", TinyAtLowLr(), 20);
  JobRequest r;
  r.flags.set_resume(run);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  const JobSpec& spec = job->spec;
  EXPECT_EQ(spec.model(), "tiny");
  EXPECT_DOUBLE_EQ(spec.lr(), 1e-4);
  EXPECT_EQ(spec.steps(), 50);
  EXPECT_EQ(spec.seed(), 7);
  EXPECT_EQ(spec.warmup_steps(), 5);
  EXPECT_EQ(spec.pipeline().global_batch(), 16);
  EXPECT_EQ(spec.checkpoint_every(), 5);
  EXPECT_TRUE(spec.model_spec().fp32());
  EXPECT_EQ(spec.resume(), CheckpointDir(run, 20));
  for (const std::string& note : job->notes) {
    EXPECT_THAT(note, Not(HasSubstr("no --model given"))) << "the bare run's default was taken";
    EXPECT_THAT(note, Not(HasSubstr("trajectory")));
  }
  // The checkpoint's own directory names the same job.
  r.flags.set_resume(CheckpointDir(run, 20));
  job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_DOUBLE_EQ(job->spec.lr(), 1e-4);
  EXPECT_EQ(job->spec.steps(), 50);
}

// The export is written once, at the end: a resumed run carries the job's --export_dir while it does not
// exist yet (the run was stopped before it), and says so and leaves it where the run had written it.
TEST(ResumeTest, ExportDir_CarriedUntilWrittenThenLeftWithANote) {
  const std::string exported = absl::StrCat(::testing::TempDir(), "/resume_export_out");
  std::filesystem::remove_all(exported);
  JobRequest original = TinyAtLowLr();
  original.flags.set_export_dir(exported);
  const std::string run = FakeRun("resume_export", original, 20);
  JobRequest r;
  r.flags.set_resume(run);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.export_dir(), exported);

  std::filesystem::create_directories(exported);  // the run got to its end and exported
  job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.export_dir(), "");
  EXPECT_THAT(absl::StrJoin(job->notes, "\n"), HasSubstr("exists already, so this run does not export"));
}

// The job server's hook sees the job as carried from the run (its data), before anything reads it, and
// its refusal is the job's.
TEST(ResumeTest, CheckResumed_SeesTheCarriedJobAndItsRefusalStands) {
  JobRequest original = TinyAtLowLr();
  const std::string run = FakeRun("resume_hook", original, 20);
  JobRequest r;
  r.flags.set_resume(run);
  std::string seen_model;
  r.check_resumed = [&seen_model](const JobSpec& spec) {
    seen_model = spec.model();
    return absl::InvalidArgumentError("data: outside the directories this server reads");
  };
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("outside the directories"));
  EXPECT_EQ(seen_model, "tiny");
}

// A run directory's job.textproto that is a link is refused: the job read is the one the run wrote.
TEST(ResumeTest, JobFileThatIsALink_Refused) {
  const std::string run = FakeRun("resume_link", TinyAtLowLr(), 20);
  const std::string elsewhere = absl::StrCat(::testing::TempDir(), "/resume_link_elsewhere.textproto");
  std::filesystem::rename(run + "/job.textproto", elsewhere);
  std::filesystem::create_symlink(elsewhere, run + "/job.textproto");
  JobRequest r;
  r.flags.set_resume(run);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "is a symbolic link");
}

TEST(ResumeTest, TrajectoryChanges_WinAndAreSaidInOneLine) {
  const std::string run = FakeRun("resume_changed", TinyAtLowLr(), 20);
  JobRequest r;
  r.flags.set_resume(run);
  r.flags.set_lr(3e-3);
  r.flags.mutable_pipeline()->set_global_batch(32);
  r.flags.set_workers(4);  // the layout is this run's: not a change of the trajectory
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_DOUBLE_EQ(job->spec.lr(), 3e-3);
  EXPECT_EQ(job->spec.pipeline().global_batch(), 32);
  EXPECT_EQ(job->spec.workers(), 4);
  int lines = 0;
  for (const std::string& note : job->notes) {
    if (note.find("trajectory") == std::string::npos) continue;
    ++lines;
    EXPECT_THAT(note, AllOf(HasSubstr("--lr=0.003 (was 0.0001)"), HasSubstr("--global_batch=32 (was 16)"),
                            Not(HasSubstr("workers")), Not(HasSubstr("\n"))));
  }
  EXPECT_EQ(lines, 1);
  // More steps with a cosine decay that ends at --steps move its end: said too.
  JobRequest more;
  more.flags.set_resume(run);
  more.flags.set_steps(80);
  job = ResolveJob(more, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.steps(), 80);
  EXPECT_THAT(job->notes, Contains(HasSubstr("--steps=80 (was 50")));
}

TEST(ResumeTest, ModelOrSizeChange_RefusedInOneLine) {
  const std::string run = FakeRun("resume_sizes", TinyAtLowLr(), 20);
  JobRequest r;
  r.flags.set_resume(run);
  r.flags.mutable_model_spec()->set_layers(3);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "keeps its model's sizes: drop --layers");
  r.flags.mutable_model_spec()->clear_layers();
  r.flags.mutable_model_spec()->set_hidden(96);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "drop --hidden");
  r.flags.mutable_model_spec()->clear_hidden();
  r.flags.set_model("llama-tiny");
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "pass --model=tiny");
  // The same model and sizes, typed again, are no change.
  r.flags.set_model("tiny");
  EXPECT_TRUE(ResolveJob(r, Inventory(0)).ok());
}

TEST(ResumeTest, CheckpointWithoutJobFile_TakesTheManifestsModelSeedAndData) {
  const std::string run = FakeRun("resume_no_job", TinyAtLowLr(), 20, /*with_job=*/false);
  JobRequest r;
  r.flags.set_resume(run);
  r.flags.set_steps(30);
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.model(), "tiny");
  EXPECT_EQ(job->spec.seed(), 7);
  EXPECT_TRUE(job->spec.model_spec().fp32());
  EXPECT_THAT(job->notes, Contains(HasSubstr("has no job.textproto")));
}

// Every input read at validation is opened as a regular file only: a FIFO in its place is refused at
// once, in one line naming the flag, instead of hanging the launcher.
TEST(JobTest, ResolveJob_FifoInputs_RefusedAtOnceNamingTheFlag) {
  const std::string fifo = MakeFifo(::testing::TempDir() + "/input.fifo");
  const auto resolve = [&](JobRequest r) {
    return WithinTenSeconds(fifo, [&] { return ResolveJob(r, Inventory(0)); });
  };
  JobRequest job_file;
  job_file.job_file = fifo;
  ExpectOneLineRefusal(resolve(job_file), "--job=" + fifo + ": not a regular file but a FIFO");
  JobRequest schedule;
  schedule.flags.set_model("tiny");
  schedule.schedule_file = fifo;
  ExpectOneLineRefusal(resolve(schedule), "--schedule_file=" + fifo + ": not a regular file but a FIFO");
  JobRequest data;
  data.flags.set_model("tiny");
  data.flags.set_data(fifo);
  ExpectOneLineRefusal(resolve(data), "--data=" + fifo + ": not a regular file but a FIFO");
  JobRequest profiles;
  profiles.flags.set_model("tiny");
  profiles.flags.set_device("cpu");
  profiles.flags.set_layout("auto");
  profiles.flags.set_layout_profiles(fifo);
  ExpectOneLineRefusal(resolve(profiles), "--layout_profiles: " + fifo + ": not a regular file but a FIFO");
  // A checkpoint whose MANIFEST is a FIFO.
  const std::string run = ::testing::TempDir() + "/fifo_run";
  std::filesystem::remove_all(run);
  std::filesystem::create_directories(CheckpointDir(run, 3));
  const std::string manifest = MakeFifo(CheckpointDir(run, 3) + "/MANIFEST");
  JobRequest resume;
  resume.flags.set_resume(run);
  absl::StatusOr<ResolvedJob> resumed = WithinTenSeconds(manifest, [&] { return ResolveJob(resume, Inventory(0)); });
  ExpectOneLineRefusal(resumed, manifest + ": not a regular file but a FIFO");
  EXPECT_THAT(std::string(resumed.status().message()), HasSubstr("--resume=" + run));
  // The client's submission reads the schedule file too.
  absl::StatusOr<JobSpec> merged = WithinTenSeconds(fifo, [&] { return MergeJobRequest(schedule); });
  ASSERT_FALSE(merged.ok());
  EXPECT_THAT(std::string(merged.status().message()), HasSubstr("--schedule_file=" + fifo + ": not a regular file"));
}

// --micro_batches within its stated range starts within seconds: the schedule of the largest accepted
// counts is lowered, checked and simulated quickly (a quadratic pass would take over 25 s at 4096 and
// not end at 65536); beyond the bounds, one line saying the limit.
TEST(JobTest, MicroBatches_LargestAcceptedCheckedWithinSeconds_BeyondRefusedNamingTheLimit) {
  const std::vector<std::pair<int, std::string>> layouts = {
      {4, "1f1b"}, {4, "gpipe"}, {8, "1f1b"}, {2, "interleaved-1f1b"}, {2, "zb-v"}, {4, "zb-h1"}};
  for (const auto& [workers, schedule] : layouts) {
    JobRequest r;
    r.flags.set_device("cpu");
    r.flags.set_workers(workers);
    r.flags.set_model("tiny");
    r.flags.mutable_pipeline()->set_schedule(schedule);
    const int m =
        static_cast<int>(std::min<int64_t>(kMaxMicroBatches, kMaxPipelinePairs / (workers * DefaultChunks(schedule))));
    r.flags.mutable_pipeline()->set_micro_batches(m);
    r.flags.mutable_pipeline()->set_global_batch(m);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
    ASSERT_TRUE(job.ok()) << schedule << " x " << m << ": " << job.status();
    EXPECT_TRUE(CheckModelJob(job->spec, {}, int64_t{64} << 30).ok()) << schedule;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15))
        << workers << " x " << schedule << " x " << m;
  }
  JobRequest r;
  r.flags.set_device("cpu");
  r.flags.set_model("tiny");
  r.flags.mutable_pipeline()->set_micro_batches(kMaxMicroBatches + 1);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)),
                       "--micro_batches=1025: out of range; pass --micro_batches=N with 1 <= N <= 1024");
  r.flags.set_workers(8);
  r.flags.mutable_pipeline()->set_micro_batches(1024);
  r.flags.mutable_pipeline()->set_global_batch(1024);
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)),
                       "more than the 4096 a schedule is checked for before the start; "
                       "pass --micro_batches=512 or fewer");
  r.flags.set_workers(4);
  r.flags.mutable_pipeline()->set_schedule("interleaved-1f1b");
  ExpectOneLineRefusal(ResolveJob(r, Inventory(0)), "on 4 stages x 2 chunks is 8192");
}

TEST(JobTest, ResolveJob_RunDirInJobFile_IsKeptResolved) {
  JobRequest r;
  r.job_file = WriteJobFile("run_dir.textproto", "model: \"allreduce\" run_dir: \"/tmp/somewhere\"");
  absl::StatusOr<ResolvedJob> job = ResolveJob(r, Inventory(0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.run_dir(), "/tmp/somewhere");
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(MergeJobRequestTest, JobFileAndFlags_FlagsWinNothingResolved) {
  JobRequest request;
  request.job_file = WriteTemp("merge.textproto", "name: \"n\" steps: 5 data: \"rel/tokens.bin\" timing: true");
  request.flags.set_steps(7);
  request.flags.set_timing(false);
  request.gpus = 3;
  request.schedule_file = WriteTemp("merge.schedule", "0F0 0B0\n");
  absl::StatusOr<JobSpec> spec = MergeJobRequest(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "n");
  EXPECT_EQ(spec->steps(), 7);
  EXPECT_FALSE(spec->timing());
  EXPECT_EQ(spec->data(), "rel/tokens.bin");  // the server's path, as written
  EXPECT_EQ(spec->pipeline().schedule_text(), "0F0 0B0\n");
  EXPECT_TRUE(spec->model().empty());  // no default chosen here
}

TEST(MergeJobRequestTest, MissingScheduleFile_IsInvalidArgumentNamingIt) {
  JobRequest request;
  request.schedule_file = "/nonexistent/s.txt";
  absl::StatusOr<JobSpec> spec = MergeJobRequest(request);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("--schedule_file=/nonexistent/s.txt"), std::string::npos);
}

}  // namespace
}  // namespace stagehand
