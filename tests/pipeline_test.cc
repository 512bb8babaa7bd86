// Pipeline correctness on CPU workers over the CPU transport, through the real launcher: for both model
// families (GPT's tiny, llama-tiny), 2, 3 and 4 stages and GPipe and 1F1B, and 2 and 4 stages of
// interleaved 1F1B, ZB-H1 and ZB-V, every step's loss and the final parameters match a single-process
// run of the same model, data and seed (fp32) within 1e-5 relative; the models learn; schedules given
// as data run as given (a zero-bubble split too), a list that deadlocks is refused before anything
// starts; jobs that cannot work are refused before anything starts.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

using ::stagehand::testing::RunResult;

RunResult Launch(const std::vector<std::string>& flags) { return ::stagehand::testing::Launch(flags, "pipeline"); }

std::vector<std::string> TinyJob(int stages, const std::string& schedule, int steps = 3,
                                 const std::string& model = "tiny") {
  return {"--device=cpu",
          absl::StrCat("--workers=", stages),
          "--model=" + model,
          "--fp32",
          "--schedule=" + schedule,
          "--micro_batches=4",
          "--global_batch=16",
          absl::StrCat("--steps=", steps),
          "--lr=0.003",
          "--partition=uniform",
          "--save_params",
          "--seed=7"};
}

using ::stagehand::testing::Losses;

