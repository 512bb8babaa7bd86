// Tests of the job plan: the schedule the coordinator ships (generated, or given as text and lowered),
// refused when it cannot run; the partition from profiles; the grid of a failed run.
#include "launcher/plan/job_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/str_join.h"
#include "models/registry.h"
#include "schedule/schedule_proto.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

JobSpec TinyJob(int stages, const std::string& schedule, int microbatches) {
  JobSpec job;
  job.set_model("tiny");
  job.set_device("cpu");
  job.set_workers(stages);
  *job.mutable_model_spec() = *FindBuiltinModel("tiny")->Resolve("tiny", {});
  PipelineSpec& p = *job.mutable_pipeline();
  p.set_stages(stages);
  p.set_schedule(schedule);
  p.set_micro_batches(microbatches);
  p.set_global_batch(4 * microbatches);
  p.set_partition("auto");
  return job;
}

std::vector<WorkerState> Profiled(const JobSpec& job, int workers) {
  std::vector<WorkerState> out(workers);
  const LayerProfile estimate = FindBuiltinModel("tiny")->Estimate(job.model_spec(), 4);
  for (WorkerState& w : out) w.profile = estimate;
  return out;
}

TEST(JobSchedule, Generated1F1B_IsLoweredWithSendsAndReceives) {
  absl::StatusOr<Schedule> s = JobSchedule(TinyJob(2, "1f1b", 4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "1f1b");
  EXPECT_EQ(s->num_ranks, 2);
  EXPECT_THAT(ToString(s->ranks[0]), HasSubstr("0SEND_F"));
}

TEST(JobSchedule, ComputeOnlyText_GetsTheLoweringPass) {
  JobSpec job = TinyJob(2, "gpipe", 2);
  job.mutable_pipeline()->set_schedule_text("0F0 0F1 0B1 0B0 OPT\n1F0 1F1 1B1 1B0 OPT\n");
  absl::StatusOr<Schedule> s = JobSchedule(job);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<Schedule> generated = MakeSchedule("gpipe", 2, 2);
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(ToString(s->ranks[1]), ToString(generated->ranks[1]));
}

TEST(JobSchedule, DeadlockingText_IsInvalidArgumentNamingEachRanksStuckAction) {
  JobSpec job = TinyJob(2, "gpipe", 2);
  job.mutable_pipeline()->set_schedule_text(
      "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0 OPT\n"
      "1RECV_F1 1F1 1RECV_F0 1F0 1B1 1SEND_B1 1B0 1SEND_B0 OPT\n");
  absl::Status s = JobSchedule(job).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot run"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 waits at 0SEND_F0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 waits at 1RECV_F1"));
}

TEST(JobSchedule, TextForOtherRanksOrInferenceMismatch_IsRefusedSayingWhatToChange) {
  JobSpec job = TinyJob(3, "gpipe", 1);
  job.mutable_pipeline()->set_schedule_text("0F0 0B0 OPT\n1F0 1B0 OPT\n");
  EXPECT_THAT(std::string(JobSchedule(job).status().message()), HasSubstr("lists 2 ranks but the job has 3 workers"));
  job = TinyJob(1, "gpipe", 1);
  job.mutable_pipeline()->set_schedule_text("0F0\n");
  EXPECT_THAT(std::string(JobSchedule(job).status().message()), HasSubstr("pass --inference"));
  job.mutable_pipeline()->set_schedule("forward");
  job.mutable_pipeline()->clear_schedule_text();
  EXPECT_THAT(std::string(JobSchedule(job).status().message()), HasSubstr("pass --inference"));
}

