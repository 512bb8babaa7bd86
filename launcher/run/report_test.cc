// Unit tests of the run report: the FLOP count against targets.md, every aggregate of a hand-made
// 2-rank run checked against hand arithmetic, report.json round-tripping through protobuf's parser, and
// trace.json parsed back, with its tracks free of overlaps even when the reports overlap.
#include "launcher/run/report.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr double kTol = 1e-9;

JobSpec Gpt(int64_t vocab, int64_t hidden, int64_t layers, int64_t seq, int64_t global_batch) {
  JobSpec job;
  job.set_model("tiny");
  job.set_steps(5);
  job.mutable_model_spec()->set_vocab(vocab);
  job.mutable_model_spec()->set_hidden(hidden);
  job.mutable_model_spec()->set_layers(layers);
  job.mutable_model_spec()->set_seq(seq);
  job.mutable_model_spec()->set_heads(16);
  job.mutable_pipeline()->set_global_batch(global_batch);
  return job;
}

struct Timing {
  double step_ms, forward_ms, backward_ms, optimizer_ms, wait_ms, idle_ms;
  int64_t comm_bytes;
  double comm_ms;
};

ReportStepRequest Step(int rank, int64_t step, double seconds, int64_t tokens, int64_t peak_memory) {
  ReportStepRequest r;
  r.set_rank(rank);
  r.set_step(step);
  r.set_step_seconds(seconds);
  r.set_tokens(tokens);
  r.set_peak_memory_bytes(peak_memory);
  return r;
}

ReportStepRequest WithLoss(ReportStepRequest r, double loss) {
  r.set_has_loss(true);
  r.set_loss(loss);
  return r;
}

ReportStepRequest WithTiming(ReportStepRequest r, const Timing& t) {
  StepTiming* s = r.mutable_timing();
  s->set_rank(r.rank());
  s->set_step(r.step());
  s->set_step_ms(t.step_ms);
  s->set_forward_ms(t.forward_ms);
  s->set_backward_ms(t.backward_ms);
  s->set_optimizer_ms(t.optimizer_ms);
  s->set_wait_ms(t.wait_ms);
  s->set_idle_ms(t.idle_ms);
  s->set_comm_bytes(t.comm_bytes);
  s->set_comm_ms(t.comm_ms);
  return r;
}

// A 2-stage training run of 5 steps, warm-up 2 (steps 2, 3, 4 timed). Rank 1 is the head (holds the
// loss) and is faster per report than rank 0, so taking the max would give a different step time.
// The warm-up steps carry wild values that would show if they leaked into a mean.
constexpr int64_t kTokens = 4 * 16;
ReportInput TwoRankRun() {
  ReportInput in;
  in.job_id = "job-7";
  in.job = Gpt(/*vocab=*/128, /*hidden=*/64, /*layers=*/2, /*seq=*/16, /*global_batch=*/4);
  in.exit_code = 1;
  in.root_cause = "rank 1 exited with code 3";
  in.hosts = {"host-a", "host-b"};
  in.devices = {"NVIDIA H200", "cpu"};
  in.layers = {{0, 2}, {2, 4}};
  in.peak_tflops_per_device = 1e-4;
  in.warmup_steps = 2;
  in.launch_to_first_step_seconds = 4.5;
  const double head_seconds[] = {10, 10, 0.7, 0.8, 0.9};
  const double first_seconds[] = {20, 20, 1.1, 1.2, 1.3};
  const int64_t peak0[] = {100, 200, 900, 300, 400};
  const double losses[] = {10, 9, 8, 7, 6};
  for (int s = 0; s < 5; ++s) {
    const bool warm = s < 2;
    // Rank 0: forward 20+s, bubble 1 - (65+s)/100; comm (s+1) MB in 0.5*(s+1) ms.
    const Timing t0 = warm ? Timing{100, 999, 999, 999, 999, 999, 1, 1000}
                           : Timing{100, 20.0 + s, 40, 5, 10, 25.0 - s, int64_t{1000000} * (s + 1), 0.5 * (s + 1)};
    // Rank 1: bubble 1 - (85+s)/100, except step 4 where compute exceeds the step (clamped to 0).
    const Timing t1 = warm ? Timing{100, 999, 999, 999, 999, 999, 0, 0}
                           : Timing{s == 4 ? 80.0 : 100.0, 30, 50.0 + s, 5, 2, 13.0 - s, 0, 0};
    // Arrival order mixed on purpose: the head's report of a step before the first stage's.
    in.steps.push_back(WithTiming(WithLoss(Step(1, s, head_seconds[s], kTokens, 50), losses[s]), t1));
    in.steps.push_back(WithTiming(Step(0, s, first_seconds[s], kTokens, peak0[s]), t0));
  }
  return in;
}

TEST(StepFlops, ReferenceGpt_MatchesTargets) {
  const JobSpec job = Gpt(/*vocab=*/32768, /*hidden=*/2048, /*layers=*/24, /*seq=*/1024, /*global_batch=*/32);
  EXPECT_THAT(StepFlops(job), DoubleNear(2.606e14, 2.606e14 * 1e-3));
}

TEST(StepFlops, Inference_IsAThirdOfTraining) {
  JobSpec job = Gpt(32768, 2048, 24, 1024, 32);
  const double training = StepFlops(job);
  job.mutable_pipeline()->set_inference(true);
  EXPECT_THAT(StepFlops(job), DoubleNear(training / 3, training * 1e-12));
}