std::vector<torch::Tensor> Params(const std::string& run_dir, int ranks) {
  std::vector<torch::Tensor> all;
  for (int r = 0; r < ranks; ++r) {
    std::vector<torch::Tensor> part;
    torch::load(part, absl::StrCat(run_dir, "/params_rank", r, ".pt"));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// The model's parameters in stage order: params_stage<v>.pt for v = 0, 1, ... (each virtual stage's,
// wherever it was placed).
std::vector<torch::Tensor> StageParams(const std::string& run_dir) {
  std::vector<torch::Tensor> all;
  for (int v = 0; access(absl::StrCat(run_dir, "/params_stage", v, ".pt").c_str(), R_OK) == 0; ++v) {
    std::vector<torch::Tensor> part;
    torch::load(part, absl::StrCat(run_dir, "/params_stage", v, ".pt"));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// One run of `schedule` on one process per model, shared by the cases that compare with it.
const RunResult& Reference(const std::string& model, const std::string& schedule) {
  static std::map<std::string, RunResult> references;
  const std::string key = model + "/" + schedule;
  if (!references.count(key)) references[key] = Launch(TinyJob(1, schedule, 3, model));
  return references[key];
}

void ExpectSameLossesAndParameters(const RunResult& reference, const RunResult& run,
                                   const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  std::map<int, double> want = Losses(reference.run_dir), got = Losses(run.run_dir);
  ASSERT_EQ(want.size(), 3u) << ReadFile(reference.run_dir + "/steps.csv");
  ASSERT_EQ(got.size(), want.size()) << ReadFile(run.run_dir + "/steps.csv");
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "parameter " << i;
    double err = (a[i] - b[i]).abs().max().item<double>() / std::max(1e-12, a[i].abs().max().item<double>());
    EXPECT_LT(err, 1e-5) << "parameter " << i;
  }
}

class PipelineMatchesSingleProcess : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(PipelineMatchesSingleProcess, LossesAndFinalParametersWithin1e5) {
  const auto [model, stages, schedule] = GetParam();
  // One thread per worker, so that every kernel reduces in the same order in every process; the
  // reference runs the same schedule, so gradients accumulate over micro-batches in the same order.
  // (AdamW turns tiny differences of near-zero gradients into visible parameter differences.)
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Reference(model, schedule);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  RunResult run = Launch(TinyJob(stages, schedule, 3, model));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  std::map<int, double> want = Losses(reference.run_dir), got = Losses(run.run_dir);
  ASSERT_EQ(want.size(), 3u) << ReadFile(reference.run_dir + "/steps.csv");
  ASSERT_EQ(got.size(), want.size()) << ReadFile(run.run_dir + "/steps.csv");
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
  std::vector<torch::Tensor> a = Params(reference.run_dir, 1), b = Params(run.run_dir, stages);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "parameter " << i;
    double err = (a[i] - b[i]).abs().max().item<double>() / std::max(1e-12, a[i].abs().max().item<double>());
    EXPECT_LT(err, 1e-5) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ModelsStagesAndSchedules, PipelineMatchesSingleProcess,
                         ::testing::Combine(::testing::Values("tiny", "llama-tiny"), ::testing::Values(2, 3, 4),
                                            ::testing::Values("gpipe", "1f1b")),
                         [](const auto& info) {
                           std::string model = std::get<0>(info.param);
                           for (char& c : model) c = c == '-' ? '_' : c;
                           return absl::StrCat(model, "_", std::get<1>(info.param), "Stages_", std::get<2>(info.param));
                         });

// Interleaved 1F1B (two chunks per worker), ZB-H1 and ZB-V (the split backward; ZB-V two chunks in a V)
// against one process running plain 1F1B: each of these schedules accumulates every stage's gradients
// over the micro-batches in increasing order, as 1F1B does, so the sums match to rounding.
class NewSchedulesMatchSingleProcess : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(NewSchedulesMatchSingleProcess, LossesAndFinalParametersWithin1e5) {
  const auto [model, stages, schedule] = GetParam();
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Reference(model, "1f1b");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  std::vector<std::string> flags = TinyJob(stages, schedule, 3, model);
  if (schedule == "interleaved-1f1b") flags.push_back("--stage_chunks=2");
  RunResult run = Launch(flags);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<torch::Tensor> b = StageParams(run.run_dir);
  EXPECT_EQ(b.size(), Params(run.run_dir, stages).size()) << "a stage's file is missing";
  ExpectSameLossesAndParameters(reference, run, StageParams(reference.run_dir), b);
}

INSTANTIATE_TEST_SUITE_P(ModelsStagesAndSchedules, NewSchedulesMatchSingleProcess,
                         ::testing::Combine(::testing::Values("tiny", "llama-tiny"), ::testing::Values(2, 4),
                                            ::testing::Values("interleaved-1f1b", "zb-h1", "zb-v")),
                         [](const auto& info) {
                           std::string model = std::get<0>(info.param);
                           std::string schedule = std::get<2>(info.param);
                           for (char& c : model) c = c == '-' ? '_' : c;
                           for (char& c : schedule) c = c == '-' ? '_' : c;
                           return absl::StrCat(model, "_", std::get<1>(info.param), "Stages_", schedule);
                         });

TEST(Pipeline, NewSchedulesThatCannotWork_RefusedBeforeAnythingStarts) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--device=cpu", "--workers=2", "--model=tiny", "--schedule=zb-v", "--stage_chunks=3"},
       "zb-v holds exactly 2 chunks per rank"},
      {{"--device=cpu", "--workers=4", "--model=tiny", "--schedule=interleaved-1f1b", "--micro_batches=6",
        "--global_batch=12"},
       "Megatron's rule"},
      {{"--device=cpu", "--workers=4", "--model=tiny", "--schedule=interleaved-1f1b", "--stage_chunks=3"},
       "needs 12 virtual stages but the model has only 10 pipeline layers"},
      {{"--device=cpu", "--workers=2", "--model=tiny", "--schedule=1f1b", "--stage_chunks=2"},
       "1f1b holds one chunk per rank"},
  };
  for (const auto& [flags, message] : cases) {
    RunResult r = Launch(flags);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_NE(access(r.run_dir.c_str(), F_OK), 0) << "a run directory was created: " << r.output;
  }
}

std::string WriteScheduleFile(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  std::ofstream(path) << text;
  return path;
}