TEST(Partitioner, Profiled_GivesEveryRankItsListAndPredictsTheStep) {
  const JobSpec job = TinyJob(2, "1f1b", 4);
  absl::StatusOr<Partition> p = Partitioner(job)(Profiled(job, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->schedules.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(p->schedules[r].rank(), r);
    EXPECT_GT(p->schedules[r].actions_size(), 0);
  }
  int layers = 0;
  for (int n : p->layers_per_stage) layers += n;
  EXPECT_EQ(layers, 10);
  EXPECT_THAT(p->description, HasSubstr("predicted step"));
  EXPECT_THAT(p->description, HasSubstr("layer ms (forward + backward): embedding"));
  // The simulator's memory in flight, per rank: 1F1B over 2 ranks holds 2 and 1 micro-batches.
  EXPECT_THAT(p->description, HasSubstr("in flight per rank 2/1 micro-batches ("));
  EXPECT_EQ(p->predicted_from, "profile");
  EXPECT_GT(p->predicted_step_ms, 0);
  ASSERT_EQ(p->predicted_rank_bubble.size(), 2u);
  for (double b : p->predicted_rank_bubble) EXPECT_TRUE(b > 0 && b < 1) << b;
}

// Without a measured profile (one stage registers without one) the step is still predicted on GPUs,
// from the family's estimate, and the report says so; replicas get their pipeline's per-rank figures.
TEST(Partitioner, Unprofiled_OnGpus_PredictsFromTheEstimateAndSaysSo) {
  JobSpec job = TinyJob(1, "1f1b", 4);
  job.set_device("cuda");
  job.set_workers(2);
  job.set_data_parallel(2);
  std::vector<WorkerState> workers(2);
  for (WorkerState& w : workers) {
    w.profile.add_layers();  // a layer count only, no times
    w.device.set_free_bytes(int64_t{80} << 30);
  }
  absl::StatusOr<Partition> p = Partitioner(job)(workers);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->predicted_from, "estimate");
  EXPECT_GT(p->predicted_step_ms, 0);
  EXPECT_EQ(p->predicted_rank_bubble.size(), 2u);
  EXPECT_THAT(p->description, HasSubstr("(estimated)"));
  EXPECT_THAT(p->description, HasSubstr("in flight per rank 1 micro-batches"));
}

// On CPU workers the family's estimate (a GPU's figures) predicted 0.0000 s/step against a measured
// 0.5 s: without a profile there, nothing is predicted.
TEST(Partitioner, Unprofiled_OnCpuWorkers_PredictsNothing) {
  JobSpec job = TinyJob(1, "1f1b", 4);
  std::vector<WorkerState> workers(1);
  workers[0].profile.add_layers();
  absl::StatusOr<Partition> p = Partitioner(job)(workers);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->predicted_from, "");
  EXPECT_EQ(p->predicted_step_ms, 0);
  EXPECT_TRUE(p->predicted_rank_bubble.empty());
  // Nor in the partition's line, which said "stage ms 0.00 (estimated); predicted step 0.0 ms".
  EXPECT_THAT(p->description, Not(HasSubstr("predicted step")));
  EXPECT_THAT(p->description, Not(HasSubstr(" ms")));
  EXPECT_THAT(p->description, HasSubstr("no time predicted on CPU workers"));
}

// A zero-bubble split holds each micro-batch until its W: rank 0 of zb-h1 on 2 ranks keeps 2, as 1F1B.
TEST(Partitioner, ZeroBubble_ReportsEachRanksMemoryInFlight) {
  for (const std::string name : {"zb-h1", "zb-v", "gpipe"}) {
    SCOPED_TRACE(name);
    JobSpec job = TinyJob(2, name, 4);
    if (name == "zb-v") job.mutable_pipeline()->set_stage_chunks(2);
    absl::StatusOr<Partition> p = Partitioner(job)(Profiled(job, 2));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_THAT(p->description,
                HasSubstr(name == "gpipe" ? "in flight per rank 4/4 micro-batches" : "in flight per rank "));
  }
}