TEST(StepFlops, TinyLlama_CountsGroupedQueryAttentionAndSwiGlu) {
  JobSpec job;
  job.set_model("tinyllama-1.1b");
  auto& m = *job.mutable_model_spec();
  m.set_vocab(32000);
  m.set_hidden(2048);
  m.set_heads(32);
  m.set_kv_heads(4);
  m.set_ffn_hidden(5632);
  m.set_layers(22);
  m.set_seq(1024);
  job.mutable_pipeline()->set_global_batch(32);
  // 6 * tokens * (22 * (2 H^2 + 2 H * 256 + 3 H * 5632) + V H) + 6 * L * GB * S^2 * H.
  const double h = 2048, tokens = 32 * 1024.0;
  const double expected =
      6 * tokens * (22 * (2 * h * h + 2 * h * 256 + 3 * h * 5632) + 32000 * h) + 6 * 22 * 32 * 1024.0 * 1024 * h;
  EXPECT_THAT(StepFlops(job), DoubleNear(expected, expected * 1e-9));
}

TEST(StepFlops, AllreduceModel_IsZero) {
  JobSpec job;
  job.set_model("allreduce");
  job.mutable_pipeline()->set_global_batch(32);
  EXPECT_EQ(StepFlops(job), 0);
}

TEST(BuildReport, Evaluations_LastValLossAndTokensSeenAndParameters) {
  ReportInput in = TwoRankRun();
  for (ReportStepRequest& r : in.steps) {
    r.set_parameters(r.rank() == 0 ? 1000 : 1500);
    if (r.rank() == 1 && (r.step() == 1 || r.step() == 3)) {
      r.set_has_val_loss(true);
      r.set_val_loss(r.step() == 1 ? 3.0 : 2.0);
    }
  }
  const RunReport report = BuildReport(in);
  EXPECT_TRUE(report.has_val_loss());
  EXPECT_DOUBLE_EQ(report.val_loss(), 2.0);  // after step 3, the latest
  EXPECT_NEAR(report.val_perplexity(), std::exp(2.0), 1e-12);
  EXPECT_EQ(report.val_step(), 4);
  EXPECT_EQ(report.tokens_seen(), 5 * kTokens);
  EXPECT_EQ(report.parameters(), 2500);
  ASSERT_EQ(report.ranks_size(), 2);
  EXPECT_EQ(report.ranks(0).parameters(), 1000);
  EXPECT_EQ(report.ranks(1).parameters(), 1500);
}

TEST(BuildReport, NoEvaluation_HasNoValLoss) {
  const RunReport report = BuildReport(TwoRankRun());
  EXPECT_FALSE(report.has_val_loss());
  EXPECT_EQ(report.val_perplexity(), 0);
}

TEST(BuildReport, TwoRanks_CopiesJobAndRunFields) {
  const ReportInput in = TwoRankRun();
  const RunReport r = BuildReport(in);
  EXPECT_EQ(r.job_id(), "job-7");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r.job(), in.job));
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.root_cause(), "rank 1 exited with code 3");
  EXPECT_EQ(r.steps(), 5);
  EXPECT_EQ(r.warmup_steps(), 2);
  EXPECT_EQ(r.peak_tflops_per_device(), 1e-4);
  EXPECT_EQ(r.launch_to_first_step_seconds(), 4.5);
}

TEST(BuildReport, TwoRanks_StepTimeFromHeadAndThroughput) {
  const RunReport r = BuildReport(TwoRankRun());
  // Head's timed steps 0.7, 0.8, 0.9 (not rank 0's slower 1.1..1.3, not the warm-up's 10).
  EXPECT_THAT(r.step_seconds(), DoubleNear(0.8, kTol));
  EXPECT_THAT(r.tokens_per_second(), DoubleNear(64 / 0.8, kTol));
  // 6*4*16*(12*2*64^2 + 128*64) + 6*2*4*16^2*64 = 384*106496 + 786432.
  const double flops = 41680896;
  EXPECT_THAT(r.flops_per_step(), DoubleNear(flops, 1e-3));
  EXPECT_THAT(r.tflops(), DoubleNear(flops / 0.8 / 1e12, 1e-15));
  EXPECT_THAT(r.mfu(), DoubleNear(flops / 0.8 / 1e12 / (1e-4 * 2), 1e-9));
  // Losses from the head in step order, warm-up included.
  EXPECT_EQ(r.first_loss(), 10);
  EXPECT_EQ(r.last_loss(), 6);
}

TEST(BuildReport, TwoRanks_StepTimeFromHeadAndBubblePerRank) {
  const RunReport r = BuildReport(TwoRankRun());
  ASSERT_EQ(r.ranks_size(), 2);
  const RankReport& first = r.ranks(0);
  EXPECT_EQ(first.rank(), 0);
  EXPECT_EQ(first.host(), "host-a");
  EXPECT_EQ(first.device(), "NVIDIA H200");
  EXPECT_EQ(first.first_layer(), 0);
  EXPECT_EQ(first.last_layer(), 2);
  EXPECT_THAT(first.forward_ms(), DoubleNear(23, kTol));  // (22+23+24)/3
  EXPECT_THAT(first.backward_ms(), DoubleNear(40, kTol));
  EXPECT_THAT(first.optimizer_ms(), DoubleNear(5, kTol));
  EXPECT_THAT(first.wait_ms(), DoubleNear(10, kTol));
  EXPECT_THAT(first.idle_ms(), DoubleNear(22, kTol));            // (23+22+21)/3
  EXPECT_THAT(first.bubble_fraction(), DoubleNear(0.32, kTol));  // (0.33+0.32+0.31)/3
  EXPECT_THAT(first.comm_gbps(), DoubleNear(2, kTol));           // 12e6 bytes / 6 ms
  EXPECT_EQ(first.peak_memory_bytes(), 900);

  const RankReport& head = r.ranks(1);
  EXPECT_EQ(head.rank(), 1);
  EXPECT_EQ(head.host(), "host-b");
  EXPECT_EQ(head.device(), "cpu");
  EXPECT_EQ(head.first_layer(), 2);
  EXPECT_EQ(head.last_layer(), 4);
  EXPECT_THAT(head.forward_ms(), DoubleNear(30, kTol));
  EXPECT_THAT(head.backward_ms(), DoubleNear(53, kTol));  // (52+53+54)/3
  EXPECT_THAT(head.optimizer_ms(), DoubleNear(5, kTol));
  EXPECT_THAT(head.wait_ms(), DoubleNear(2, kTol));
  EXPECT_THAT(head.idle_ms(), DoubleNear(10, kTol));  // (11+10+9)/3
  // 0.13, 0.12, and step 4's 1 - 89/80 < 0 clamped to 0.
  EXPECT_THAT(head.bubble_fraction(), DoubleNear(0.25 / 3, kTol));
  EXPECT_EQ(head.comm_gbps(), 0);
  EXPECT_EQ(head.peak_memory_bytes(), 50);
}

