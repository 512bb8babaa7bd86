// The job's options by reflection: every flag named, described, grouped and ranged from
// protos/job.proto, parsed into JobSpec, and its range checked with the messages job_test expects.
#include "launcher/job/job_options.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "common/flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/job/job.h"
#include "launcher/job/job_flags.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

const JobOption& Flag(const std::string& name) {
  const JobOption* o = FindJobFlag(name);
  EXPECT_NE(o, nullptr) << name;
  return *o;
}

TEST(JobOptionsTest, EveryOptionHasAGroupAndEveryFlagAHelpText) {
  const std::set<std::string> groups = {"job",         "model",   "pipeline", "training",
                                        "checkpoints", "failure", "gpus",     "outputs"};
  std::set<std::string> names;
  for (const JobOption& o : JobOptions()) {
    EXPECT_TRUE(groups.count(o.option->group())) << o.path << ": group \"" << o.option->group() << "\"";
    if (o.flag.empty()) continue;
    EXPECT_FALSE(o.option->help().empty()) << o.path;
    // The help states the declared default of an unset-means-true bool, and no bool claims it otherwise.
    if (o.is_bool()) {
      EXPECT_EQ(o.option->default_true(), absl::StrContains(o.option->help(), "default true")) << o.path;
    }
    EXPECT_TRUE(names.insert(o.flag).second) << "two fields are --" << o.flag;
  }
  // The options of every part of the job are there, under their flag names.
  for (const char* name : {"workers", "steps", "model", "layers", "seq", "micro_batches", "pipeline_stages",
                           "grace_period_ms", "register_timeout_ms", "nccl_init_timeout_ms", "model_option", "lr",
                           "prefetch_libraries", "term_checkpoint_timeout_ms", "device"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  // Job-file fields only: no flag, a range all the same.
  EXPECT_EQ(FindJobFlag("heartbeat_interval_ms"), nullptr);
  EXPECT_EQ(FindJobFlag("norm_eps"), nullptr);
  EXPECT_EQ(FindJobFlag("program"), nullptr);
  EXPECT_EQ(FindJobFlag("name"), nullptr);
}

TEST(JobOptionsTest, RangesAgreeWithTheLaunchersCaps) {
  EXPECT_EQ(Flag("workers").option->max(), kMaxWorkers);
  EXPECT_EQ(Flag("pipeline_stages").option->max(), kMaxWorkers);
  EXPECT_EQ(Flag("data_parallel").option->max(), kMaxWorkers);
  EXPECT_EQ(Flag("seq").option->max(), kMaxSeq);
  EXPECT_EQ(Flag("micro_batches").option->max(), kMaxMicroBatches);
}

TEST(JobOptionsTest, SetsEachTypeIntoItsField) {
  JobSpec s;
  ASSERT_TRUE(SetJobOption(Flag("steps"), "12", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("workers"), "3", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("layers"), "4", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("grace_period_ms"), "250", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("lr"), "0.5", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("timing"), "false", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("schedule"), "gpipe", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("model_option"), "a=1,b=2", s).ok());
  ASSERT_TRUE(SetJobOption(Flag("model-option"), "a=3,c", s).ok());
  EXPECT_EQ(s.steps(), 12);
  EXPECT_EQ(s.workers(), 3);
  EXPECT_EQ(s.model_spec().layers(), 4);
  EXPECT_EQ(s.timeouts().grace_ms(), 250);
  EXPECT_EQ(s.lr(), 0.5);
  EXPECT_TRUE(s.has_timing());
  EXPECT_FALSE(s.timing());
  EXPECT_EQ(s.pipeline().schedule(), "gpipe");
  EXPECT_EQ(s.model_spec().options().at("a"), "3");  // a later pair wins
  EXPECT_EQ(s.model_spec().options().at("b"), "2");
  EXPECT_EQ(s.model_spec().options().at("c"), "");
  EXPECT_TRUE(HasJobOption(Flag("layers"), s));
  EXPECT_FALSE(HasJobOption(Flag("seq"), s));
  EXPECT_FALSE(HasJobOption(Flag("seq"), JobSpec()));  // model_spec unset on the way
}

TEST(JobOptionsTest, RefusesWhatDoesNotParseInOneLine) {
  JobSpec s;
  EXPECT_THAT(std::string(SetJobOption(Flag("steps"), "ten", s).message()), HasSubstr("--steps=ten: not an integer"));
  EXPECT_THAT(std::string(SetJobOption(Flag("workers"), "99999999999", s).message()),
              HasSubstr("--workers=99999999999: not a 32-bit integer"));
  EXPECT_THAT(std::string(SetJobOption(Flag("timing"), "maybe", s).message()),
              HasSubstr("pass --timing=true or --timing=false"));
  EXPECT_THAT(std::string(SetJobOption(Flag("lr"), "nan", s).message()), HasSubstr("--lr=nan: not a finite number"));
  EXPECT_THAT(std::string(SetJobOption(Flag("lr"), "1e999", s).message()), HasSubstr("not a finite number"));
  EXPECT_THAT(std::string(SetJobOption(Flag("model_option"), "=1", s).message()), HasSubstr("KEY=VALUE"));
  EXPECT_EQ(s.ByteSizeLong(), 0u);
}

TEST(JobOptionsTest, RangesNameTheFlagOrTheFieldThatSetIt) {
  JobSpec typed;
  typed.mutable_model_spec()->set_seq(0);
  EXPECT_EQ(std::string(CheckJobOptionRanges(typed, typed, "").message()),
            "--seq=0: out of range; pass --seq=N with 1 <= N <= 131072");
  JobSpec file;
  file.mutable_model_spec()->set_seq(0);
  EXPECT_EQ(std::string(CheckJobOptionRanges(file, JobSpec(), "job.textproto").message()),
            "--job=job.textproto: model_spec.seq: 0 is out of range; write model_spec.seq: N with 1 <= N <= 131072 "
            "(or pass --seq=N)");
  JobSpec lr;
  lr.set_lr(0);
  EXPECT_EQ(std::string(CheckJobOptionRanges(lr, lr, "").message()),
            "--lr=0: out of range; pass --lr=X with 0 < X <= 10");
  JobSpec fraction;
  fraction.set_val_fraction(1);
  EXPECT_THAT(std::string(CheckJobOptionRanges(fraction, fraction, "").message()), HasSubstr("0 <= X < 1"));
  fraction.set_val_fraction(0.999);
  EXPECT_TRUE(CheckJobOptionRanges(fraction, fraction, "").ok());
  JobSpec eps;
  eps.mutable_model_spec()->set_norm_eps(0);
  EXPECT_EQ(std::string(CheckJobOptionRanges(eps, JobSpec(), "f").message()),
            "--job=f: model_spec.norm_eps: 0 is out of range; write model_spec.norm_eps: X with 0 < X <= 1");
  JobSpec edge;  // the bounds themselves are in range
  edge.set_max_restarts(0);
  edge.set_workers(kMaxWorkers);
  edge.mutable_timeouts()->set_grace_ms(600000);
  EXPECT_TRUE(CheckJobOptionRanges(edge, edge, "").ok());
}

TEST(JobOptionsTest, ParseFlagsTakesJobOptionsBesideAbseilsFlags) {
  JobFlags job_flags;
  std::vector<std::string> args = {"launcher", "--steps=5", "--micro-batches",    "4",
                                   "--nofp32", "--timing",  "--model_option=x=y", "--gpus=2"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  absl::StatusOr<ParsedFlags> p = ParseFlags(static_cast<int>(argv.size()), argv.data(), false, &job_flags);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(job_flags.typed().steps(), 5);
  EXPECT_EQ(job_flags.typed().pipeline().micro_batches(), 4);
  EXPECT_TRUE(job_flags.typed().model_spec().has_fp32());
  EXPECT_FALSE(job_flags.typed().model_spec().fp32());
  EXPECT_TRUE(job_flags.typed().timing());
  EXPECT_EQ(p->given, (std::set<std::string>{"steps", "micro_batches", "fp32", "timing", "model_option", "gpus"}));
  const JobRequest r = JobRequestFromFlags(*p, job_flags);
  EXPECT_EQ(r.gpus, 2);
  EXPECT_EQ(r.flags.steps(), 5);

  std::vector<std::string> bad = {"launcher", "--steps"};
  std::vector<char*> bad_argv;
  for (std::string& a : bad) bad_argv.push_back(a.data());
  JobFlags other;
  EXPECT_THAT(std::string(ParseFlags(2, bad_argv.data(), false, &other).status().message()),
              HasSubstr("--steps needs a value"));
}

TEST(JobOptionsTest, HelpListsEveryJobFlagUnderItsTopic) {
  JobFlags job_flags;
  const std::string help = FlagsHelp("usage", {kJobFlagsFile}, HelpGroups(/*client=*/false), &job_flags);
  EXPECT_FALSE(absl::StrContains(help, "Other flags")) << help;
  for (const JobOption& o : JobOptions()) {
    if (!o.flag.empty()) EXPECT_THAT(help, HasSubstr("  --" + o.flag + " (")) << o.flag;
  }
  EXPECT_THAT(help, HasSubstr("  --seq (sequence length (default: the preset's; at most 131072); 1 <= N <= 131072)"));
  EXPECT_THAT(help, HasSubstr("; 0 < X <= 10)"));
  const size_t training = help.find("Training loop:");
  const size_t lr = help.find("  --lr (");
  const size_t checkpoints = help.find("Checkpoints and weights:");
  ASSERT_NE(training, std::string::npos);
  EXPECT_LT(training, lr);
  EXPECT_LT(lr, checkpoints);
}

}  // namespace
}  // namespace stagehand