// A list given as data runs exactly as given: a hand-written 2-rank GPipe over 2 micro-batches equals the
// generated one (same losses).
TEST(ScheduleFile, HandWrittenGPipe_RunsAndMatchesTheGeneratedOne) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string path =
      WriteScheduleFile("gpipe2.txt",
                        "# GPipe, 2 ranks, 2 micro-batches, in torch.distributed.pipelining's notation\n"
                        "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0 OPT\n"
                        "rank 1: 1RECV_F0 1F0 1RECV_F1 1F1 1B1 1SEND_B1 1B0 1SEND_B0 OPT\n");
  std::vector<std::string> flags = TinyJob(2, "gpipe");
  flags.push_back("--micro_batches=2");
  RunResult generated = Launch(flags);
  flags.push_back("--schedule_file=" + path);
  RunResult given = Launch(flags);
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  ASSERT_EQ(given.exit_code, 0) << given.output;
  std::map<int, double> want = Losses(generated.run_dir), got = Losses(given.run_dir);
  ASSERT_EQ(want.size(), 3u);
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, 1e-6 * std::abs(loss)) << "step " << step;

  // The compute-only form (no sends or receives) gets them from the lowering pass, and its micro-batch
  // count from the file.
  flags.pop_back();
  flags.erase(std::find(flags.begin(), flags.end(), "--micro_batches=2"));
  flags.erase(std::find(flags.begin(), flags.end(), "--micro_batches=4"));
  flags.push_back("--schedule_file=" +
                  WriteScheduleFile("gpipe2_compute.txt", "0F0 0F1 0B1 0B0 OPT\n1F0 1F1 1B1 1B0 OPT\n"));
  RunResult compute_only = Launch(flags);
  ASSERT_EQ(compute_only.exit_code, 0) << compute_only.output;
  got = Losses(compute_only.run_dir);
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, 1e-6 * std::abs(loss)) << "step " << step;

  flags.push_back("--micro_batches=4");
  RunResult mismatch = Launch(flags);
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.output;
  EXPECT_NE(mismatch.output.find("runs 2 micro-batches but --micro_batches=4"), std::string::npos) << mismatch.output;
}

TEST(ScheduleFile, DeadlockingList_RefusedBeforeAnythingStarts) {
  // Rank 1 receives micro-batch 1 first while rank 0 sends micro-batch 0 first: with blocking
  // point-to-point both wait forever.
  const std::string path = WriteScheduleFile("deadlock.txt",
                                             "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0 OPT\n"
                                             "1RECV_F1 1F1 1RECV_F0 1F0 1B1 1SEND_B1 1B0 1SEND_B0 OPT\n");
  std::vector<std::string> flags = TinyJob(2, "gpipe");
  flags.push_back("--micro_batches=2");
  flags.push_back("--schedule_file=" + path);
  RunResult r = Launch(flags);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 waits at 0SEND_F0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 waits at 1RECV_F1"), std::string::npos) << r.output;
  EXPECT_NE(access(r.run_dir.c_str(), F_OK), 0) << "a run directory was created: " << r.output;
}

TEST(ScheduleFile, HandWrittenZeroBubbleSplit_MatchesTheWholeBackward) {
  // Input and weight gradients as separate actions (I, W) give the losses of the whole backward (B).
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string path = WriteScheduleFile("zb.txt",
                                             "0F0 0SEND_F0 0RECV_B0 0I0 0W0 OPT\n"
                                             "1RECV_F0 1F0 1I0 1SEND_B0 1W0 OPT\n");
  std::vector<std::string> flags = TinyJob(2, "gpipe");
  flags.push_back("--micro_batches=1");
  RunResult whole = Launch(flags);
  flags.push_back("--schedule_file=" + path);
  RunResult split = Launch(flags);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_EQ(split.exit_code, 0) << split.output;
  std::map<int, double> want = Losses(whole.run_dir), got = Losses(split.run_dir);
  ASSERT_EQ(want.size(), 3u);
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, 1e-6 * std::abs(loss)) << "step " << step;
}

class LearnsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LearnsTest, TwoStages_LossFallsWellBelowUniformGuessing) {
  std::vector<std::string> job = TinyJob(2, "1f1b", 60, GetParam());
  job.push_back("--partition=auto");
  RunResult run = Launch(job);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::map<int, double> losses = Losses(run.run_dir);
  ASSERT_EQ(losses.size(), 60u);
  const double uniform = std::log(256.0);
  EXPECT_NEAR(losses[0], uniform, 0.5);
  EXPECT_LT(losses[59], 0.6 * uniform) << run.output;
}