TEST(BuildReport, InferenceWithoutLoss_StepTimeIsMaxOverRanks) {
  ReportInput in;
  in.job = Gpt(128, 64, 2, 16, 4);
  in.job.mutable_pipeline()->set_inference(true);
  in.peak_tflops_per_device = 0;
  in.steps = {Step(0, 0, 1.0, 64, 0), Step(1, 0, 2.0, 64, 0), Step(0, 1, 3.0, 64, 0), Step(1, 1, 2.5, 64, 0)};
  const RunReport r = BuildReport(in);
  EXPECT_THAT(r.step_seconds(), DoubleNear(2.5, kTol));  // max per step: 2.0, 3.0
  EXPECT_THAT(r.tokens_per_second(), DoubleNear(64 / 2.5, kTol));
  EXPECT_THAT(r.flops_per_step(), DoubleNear(41680896.0 / 3, 1e-3));
  EXPECT_EQ(r.mfu(), 0);  // no peak given
  EXPECT_EQ(r.first_loss(), 0);
  EXPECT_EQ(r.last_loss(), 0);
  EXPECT_EQ(r.ranks_size(), 2);  // no hosts given: 1 + the highest rank seen
}

// A program's steps (stagehand.step): samples/s, and FLOP/s and MFU from the FLOPs its script
// reported (the whole job's per step, on every rank alike: counted once), not from a model's shape.
ReportInput ProgramRun(double peak_tflops_per_device) {
  ReportInput in;
  in.job.add_program("/usr/bin/python3");
  in.job.add_program("train.py");
  in.job.set_workers(2);
  in.peak_tflops_per_device = peak_tflops_per_device;
  in.warmup_steps = 1;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::pair<int, double>> seconds_per_step = {
        {0, 10.0}, {1, 0.5 - 0.1 * rank}, {2, 0.3 - 0.1 * rank}};
    for (const auto& [step, seconds] : seconds_per_step) {
      ReportStepRequest r = WithLoss(Step(rank, step, seconds, 0, 0), 1);
      r.set_samples(16);
      r.set_flops(2e12);
      in.steps.push_back(r);
    }
  }
  return in;
}

TEST(BuildReport, ProgramSteps_SamplesPerSecondAndReportedFlops) {
  const RunReport r = BuildReport(ProgramRun(/*peak_tflops_per_device=*/10));
  EXPECT_THAT(r.step_seconds(), DoubleNear(0.4, kTol));  // the slowest rank's 0.5 and 0.3
  EXPECT_THAT(r.samples_per_second(), DoubleNear(32 / 0.8, kTol));
  EXPECT_EQ(r.tokens_per_second(), 0);
  EXPECT_THAT(r.flops_per_step(), DoubleNear(2e12, 1e-3));
  EXPECT_THAT(r.tflops(), DoubleNear(4e12 / 0.8 / 1e12, kTol));
  EXPECT_THAT(r.mfu(), DoubleNear(5.0 / (10 * 2), kTol));
  // CPU workers: no peak, so FLOP/s without an MFU.
  const RunReport cpu = BuildReport(ProgramRun(/*peak_tflops_per_device=*/0));
  EXPECT_THAT(cpu.tflops(), DoubleNear(5, kTol));
  EXPECT_EQ(cpu.mfu(), 0);
}

TEST(BuildReport, ProgramWithoutSamplesOrFlops_NoneReported) {
  ReportInput in = ProgramRun(10);
  for (ReportStepRequest& r : in.steps) r.clear_samples(), r.clear_flops();
  const RunReport r = BuildReport(in);
  EXPECT_THAT(r.step_seconds(), DoubleNear(0.4, kTol));
  EXPECT_EQ(r.samples_per_second(), 0);
  EXPECT_EQ(r.flops_per_step(), 0);
  EXPECT_EQ(r.tflops(), 0);
  EXPECT_EQ(r.mfu(), 0);
}

TEST(BuildReport, WarmupCoversAllSteps_UsesEveryStep) {
  ReportInput in;
  in.job = Gpt(128, 64, 2, 16, 4);
  in.warmup_steps = 3;
  in.steps = {WithLoss(Step(0, 0, 1.0, 64, 0), 5), WithLoss(Step(0, 1, 2.0, 64, 0), 4)};
  const RunReport r = BuildReport(in);
  EXPECT_THAT(r.step_seconds(), DoubleNear(1.5, kTol));
  EXPECT_EQ(r.first_loss(), 5);
  EXPECT_EQ(r.last_loss(), 4);
}

TEST(BuildReport, NoReports_ZerosWithoutDividingByZero) {
  ReportInput in;
  in.job = Gpt(128, 64, 2, 16, 4);
  in.hosts = {"h"};
  const RunReport r = BuildReport(in);
  EXPECT_EQ(r.step_seconds(), 0);
  EXPECT_EQ(r.tflops(), 0);
  EXPECT_EQ(r.mfu(), 0);
  ASSERT_EQ(r.ranks_size(), 1);
  EXPECT_EQ(r.ranks(0).host(), "h");
  EXPECT_EQ(r.ranks(0).bubble_fraction(), 0);
}