TEST(Partitioner, TwoChunksPerWorker_PartitionsEveryVirtualStage) {
  for (const std::string name : {"interleaved-1f1b", "zb-v"}) {
    SCOPED_TRACE(name);
    JobSpec job = TinyJob(2, name, 4);
    job.mutable_pipeline()->set_stage_chunks(2);
    job.mutable_pipeline()->set_partition("uniform");
    absl::StatusOr<Partition> p = Partitioner(job)(Profiled(job, 2));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->layers_per_stage.size(), 4u);
    absl::StatusOr<Schedule> s = FromProto(p->schedules[0]);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->stage_rank, name == "zb-v" ? (std::vector<int>{0, 1, 1, 0}) : (std::vector<int>{0, 1, 0, 1}));
  }
}

std::string Testdata(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/stagehand/launcher/plan/testdata/" + name;
}

// --layout=auto from the recorded gpt-1.3b profiles: the lines say what it planned from, the cost model,
// the best three and why the first won; the same every time. A file that is not a profile of this model
// is one line naming it.
TEST(ApplyAutoLayout, RecordedProfiles_ChooseDeterministicallyAndExplain) {
  auto plan = [](const std::string& profiles) {
    JobSpec job;
    job.set_model("gpt-1.3b");
    job.set_device("cuda");
    job.set_workers(2);
    job.set_layout("auto");
    job.set_layout_profiles(profiles);
    std::vector<GpuInfo> gpus(2);
    for (GpuInfo& g : gpus) g.total_bytes = int64_t{143} * 1000 * 1000 * 1000;
    absl::StatusOr<std::vector<std::string>> lines = ApplyAutoLayout(job, gpus, 0);
    return std::make_pair(job, lines);
  };
  std::string files;
  for (int mb : {1, 4, 8, 16}) {
    files +=
        (files.empty() ? "" : ",") + Testdata("gpt-1.3b-h200-fused-mb" + std::to_string(mb) + ".profile.textproto");
  }
  auto [job, lines] = plan(files);
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::string all;
  for (const std::string& l : *lines) all += l + "\n";
  std::cout << all;
  EXPECT_THAT(all, HasSubstr("from 4 recorded profiles"));
  EXPECT_THAT(all, HasSubstr("costs fitted to micro-batches of 1, 4, 8, 16"));
  EXPECT_THAT(all, HasSubstr("  3. "));
  EXPECT_THAT(all, HasSubstr("the first is "));
  EXPECT_GE(job.pipeline().global_batch() / (job.pipeline().micro_batches() * job.data_parallel()), 4);
  auto [again, lines2] = plan(files);
  ASSERT_TRUE(lines2.ok());
  EXPECT_EQ(*lines, *lines2);
  EXPECT_EQ(job.DebugString(), again.DebugString());

  auto [bad, refused] = plan(Testdata("no-such.profile.textproto"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--layout_profiles: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no-such.profile.textproto"));
}

// From the family's estimate (no recorded profiles) on 8 GPUs: with the assumed fixed cost per layer
// the choice is not micro-batches of one sequence (the linear model picked 8 stages x 32 of 1).
TEST(ApplyAutoLayout, EstimateOnEightGpus_AssumesAFixedCostAndAvoidsMicroBatchesOfOne) {
  JobSpec job;
  job.set_model("gpt-1.3b");
  job.set_device("cuda");
  job.set_workers(8);
  job.set_layout("auto");
  std::vector<GpuInfo> gpus(8);
  for (GpuInfo& g : gpus) g.total_bytes = int64_t{143} * 1000 * 1000 * 1000;
  absl::StatusOr<std::vector<std::string>> lines = ApplyAutoLayout(job, gpus, 0);
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::string all;
  for (const std::string& l : *lines) all += l + "\n";
  std::cout << all;
  EXPECT_THAT(all, HasSubstr("gpt-1.3b's estimate"));
  EXPECT_THAT(all, HasSubstr("assumed fixed"));
  EXPECT_GT(job.pipeline().global_batch() / (job.pipeline().micro_batches() * job.data_parallel()), 1);
}

TEST(JobSchedule, ZeroBubbleH1_SplitsTheBackward) {
  absl::StatusOr<Schedule> s = JobSchedule(TinyJob(2, "zb-h1", 4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(ToString(s->ranks[1]), HasSubstr("1I0"));
  EXPECT_THAT(ToString(s->ranks[1]), HasSubstr("1W0"));
}

TEST(JobSchedule, ChunksTheScheduleDoesNotHold_AreRefusedNamingTheFlag) {
  JobSpec job = TinyJob(2, "zb-v", 4);
  job.mutable_pipeline()->set_stage_chunks(3);
  EXPECT_THAT(std::string(JobSchedule(job).status().message()), HasSubstr("--stage_chunks=2"));
  job = TinyJob(4, "interleaved-1f1b", 6);
  EXPECT_THAT(std::string(JobSchedule(job).status().message()), HasSubstr("--micro_batches=8"));
}

TEST(FailureGrid, MarksTheFailedActionInTheWholeSchedule) {
  const JobSpec job = TinyJob(2, "gpipe", 2);
  absl::StatusOr<Partition> p = Partitioner(job)(Profiled(job, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<Schedule> s = FromProto(p->schedules[1]);
  ASSERT_TRUE(s.ok());
  int index = -1;  // rank 1's backward of micro-batch 0
  for (size_t i = 0; i < s->ranks[1].size(); ++i) {
    if (ToString(s->ranks[1][i]) == "1B0") index = static_cast<int>(i);
  }
  ASSERT_GE(index, 0);
  absl::StatusOr<std::string> grid = FailureGrid(*p, 1, index);
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_THAT(*grid, HasSubstr("[1B0]"));
  EXPECT_THAT(*grid, HasSubstr("0F0"));  // rank 0's row is there too
}

// --- The clock-aware partition: fake GPUs whose profiles carry their SM clocks. ---

JobSpec GpuJob(int stages) {
  JobSpec job;
  job.set_model("gpt-1.3b");
  job.set_device("cuda");
  job.set_workers(stages);
  *job.mutable_model_spec() = *FindBuiltinModel("gpt-1.3b")->Resolve("gpt-1.3b", {});
  PipelineSpec& p = *job.mutable_pipeline();
  p.set_stages(stages);
  p.set_schedule("1f1b");
  p.set_micro_batches(8);
  p.set_global_batch(32);
  p.set_partition("auto");
  return job;
}

LoadClock Clock(double mhz, const std::string& source = "profile") {
  LoadClock c;
  c.set_sm_mhz(mhz);
  c.set_samples(20);
  c.set_source(source);
  return c;
}

// A worker per entry of `profile_mhz`: its profile is the estimate at `reference_mhz` measured at that
// clock (time ~ 1/clock) when `fresh`, else the same profile for all (a cache's, measured at
// reference_mhz); its clock under load is `load_mhz`.
std::vector<WorkerState> GpuWorkers(const JobSpec& job, const std::vector<double>& load_mhz, bool fresh,
                                    double reference_mhz = 1800) {
  std::vector<WorkerState> out(load_mhz.size());
  const LayerProfile estimate = FindBuiltinModel("gpt-1.3b")->Estimate(job.model_spec(), 4);
  for (size_t r = 0; r < out.size(); ++r) {
    WorkerState& w = out[r];
    w.device.set_free_bytes(int64_t{140} << 30);
    w.profile = estimate;
    const double measured_at = fresh ? load_mhz[r] : reference_mhz;
    for (LayerCost& c : *w.profile.mutable_layers()) {
      c.set_forward_ms(c.forward_ms() * reference_mhz / measured_at);
      c.set_backward_ms(c.backward_ms() * reference_mhz / measured_at);
    }
    *w.profile.mutable_clock() = Clock(measured_at);
    w.load_clock = Clock(load_mhz[r], fresh ? "profile" : "last run");
  }
  return out;
}

std::string Counts(const Partition& p) { return absl::StrJoin(p.layers_per_stage, "/"); }

TEST(Partitioner, EqualClocks_GiveTheClockBlindPartitionExactly) {
  JobSpec job = GpuJob(2);
  const std::vector<WorkerState> workers = GpuWorkers(job, {1834.5, 1834.5}, /*fresh=*/true);
  absl::StatusOr<Partition> weighed = Partitioner(job)(workers);
  job.set_partition_clocks(false);
  absl::StatusOr<Partition> blind = Partitioner(job)(workers);
  ASSERT_TRUE(weighed.ok() && blind.ok()) << weighed.status() << blind.status();
  EXPECT_EQ(weighed->layers_per_stage, blind->layers_per_stage);
  EXPECT_EQ(weighed->predicted_step_ms, blind->predicted_step_ms);
  EXPECT_EQ(weighed->predicted_compute_ms, blind->predicted_compute_ms);
  EXPECT_THAT(weighed->description,
              HasSubstr("SM clocks (each GPU's last run, time ~ 1/clock): rank 0 1834 MHz, rank 1 1834 MHz"));
  EXPECT_THAT(blind->description, HasSubstr("clock-blind: --partition_clocks=false"));
  EXPECT_EQ(blind->planned_sm_mhz, (std::vector<double>{0, 0}));
}

// Rank 0 at 90% of rank 1's clock: it gets less work, and the step predicted at those speeds beats the
// clock-blind split's at the same speeds (run as an explicit partition, priced at the clocks).
void ExpectSlowRankGetsLess(const std::vector<WorkerState>& workers) {
  JobSpec job = GpuJob(2);
  absl::StatusOr<Partition> weighed = Partitioner(job)(workers);
  ASSERT_TRUE(weighed.ok()) << weighed.status();
  JobSpec blind_job = job;
  blind_job.set_partition_clocks(false);
  absl::StatusOr<Partition> blind = Partitioner(blind_job)(workers);
  ASSERT_TRUE(blind.ok()) << blind.status();
  EXPECT_LT(weighed->layers_per_stage[0], blind->layers_per_stage[0]) << Counts(*weighed) << " vs " << Counts(*blind);
  job.mutable_pipeline()->set_partition(Counts(*blind).replace(Counts(*blind).find('/'), 1, ","));
  absl::StatusOr<Partition> blind_at_speed = Partitioner(job)(workers);
  ASSERT_TRUE(blind_at_speed.ok()) << blind_at_speed.status();
  EXPECT_LT(weighed->predicted_step_ms, blind_at_speed->predicted_step_ms);
  EXPECT_EQ(weighed->planned_sm_mhz, (std::vector<double>{1620, 1800}));
  ASSERT_EQ(weighed->predicted_compute_ms.size(), 2u);
  EXPECT_GT(weighed->predicted_compute_ms[0], 0);
}

TEST(Partitioner, RankAtNinetyPercentClock_FreshProfiles_GetsLessWork) {
  ExpectSlowRankGetsLess(GpuWorkers(GpuJob(2), {1620, 1800}, /*fresh=*/true));
}

TEST(Partitioner, RankAtNinetyPercentClock_OneCachedProfile_GetsLessWork) {
  ExpectSlowRankGetsLess(GpuWorkers(GpuJob(2), {1620, 1800}, /*fresh=*/false));
}

TEST(Partitioner, RankWithoutClock_IsClockBlindAndSaysWhy) {
  const JobSpec job = GpuJob(2);
  std::vector<WorkerState> workers = GpuWorkers(job, {1620, 1800}, /*fresh=*/false);
  workers[1].profile.clear_clock();
  workers[1].load_clock.Clear();
  absl::StatusOr<Partition> p = Partitioner(job)(workers);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->description, HasSubstr("clock-blind: rank 1 measured its profile without an SM clock reading"));
  EXPECT_EQ(p->planned_sm_mhz, (std::vector<double>{0, 0}));
}

TEST(Partitioner, CpuJob_DescriptionSaysNothingOfClocks) {
  const JobSpec job = TinyJob(2, "1f1b", 4);
  absl::StatusOr<Partition> p = Partitioner(job)(Profiled(job, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->description, ::testing::Not(HasSubstr("clock")));
  EXPECT_EQ(p->predicted_compute_ms.size(), 2u);
}

}  // namespace
}  // namespace stagehand