INSTANTIATE_TEST_SUITE_P(Models, LearnsTest, ::testing::Values("tiny", "llama-tiny"), [](const auto& info) {
  return info.param == "tiny" ? std::string("tiny") : std::string("llama_tiny");
});

// A stage killed in the middle of training: the launcher names it and nothing of the run remains.
TEST(Pipeline, KillMiddleStage_LauncherNamesItAndStopsTheOthers) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/pipeline_kill_", getpid());
  const std::string out_path = dir + ".out";
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    if (freopen(out_path.c_str(), "w", stdout) == nullptr) _exit(126);
    dup2(fileno(stdout), 2);
    const std::string bin = Runfile("launcher/launcher"), run_dir = "--run_dir=" + dir;
    execl(bin.c_str(), bin.c_str(), "--device=cpu", "--workers=3", "--model=tiny", "--fp32", "--steps=100000",
          "--micro_batches=4", "--global_batch=16", run_dir.c_str(), nullptr);
    _exit(127);
  }
  // Wait for training to be under way (steps reported), then kill the worker holding stage 1.
  std::string out;
  for (int i = 0; i < 600 && out.find("step 3/") == std::string::npos; ++i) {
    usleep(50 * 1000);
    out = ReadFile(out_path);
  }
  ASSERT_NE(out.find("step 3/"), std::string::npos) << out;
  const std::string job = out.substr(out.find("job ") + 4, 8);
  FILE* q = popen(absl::StrCat("pgrep -f -- '[-]-job_id=", job, " --worker_index=1 '").c_str(), "r");
  int victim = 0;
  ASSERT_EQ(fscanf(q, "%d", &victim), 1);
  pclose(q);
  kill(victim, SIGKILL);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 100 && (done = waitpid(launcher, &status, WNOHANG)) == 0; ++i) usleep(20 * 1000);  // 2 s
  if (done != launcher) kill(launcher, SIGKILL);
  ASSERT_EQ(done, launcher) << "the launcher did not exit within 2 s";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  out = ReadFile(out_path);
  EXPECT_NE(out.find("FAILED (exit 1): rank 1 "), std::string::npos) << out;
  EXPECT_NE(out.find("signal 9"), std::string::npos) << out;
  usleep(200 * 1000);
  EXPECT_NE(std::system(absl::StrCat("pgrep -f -- '[-]-job_id=", job, "' > /dev/null").c_str()), 0)
      << "processes of the run remain";
}

TEST(Pipeline, ImpossibleJobs_RefusedBeforeAnythingStarts) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--device=cpu", "--workers=4", "--model=tiny", "--schedule=1f1b", "--micro_batches=2", "--global_batch=8"},
       "1F1B needs at least as many micro-batches as stages"},
      {{"--device=cpu", "--workers=11", "--model=tiny"}, "11 stages but the model has only 10 pipeline layers"},
      {{"--device=cpu", "--workers=2", "--model=tiny", "--micro_batches=3", "--global_batch=16"},
       "does not split into 3 equal micro-batches"},
      {{"--device=cpu", "--workers=2", "--model=tiny", "--partition=3,4"},
       "--partition=3,4: sizes sum to 7 but the model has 10 layers; make them sum to 10"},
      {{"--device=cpu", "--workers=2", "--model=tiny", "--hidden=30"}, "not divisible by --heads"},
      {{"--device=cpu", "--workers=2", "--model=tiny", "--attention=fa3"},
       "--attention=fa3: unknown; use cudnn, flash or torch"},
      {{"--device=cpu", "--workers=2", "--model=llama-tiny", "--kv_heads=3"}, "--kv_heads=3 must divide --heads=4"},
      {{"--device=cpu", "--workers=2", "--model=gpt-7b"}, "--model=gpt-7b: unknown model; known: allreduce, tiny"},
  };
  for (const auto& [flags, message] : cases) {
    RunResult r = Launch(flags);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_NE(access(r.run_dir.c_str(), F_OK), 0) << "a run directory was created: " << r.output;
  }
}

}  // namespace