TEST(BuildReport, StepsEveryRankReported_AreStepsDoneNotTheRequestedCount) {
  ReportInput in = TwoRankRun();
  in.job.set_steps(100);
  in.steps.push_back(Step(1, 5, 1, kTokens, 0));  // step 5 only on rank 1: not done
  const RunReport r = BuildReport(in);
  EXPECT_EQ(r.steps(), 100);
  EXPECT_EQ(r.steps_done(), 5);
}

TEST(BuildReport, TimingOff_NoBubble) {
  // --timing=false: each step still carries its length, but no actions and no breakdown.
  ReportInput in;
  in.job = Gpt(128, 64, 2, 16, 4);
  in.hosts = {"h"};
  for (int s = 0; s < 3; ++s) in.steps.push_back(WithTiming(Step(0, s, 0.1, kTokens, 0), Timing{100}));
  const RunReport r = BuildReport(in);
  EXPECT_EQ(r.ranks(0).bubble_fraction(), 0);
  EXPECT_FALSE(HasActionTiming(in.steps));
  EXPECT_TRUE(HasActionTiming(TwoRankRun().steps));
}

TEST(ReportJson, TwoRanks_ParsesBackToTheSameReport) {
  const RunReport report = BuildReport(TwoRankRun());
  const absl::StatusOr<std::string> json = ReportJson(report);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"step_seconds\""));
  EXPECT_THAT(*json, HasSubstr("\"first_layer\""));  // field names as in the proto
  RunReport parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(*json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, report)) << parsed.DebugString() << "\nvs\n"
                                                                                  << report.DebugString();
}

TEST(ReportJson, ZeroFields_ArePrinted) {
  const absl::StatusOr<std::string> json = ReportJson(RunReport());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"mfu\": 0"));
}

// --- trace.json ---

Struct ParseTrace(const std::string& json) {
  Struct trace;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &trace);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return trace;
}

std::vector<Struct> Events(const Struct& trace, const std::string& ph) {
  std::vector<Struct> out;
  const auto it = trace.fields().find("traceEvents");
  if (it == trace.fields().end()) return out;
  for (const Value& v : it->second.list_value().values()) {
    if (v.struct_value().fields().at("ph").string_value() == ph) out.push_back(v.struct_value());
  }
  return out;
}

double Num(const Struct& event, const std::string& field) { return event.fields().at(field).number_value(); }
std::string Str(const Struct& event, const std::string& field) { return event.fields().at(field).string_value(); }

// Complete events of each (pid, tid) must come in ts order and not overlap. Compared in integer
// nanoseconds: the trace prints microseconds with three decimals, and summing doubles could differ in
// the last bit. Returns one line per violation.
std::vector<std::string> TrackViolations(const Struct& trace) {
  std::vector<std::string> out;
  std::map<std::pair<int, int>, int64_t> track_end;  // (pid, tid) -> end of the last slice, ns
  for (const Struct& e : Events(trace, "X")) {
    const std::pair<int, int> track = {static_cast<int>(Num(e, "pid")), static_cast<int>(Num(e, "tid"))};
    const int64_t ts = std::llround(Num(e, "ts") * 1000);
    const int64_t dur = std::llround(Num(e, "dur") * 1000);
    if (dur < 0) out.push_back(absl::StrCat(Str(e, "name"), ": negative dur ", dur));
    const auto it = track_end.find(track);
    if (it != track_end.end() && ts < it->second) {
      out.push_back(absl::StrCat(Str(e, "name"), " on pid ", track.first, " starts at ", ts,
                                 " ns before the previous slice ends at ", it->second, " ns"));
    }
    track_end[track] = ts + dur;
  }
  return out;
}

ActionTiming Action(const std::string& name, const std::string& kind, double start_ms, double duration_ms,
                    int64_t bytes = 0) {
  ActionTiming a;
  a.set_name(name);
  a.set_kind(kind);
  a.set_start_ms(start_ms);
  a.set_duration_ms(duration_ms);
  a.set_bytes(bytes);
  return a;
}

ReportStepRequest Timed(int rank, int64_t step, int64_t start_unix_micros, std::vector<ActionTiming> actions) {
  ReportStepRequest r = Step(rank, step, 0.01, 64, 0);
  r.mutable_timing()->set_start_unix_micros(start_unix_micros);
  for (ActionTiming& a : actions) *r.mutable_timing()->add_actions() = std::move(a);
  return r;
}

// Two ranks, two steps; rank 1 starts 1 ms after rank 0. Reports arrive out of order.
std::vector<ReportStepRequest> TwoRankTrace() {
  constexpr int64_t t0 = 1700000000000000;
  return {
      Timed(1, 0, t0 + 1000, {Action("wait RA0", "wait", 0, 1), Action("F0", "forward", 1, 2)}),
      Timed(0, 1, t0 + 10000, {Action("F1", "forward", 0, 2), Action("SA1>1", "send", 2, 0.5, 4096)}),
      Timed(0, 0, t0, {Action("F0", "forward", 0, 2), Action("SA0>1", "send", 2, 0.5, 4096)}),
      Timed(1, 1, t0 + 11000, {Action("F1", "forward", 0, 2), Action("OPT", "optimizer", 2, 1)}),
  };
}

