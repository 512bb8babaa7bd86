// The health gate as the coordinator's admission check: a GPU with uncorrected ECC errors stops the job
// when the last worker registers, before any assignment, naming the GPU; warnings are printed.
#include "launcher/plan/health_gate.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJobId[] = "job-1";

JobSpec GpuJob(const std::string& health) {
  JobSpec job;
  job.set_device("cuda");
  job.set_workers(2);
  job.set_steps(1);
  job.set_health(health);
  return job;
}

GpuHealth Healthy(const std::string& uuid) {
  GpuHealth h;
  h.set_available(true);
  h.set_uuid(uuid);
  h.set_name("NVIDIA H200");
  h.set_ecc_uncorrected_volatile(0);
  return h;
}

RegisterRequest Register(int index, const GpuHealth& health) {
  RegisterRequest r;
  r.set_job_id(kJobId);
  r.set_worker_index(index);
  r.set_incarnation(1);
  r.set_pid(1000 + index);
  r.mutable_device()->set_kind(DEVICE_KIND_CUDA);
  r.mutable_device()->set_uuid(health.uuid());
  *r.mutable_health() = health;
  return r;
}

std::vector<absl::StatusOr<Assignment>> RegisterBoth(CoordinatorState& state, const GpuHealth& a, const GpuHealth& b) {
  std::vector<absl::StatusOr<Assignment>> out(2, absl::UnknownError("not run"));
  std::thread t0([&] { out[0] = state.Register(Register(0, a), absl::Now() + absl::Seconds(10)); });
  std::thread t1([&] { out[1] = state.Register(Register(1, b), absl::Now() + absl::Seconds(10)); });
  t0.join();
  t1.join();
  return out;
}

TEST(HealthAdmission, CpuJobOrOff_NoCheck) {
  JobSpec cpu = GpuJob("warn");
  cpu.set_device("cpu");
  EXPECT_EQ(HealthAdmission(cpu), nullptr);
  EXPECT_EQ(HealthAdmission(GpuJob("off")), nullptr);
  EXPECT_NE(HealthAdmission(GpuJob("warn")), nullptr);
}

TEST(HealthAdmission, EccErrors_JobStopsBeforeAssignment) {
  std::vector<std::string> printed;
  CoordinatorState state(GpuJob("warn"), kJobId, "secret");
  state.SetAdmission(HealthAdmission(GpuJob("warn"), [&](const std::string& l) { printed.push_back(l); }));
  GpuHealth bad = Healthy("GPU-b");
  bad.set_ecc_uncorrected_volatile(7);
  const auto results = RegisterBoth(state, Healthy("GPU-a"), bad);
  // The last to register gets the refusal; one already waiting is CANCELLED, as for any stop.
  EXPECT_FALSE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
  ASSERT_TRUE(state.stop_reason().has_value());
  EXPECT_THAT(*state.stop_reason(), HasSubstr("GPU health: rank 1 (GPU-b, NVIDIA H200): 7 uncorrected ECC errors"));
  EXPECT_THAT(printed, ElementsAre(HasSubstr("2 of 2 GPUs read, 1 refused")));
}

TEST(HealthAdmission, ThrottledAtRest_WarnedAndAssigned) {
  std::vector<std::string> printed;
  CoordinatorState state(GpuJob("warn"), kJobId, "secret");
  state.SetAdmission(HealthAdmission(GpuJob("warn"), [&](const std::string& l) { printed.push_back(l); }));
  GpuHealth hot = Healthy("GPU-a");
  hot.set_throttle_reasons(0x40);  // hardware thermal slowdown
  const auto results = RegisterBoth(state, hot, Healthy("GPU-b"));
  EXPECT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_THAT(printed, ElementsAre(HasSubstr("warning: rank 0 (GPU-a, NVIDIA H200): clocks held down at rest"),
                                   HasSubstr("1 warning")));
}

TEST(HealthAdmission, NoReadings_WarnedUnlessStrict) {
  std::vector<std::string> printed;
  CoordinatorState state(GpuJob("strict"), kJobId, "secret");
  state.SetAdmission(HealthAdmission(GpuJob("strict"), [&](const std::string& l) { printed.push_back(l); }));
  GpuHealth none;  // an older worker binary that sends no readings
  none.set_uuid("GPU-b");
  const auto results = RegisterBoth(state, Healthy("GPU-a"), none);
  ASSERT_FALSE(results[0].ok());
  EXPECT_THAT(std::string(results[0].status().message()),
              HasSubstr("rank 1 (GPU-b): not checked: the worker sent no health readings (--health=strict)"));
}

}  // namespace
}  // namespace stagehand