TEST(ChromeTrace, TwoRanks_MetadataPerRankAndOrderedSlices) {
  const Struct trace = ParseTrace(ChromeTrace(TwoRankTrace(), 2));
  EXPECT_EQ(trace.fields().at("displayTimeUnit").string_value(), "ms");
  const std::vector<Struct> meta = Events(trace, "M");
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, const Struct*> by_name;
    for (const Struct& m : meta) {
      if (Num(m, "pid") == rank) by_name[Str(m, "name")] = &m;
    }
    ASSERT_EQ(by_name.count("process_name"), 1) << rank;
    EXPECT_EQ(Str(by_name["process_name"]->fields().at("args").struct_value(), "name"), absl::StrCat("rank ", rank));
    ASSERT_EQ(by_name.count("thread_name"), 1) << rank;
    EXPECT_EQ(Str(by_name["thread_name"]->fields().at("args").struct_value(), "name"), "actions");
    ASSERT_EQ(by_name.count("process_sort_index"), 1) << rank;
    EXPECT_EQ(Num(by_name["process_sort_index"]->fields().at("args").struct_value(), "sort_index"), rank);
  }
  const std::vector<Struct> slices = Events(trace, "X");
  ASSERT_EQ(slices.size(), 8);
  EXPECT_THAT(TrackViolations(trace), IsEmpty());
  // By rank, then step, then action; ts from the earliest step start of the run.
  const std::vector<std::pair<std::string, double>> expected = {{"F0", 0},        {"SA0>1", 2000},    {"F1", 10000},
                                                                {"SA1>1", 12000}, {"wait RA0", 1000}, {"F0", 2000},
                                                                {"F1", 11000},    {"OPT", 13000}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(Str(slices[i], "name"), expected[i].first) << i;
    EXPECT_THAT(Num(slices[i], "ts"), DoubleNear(expected[i].second, 1e-6)) << i;
    EXPECT_EQ(Num(slices[i], "tid"), 0);
  }
  EXPECT_EQ(Str(slices[1], "cat"), "send");
  EXPECT_THAT(Num(slices[1], "dur"), DoubleNear(500, 1e-6));
  const Struct& args = slices[1].fields().at("args").struct_value();
  EXPECT_EQ(Num(args, "step"), 0);
  EXPECT_EQ(Num(args, "bytes"), 4096);
  EXPECT_EQ(slices[0].fields().at("args").struct_value().fields().count("bytes"), 0);  // no bytes moved
}

TEST(ChromeTrace, NoReports_MetadataOnlyAndValidJson) {
  const Struct trace = ParseTrace(ChromeTrace({}, 3));
  EXPECT_EQ(Events(trace, "M").size(), 9);
  EXPECT_THAT(Events(trace, "X"), IsEmpty());
}

TEST(TrackViolations, OverlappingSlices_AreReported) {
  const Struct trace = ParseTrace(R"({"traceEvents":[
      {"name":"a","ph":"X","pid":0,"tid":0,"ts":0,"dur":10},
      {"name":"b","ph":"X","pid":1,"tid":0,"ts":5,"dur":10},
      {"name":"c","ph":"X","pid":0,"tid":0,"ts":9.999,"dur":1}]})");
  EXPECT_THAT(TrackViolations(trace), testing::ElementsAre(HasSubstr("c on pid 0")));
}

TEST(ChromeTrace, OverlappingActions_AreClampedToThePreviousEnd) {
  constexpr int64_t t0 = 1700000000000000;
  // F0 ends at 3 ms; B0 claims to start at 2.5 ms (timer jitter); step 1 starts (by the wall clock)
  // 0.2 ms before step 0's last slice ends; X0 is swallowed whole by the slice before it.
  const std::vector<ReportStepRequest> steps = {
      Timed(0, 0, t0, {Action("F0", "forward", 0, 3), Action("B0", "backward", 2.5, 2)}),
      Timed(0, 1, t0 + 4300, {Action("F1", "forward", 0, 1), Action("X0", "idle", 0.5, 0.25)}),
  };
  const std::string json = ChromeTrace(steps, 1);
  const Struct trace = ParseTrace(json);
  EXPECT_THAT(TrackViolations(trace), IsEmpty()) << json;
  const std::vector<Struct> slices = Events(trace, "X");
  ASSERT_EQ(slices.size(), 4);
  EXPECT_THAT(Num(slices[1], "ts"), DoubleNear(3000, 1e-6));   // B0 moved to F0's end...
  EXPECT_THAT(Num(slices[1], "dur"), DoubleNear(1500, 1e-6));  // ...and keeps its end at 4.5 ms
  EXPECT_THAT(Num(slices[2], "ts"), DoubleNear(4500, 1e-6));   // F1 after B0
  EXPECT_THAT(Num(slices[2], "dur"), DoubleNear(800, 1e-6));
  EXPECT_EQ(Str(slices[3], "name"), "X0");
  EXPECT_EQ(Num(slices[3], "dur"), 0);  // never negative
}

TEST(ChromeTrace, NameWithQuoteAndControls_IsEscaped) {
  const std::string name = "say \"hi\" \\ <SA0>1>\t\x01";
  const std::string json = ChromeTrace({Timed(0, 0, 5, {Action(name, "send", 0, 1)})}, 1);
  const Struct trace = ParseTrace(json);
  const std::vector<Struct> slices = Events(trace, "X");
  ASSERT_EQ(slices.size(), 1);
  EXPECT_EQ(Str(slices[0], "name"), name);
  EXPECT_THAT(json, Not(HasSubstr("\t")));
}

// --- GPU telemetry ---

GpuSample Sample(int64_t unix_micros, double sm, double power, uint64_t reasons) {
  GpuSample s;
  s.set_unix_micros(unix_micros);
  s.set_sm_mhz(sm);
  s.set_mem_mhz(3201);
  s.set_power_w(power);
  s.set_power_limit_w(700);
  s.set_temperature_c(70);
  s.set_utilization_percent(100);
  s.set_throttle_reasons(reasons);
  return s;
}

// The step's summary as the worker sends it: the fake samples and their aggregate.
ReportStepRequest WithSamples(ReportStepRequest r, std::vector<GpuSample> samples) {
  StepTelemetry& t = *r.mutable_telemetry();
  double sm = 0, capped = 0;
  t.set_sm_mhz_min(1e9);
  for (const GpuSample& s : samples) {
    sm += s.sm_mhz();
    capped += (s.throttle_reasons() & 0x4) != 0;
    t.set_sm_mhz_min(std::min(t.sm_mhz_min(), s.sm_mhz()));
    t.set_power_w_mean(s.power_w());
    t.set_power_limit_w(700);
    t.set_temperature_c_max(70);
    t.set_throttle_reasons_seen(t.throttle_reasons_seen() | s.throttle_reasons());
    *t.add_raw() = s;
  }
  t.set_samples(static_cast<int>(samples.size()));
  t.set_sm_mhz_mean(sm / samples.size());
  t.set_power_capped_fraction(capped / samples.size());
  t.set_throttled_fraction(capped / samples.size());
  return r;
}

constexpr int64_t kT0 = 1700000000000000;

std::vector<ReportStepRequest> TwoGpuTrace() {
  return {
      WithSamples(Timed(0, 0, kT0 + 100, {Action("F0", "forward", 0, 2)}),
                  {Sample(kT0, 1750, 700, 0x4), Sample(kT0 + 100000, 1760, 699, 0x4)}),
      WithSamples(Timed(1, 0, kT0 + 1000, {Action("F0", "forward", 0, 2)}), {Sample(kT0 + 50000, 1840, 650, 0)}),
  };
}

TEST(ChromeTrace, GpuSamples_CounterTracksPerRankAreValidJson) {
  const std::string json = ChromeTrace(TwoGpuTrace(), 2);
  const Struct trace = ParseTrace(json);
  const std::vector<Struct> counters = Events(trace, "C");
  ASSERT_EQ(counters.size(), 3 * GpuCounterNames().size());
  std::map<std::pair<int, std::string>, std::vector<const Struct*>> tracks;
  for (const Struct& c : counters) tracks[{static_cast<int>(Num(c, "pid")), Str(c, "name")}].push_back(&c);
  for (const std::string& name : GpuCounterNames()) {
    EXPECT_EQ((tracks[{0, name}].size()), 2u) << name;
    EXPECT_EQ((tracks[{1, name}].size()), 1u) << name;
  }
  // Time zero is the earliest sample (before rank 0's first step starts); values in their units.
  const std::vector<const Struct*>& sm0 = tracks[{0, "GPU SM clock"}];
  EXPECT_THAT(Num(*sm0[0], "ts"), DoubleNear(0, 1e-6));
  EXPECT_THAT(Num(*sm0[1], "ts"), DoubleNear(100000, 1e-6));
  EXPECT_EQ(Num(sm0[0]->fields().at("args").struct_value(), "MHz"), 1750);
  const Struct& throttle = tracks[{0, "GPU throttle"}][0]->fields().at("args").struct_value();
  EXPECT_EQ(Num(throttle, "power_cap"), 1);
  EXPECT_EQ(Num(throttle, "thermal"), 0);
  EXPECT_EQ(Num(tracks[{1, "GPU power"}][0]->fields().at("args").struct_value(), "W"), 650);
  // The action slices moved with the origin: rank 0's F0 starts 100 us after the first sample.
  const std::vector<Struct> slices = Events(trace, "X");
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_THAT(Num(slices[0], "ts"), DoubleNear(100, 1e-6));
}

TEST(ChromeTrace, NoTelemetry_NoCounters) {
  EXPECT_THAT(Events(ParseTrace(ChromeTrace(TwoRankTrace(), 2)), "C"), IsEmpty());
}

TEST(BuildReport, GpuTelemetry_PerRankSummaryAndHealth) {
  ReportInput in;
  in.job = Gpt(256, 64, 2, 16, 4);
  in.steps = TwoGpuTrace();
  in.hosts = {"h", "h"};
  GpuHealth h;
  h.set_available(true);
  h.set_uuid("GPU-a");
  in.health = {h, GpuHealth()};
  const RunReport r = BuildReport(in);
  ASSERT_EQ(r.ranks_size(), 2);
  ASSERT_TRUE(r.ranks(0).has_telemetry());
  EXPECT_EQ(r.ranks(0).telemetry().samples(), 2);
  EXPECT_DOUBLE_EQ(r.ranks(0).telemetry().sm_mhz_mean(), 1755);
  EXPECT_DOUBLE_EQ(r.ranks(0).telemetry().power_capped_fraction(), 1);
  EXPECT_EQ(r.ranks(0).telemetry().raw_size(), 0);  // the samples stay in trace.json
  EXPECT_DOUBLE_EQ(r.ranks(1).telemetry().sm_mhz_mean(), 1840);
  EXPECT_EQ(r.ranks(0).health().uuid(), "GPU-a");
  EXPECT_FALSE(r.ranks(1).has_health());
  const absl::StatusOr<std::string> json = ReportJson(r);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(*json, HasSubstr("\"sm_mhz_mean\""));
}

TEST(BuildReport, CpuRun_NoTelemetryInReportJson) {
  const RunReport r = BuildReport(TwoRankRun());
  for (const RankReport& rank : r.ranks()) EXPECT_FALSE(rank.has_telemetry());
  const absl::StatusOr<std::string> json = ReportJson(r);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(*json, Not(HasSubstr("telemetry")));
  EXPECT_THAT(*json, Not(HasSubstr("\"health\": {")));  // the job's health: "" is a JobSpec field
  EXPECT_EQ(GpuSummaryLine(r), "");
}

RankReport GpuRank(int rank, double busy_ms, double sm, double capped) {
  RankReport r;
  r.set_rank(rank);
  r.set_forward_ms(busy_ms);
  StepTelemetry& t = *r.mutable_telemetry();
  t.set_samples(50);
  t.set_sm_mhz_mean(sm);
  t.set_sm_mhz_min(sm - 50);
  t.set_power_w_mean(695);
  t.set_power_limit_w(700);
  t.set_temperature_c_max(68);
  t.set_power_capped_fraction(capped);
  t.set_throttled_fraction(capped);
  t.set_throttle_reasons_seen(capped > 0 ? 0x4 : 0);
  return r;
}

TEST(GpuSummaryLine, TwoRanks_NamesTheSlowestAndWhy) {
  RunReport report;
  *report.add_ranks() = GpuRank(0, 510, 1752, 0.38);
  *report.add_ranks() = GpuRank(1, 480, 1841, 0);
  EXPECT_EQ(GpuSummaryLine(report),
            "rank 0 is the slowest (510.0 ms of compute per step): power-capped 38% of the time, SM clock 1752 MHz "
            "mean vs rank 1's 1841 MHz; 695 W mean of 700 W, 68 C max");
}

TEST(GpuSummaryLine, OneRankNotThrottled) {
  RunReport report;
  *report.add_ranks() = GpuRank(0, 0, 1980, 0);  // timing off: no compute figure
  EXPECT_EQ(GpuSummaryLine(report),
            "rank 0: not throttled, SM clock 1980 MHz mean (1930 min); 695 W mean of 700 W, 68 C max");
}

TEST(GpuSummaryLine, NoTiming_LowestClockIsTheSlowest) {
  RunReport report;
  *report.add_ranks() = GpuRank(0, 0, 1900, 0);
  *report.add_ranks() = GpuRank(1, 0, 1700, 0.5);
  EXPECT_THAT(GpuSummaryLine(report), HasSubstr("rank 1 is the slowest: power-capped 50% of the time"));
}

TEST(PredictedVsMeasuredLines, TwoRanks_EachBesideItsMeasuredComputeAndClock) {
  RunReport report;
  *report.add_ranks() = GpuRank(0, 421, 1752, 0.38);
  report.mutable_ranks(0)->set_predicted_compute_ms(412);
  report.mutable_ranks(0)->set_planned_sm_mhz(1760);
  *report.add_ranks() = GpuRank(1, 400, 1841, 0);
  report.mutable_ranks(1)->set_predicted_compute_ms(410);
  EXPECT_THAT(
      PredictedVsMeasuredLines(report),
      testing::ElementsAre("rank 0: predicted 412.0 ms, measured 421.0 ms (+2.2%) of forward + backward per step, SM "
                           "clock 1752 MHz mean vs rank 1's 1841 MHz (the partition weighed it at 1760 MHz)",
                           "rank 1: predicted 410.0 ms, measured 400.0 ms (-2.4%) of forward + backward per step, SM "
                           "clock 1841 MHz mean vs rank 0's 1752 MHz (clock-blind partition)"));
}

TEST(PredictedVsMeasuredLines, NoPredictionOrNoTiming_NoLine) {
  RunReport report;
  *report.add_ranks() = GpuRank(0, 421, 1752, 0);  // no prediction (a one-stage job without a profile)
  *report.add_ranks() = GpuRank(1, 0, 1841, 0);    // timing off
  report.mutable_ranks(1)->set_predicted_compute_ms(410);
  EXPECT_TRUE(PredictedVsMeasuredLines(report).empty());
}

TEST(BuildReport, PartitionPredictions_PerRankInReportJson) {
  ReportInput in = TwoRankRun();
  in.predicted_compute_ms = {12.5, 11.25};
  in.planned_sm_mhz = {0, 0};
  const RunReport r = BuildReport(in);
  ASSERT_EQ(r.ranks_size(), 2);
  EXPECT_DOUBLE_EQ(r.ranks(0).predicted_compute_ms(), 12.5);
  EXPECT_DOUBLE_EQ(r.ranks(1).predicted_compute_ms(), 11.25);
  const absl::StatusOr<std::string> json = ReportJson(r);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(*json, HasSubstr("\"predicted_compute_ms\": 12.5"));
  EXPECT_TRUE(PredictedVsMeasuredLines(r).empty());  // CPU ranks: no GPU line
}

TEST(FlopsText, ChoosesTheUnitByMagnitude) {
  EXPECT_EQ(FlopsText(312.44), "312.4 TFLOP/s");
  EXPECT_EQ(FlopsText(1.0), "1.0 TFLOP/s");
  EXPECT_EQ(FlopsText(0.0417), "41.7 GFLOP/s");  // a CPU worker: not "0.0 TFLOP/s"
  EXPECT_EQ(FlopsText(0.001), "1.0 GFLOP/s");
  EXPECT_EQ(FlopsText(0.000512), "512.0 MFLOP/s");
  EXPECT_EQ(FlopsText(0), "0 FLOP/s");
}

TEST(SecondsText, ThreeSignificantDigitsWithoutAnExponent) {
  EXPECT_EQ(SecondsText(0.94), "0.940");
  EXPECT_EQ(SecondsText(0.044), "0.0440");
  EXPECT_EQ(SecondsText(12.345), "12.3");
  EXPECT_EQ(SecondsText(0.0000797), "0.0000797");  // not "0.0000"
  EXPECT_EQ(SecondsText(1234.4), "1234");
}

RunReport ModelRun(const std::string& device, double step_seconds, double tflops) {
  RunReport r;
  r.mutable_job()->set_device(device);
  r.set_step_seconds(step_seconds);
  r.set_tokens_per_second(1000);
  r.set_tflops(tflops);
  r.set_warmup_steps(3);
  r.add_ranks();
  return r;
}

// A 1-worker sweep point on CPU printed "predicted 0.0000 s/step (from the model's estimate),
// measured 0.9400 s/step (+1179263%)" and "0.0 TFLOP/s".
TEST(SummaryLines, CpuWithTheFamilysEstimate_NoPredictionAndGflops) {
  RunReport r = ModelRun("cpu", 0.94, 0.0000417);
  r.set_predicted_step_seconds(0.0000797);
  r.set_predicted_from("estimate");
  EXPECT_EQ(SummaryLines(r, false), "stagehand: 0.9400 s/step  1000 tokens/s  41.7 MFLOP/s (after 3 warm-up steps)\n");
  r.set_tflops(0.0123);
  EXPECT_THAT(SummaryLines(r, false), HasSubstr("12.3 GFLOP/s"));
  EXPECT_THAT(SummaryLines(r, false), Not(HasSubstr("predicted")));
}

// A family of the user's has no FLOP count: "0.0 TFLOP/s  MFU 0.0%" said it ran at zero.
TEST(SummaryLines, NoFlopCount_NoFlopsNorMfu) {
  RunReport r = ModelRun("cuda", 0.0131, 0);
  EXPECT_EQ(SummaryLines(r, false), "stagehand: 0.0131 s/step  1000 tokens/s (after 3 warm-up steps)\n");
}

TEST(SummaryLines, ProfiledPredictionWithinThreeTimes_PercentAndBubbles) {
  RunReport r = ModelRun("cpu", 0.11, 0.02);
  r.set_predicted_step_seconds(0.1);
  r.set_predicted_from("profile");
  r.mutable_ranks(0)->set_bubble_fraction(0.25);
  r.mutable_ranks(0)->set_predicted_bubble_fraction(0.2);
  EXPECT_EQ(SummaryLines(r, true),
            "stagehand: 0.1100 s/step  1000 tokens/s  20.0 GFLOP/s  bubble 25.0% (after 3 warm-up steps)\n"
            "stagehand: predicted 0.100 s/step (from the measured profile), measured 0.110 s/step (+10%); bubble "
            "per rank predicted 20.0%, measured 25.0%\n");
}

TEST(SummaryLines, PredictionMissedByThreeTimesOrMore_SaysSoInWords) {
  RunReport r = ModelRun("cuda", 0.94, 300);
  r.set_mfu(0.3);
  r.set_predicted_step_seconds(0.044);
  r.set_predicted_from("estimate");
  EXPECT_THAT(
      SummaryLines(r, false),
      HasSubstr("\nstagehand: measured 0.940 s/step, 21x the predicted 0.0440 s (from the model's estimate)\n"));
  EXPECT_THAT(SummaryLines(r, false), HasSubstr("300.0 TFLOP/s  MFU 30.0%"));
  r.set_step_seconds(0.01);
  r.set_predicted_step_seconds(0.05);
  EXPECT_THAT(SummaryLines(r, false),
              HasSubstr("stagehand: measured 0.0100 s/step, 5.0x faster than the predicted 0.0500 s (from the "
                        "model's estimate)\n"));
}

TEST(EndLine, Success_SingularAndPlural) {
  EXPECT_EQ(EndLine({0, "", 1, 1, 1, 0.5, "runs/a"}),
            "stagehand: done: 1 worker, 1 step in 0.50 s; run directory runs/a\n");
  EXPECT_EQ(EndLine({0, "", 10, 10, 2, 2.1, "runs/a"}),
            "stagehand: done: 2 workers, 10 steps in 2.10 s; run directory runs/a\n");
}

// Ctrl-C printed "FAILED (exit 130): interrupted by SIGINT" (after a "failed at the marked action"
// diagram): a stop by a signal is no failure.
TEST(EndLine, StoppedBySignal_SaysSoWithoutFailed) {
  EXPECT_EQ(EndLine({130, "interrupted by SIGINT", 3, 200, 2, 1, "D"}),
            "stagehand: stopped by SIGINT (exit 130); 3 of 200 steps done; run directory D\n");
  EXPECT_EQ(EndLine({143, "interrupted by SIGTERM", 3, 200, 2, 1, "D"}),
            "stagehand: stopped by SIGTERM (exit 143); 3 of 200 steps done; run directory D\n");
  EXPECT_EQ(EndLine({143, "interrupted by SIGHUP (handled as SIGTERM)", 0, 1, 2, 1, "D"}),
            "stagehand: stopped by SIGHUP (handled as SIGTERM; exit 143); 0 of 1 step done; run directory D\n");
  EXPECT_EQ(EndLine({143, "interrupted by SIGTERM; no complete checkpoint after step 4", 3, 9, 2, 1, "D"}),
            "stagehand: stopped by SIGTERM (exit 143); no complete checkpoint after step 4; 3 of 9 steps done; run "
            "directory D\n");
  EXPECT_EQ(EndLine({130, "interrupted by SIGINT before every node joined", 0, 9, 2, 1, "D"}),
            "stagehand: stopped by SIGINT (exit 130) before every node joined; 0 of 9 steps done; run directory D\n");
  EXPECT_TRUE(StoppedBySignal(130));
  EXPECT_TRUE(StoppedBySignal(143));
  EXPECT_FALSE(StoppedBySignal(1));
  EXPECT_FALSE(StoppedBySignal(75));
}

TEST(EndLine, FailureAndCheckpointedStop) {
  EXPECT_EQ(EndLine({1, "rank 0 (pid 7) exited with code 1 after 0 steps", 0, 10, 1, 1, "D"}),
            "stagehand: FAILED (exit 1): rank 0 (pid 7) exited with code 1 after 0 steps; 0 of 10 steps done; run "
            "directory D\n");
  EXPECT_EQ(EndLine({75, "stopped by SIGTERM after a checkpoint at step 6", 6, 12, 2, 1, "D"}),
            "stagehand: stopped (exit 75): stopped by SIGTERM after a checkpoint at step 6 of 12; continue with "
            "--resume=D\n");
}

}  // namespace
}  // namespace stagehand
