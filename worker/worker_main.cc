// The worker process's main (see worker_main.h): reads the job secret from the launcher, brings up its
// device, registers with the coordinator, sets up its transport and runs its job while its Agent
// (agent.h) heartbeats and aborts the transport as soon as the job stops. Started by the launcher, not
// by hand. The flags are defined here, in the library, because every worker binary shares this main.
//
// Exit codes: 0 done; 1 failed (reported to the coordinator); 3 stopped by the coordinator;
// 4 lost the coordinator.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/host.h"
#include "common/job_option.h"
#include "common/worker_contract.h"
#include "models/model_description.h"
#include "models/model_family.h"
#include "telemetry/clock_model.h"
#include "telemetry/nvml_monitor.h"
#include "telemetry/sampler.h"
#include "transport/cpu_transport.h"
#include "transport/nccl_transport.h"
#include "worker/agent.h"
#include "worker/coordinator_client.h"
#include "worker/device.h"
#include "worker/pipeline.h"
#include "worker/profile_cache.h"
#include "worker/torch_jobs.h"
#include "worker/worker_main.h"
// Last: LibTorch's c10 logging (through worker/pipeline.h) defines LOG and CHECK too, and the later
// definition wins; with c10's, this file's LOG(INFO) lines would be dropped (below its default level).
#include "common/logging.h"

ABSL_FLAG(std::string, coordinator, "", "HOST:PORT of the coordinator");
ABSL_FLAG(std::string, job_id, "", "the job this worker belongs to");
ABSL_FLAG(int, worker_index, -1, "this worker's slot in the job, 0-based");
ABSL_FLAG(int64_t, incarnation, 1, "increases each time the slot's worker is restarted");
ABSL_FLAG(std::string, listen_host, "127.0.0.1",
          "the address of this host that the CPU transport listens on and advertises to the other ranks (a job of "
          "several hosts: the host's address as the coordinator sees it)");
ABSL_FLAG(std::string, run_dir, "",
          "where this worker writes its own files (its parameters) when they do not go into the job's run "
          "directory: an agent's on a host other than node 0's (the checkpoints stay in node 0's)");
ABSL_FLAG(std::string, tls_ca, "", "TLS to the coordinator: the CA that signed its certificate (PEM)");
ABSL_FLAG(std::string, tls_cert, "", "mutual TLS to the coordinator: this worker's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS to the coordinator: the key of --tls_cert (PEM)");

namespace stagehand {
namespace {

// GPU jobs sample their GPU unless the job says telemetry: false. A GPU NVML cannot read (no driver
// library, an old driver) runs without telemetry, with one line in the log.
std::unique_ptr<TelemetrySampler> StartTelemetry(const JobSpec& job, const std::string& uuid) {
  if (job.device() != "cuda" || (job.has_telemetry() && !job.telemetry())) return nullptr;
  absl::StatusOr<std::unique_ptr<GpuMonitor>> monitor = OpenNvmlMonitor(uuid);
  if (!monitor.ok()) {
    LOG(WARNING) << "no GPU telemetry: " << monitor.status().message();
    return nullptr;
  }
  return std::make_unique<TelemetrySampler>(*std::move(monitor));
}

// What a worker registers with: its layer profile, and its GPU's sustained SM clock under load in its
// last run of this job (unset: none recorded).
struct RegisteredProfile {
  LayerProfile profile;
  LoadClock load_clock;
};

// The profile this worker registers with: measured (ProfileModel) only where the planner has a
// partition to choose, and then read from the cache when an earlier run on this kind of device
// measured the same model at the same micro-batch. GPU jobs with telemetry sample the GPU while the
// profile runs: its clock goes with the costs (and into the cache with them). The profile's bursts run
// at boost clocks; what the GPU sustains under the job's load is its last run's clock, kept beside
// the cache (KeepRunClock), sent with either profile where there is one.
absl::StatusOr<RegisteredProfile> WorkerProfile(const JobSpec& job, const DeviceInfo& device,
                                                const std::function<void()>& before_measuring) {
  const absl::Time start = absl::Now();
  if (!ProfileChoosesPartition(job) && !(job.pipeline().partition() == "auto" && job.profile_single_stage())) {
    absl::StatusOr<LayerProfile> layers = DescribeLayers(job);
    if (!layers.ok()) return layers.status();
    return RegisteredProfile{*std::move(layers), {}};
  }
  const bool cached = BoolOption(job, JobSpec::kProfileCacheFieldNumber);
  const std::string dir = cached ? DefaultProfileCacheDir() : "";
  const std::string key = ProfileCacheKey(job, device);
  if (cached) {
    if (std::optional<LayerProfile> p = ReadCachedProfile(dir, key)) {
      LOG(INFO) << "profile: from the cache in " << dir << " (--profile_cache=false measures it again)";
      RegisteredProfile out{*std::move(p), {}};
      if (std::optional<LoadClock> c = ReadGpuClock(dir, key, device.uuid())) out.load_clock = *c;
      return out;
    }
  }
  before_measuring();
  std::unique_ptr<TelemetrySampler> sampler = StartTelemetry(job, device.uuid());
  absl::StatusOr<LayerProfile> p = ProfileModel(job);
  if (!p.ok()) return p.status();
  if (sampler) {
    const StepTelemetry t = sampler->TakeStep();
    *p->mutable_clock() = BusyClock({t.raw().begin(), t.raw().end()}, "profile");
    sampler.reset();
  }
  LOG(INFO) << "profile: measured in " << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
            << (p->clock().samples() > 0 ? absl::StrFormat(" at %.0f MHz SM clock (%d samples under load)",
                                                           p->clock().sm_mhz(), p->clock().samples())
                                         : std::string());
  if (cached) {
    if (absl::Status s = WriteCachedProfile(dir, key, *p); !s.ok()) LOG(WARNING) << "profile cache: " << s.message();
  }
  RegisteredProfile out{*std::move(p), {}};
  if (cached) {
    if (std::optional<LoadClock> c = ReadGpuClock(dir, key, device.uuid())) out.load_clock = *c;
  }
  return out;
}

absl::StatusOr<std::string> ReadSecret() {
  const char* fd_text = std::getenv(kSecretFdEnv);
  int fd = -1;
  if (fd_text == nullptr || !absl::SimpleAtoi(fd_text, &fd)) {
    return absl::FailedPreconditionError("no job secret: workers are started by the launcher");
  }
  std::string secret;
  char buf[256];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::FailedPreconditionError(absl::StrCat("reading the job secret: ", std::strerror(errno)));
    if (n == 0) break;
    secret.append(buf, n);
  }
  close(fd);
  unsetenv(kSecretFdEnv);
  return secret;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const Assignment& a, CoordinatorClient& client,
                                                         const std::string& secret) {
  const std::string prefix = absl::StrCat(a.job_id(), "/world");
  const absl::Duration timeout = absl::Milliseconds(a.job().timeouts().nccl_init_ms());
  if (a.job().device() == "cuda") {
    NcclTransportOptions o;
    o.rank = a.rank();
    o.world_size = a.world_size();
    o.key_prefix = prefix;
    o.init_timeout = timeout;
    o.stream = IsModelJob(a.job()) ? PipelineCommStream() : CurrentCudaStream();
    // A posted receive holds its thread blocks on their SMs until the data comes, beside the compute.
    // Inference posts every receive of the step early: at most 8 blocks each made gpt-1.3b's 16
    // micro-batches 3.7% faster on 2 x H200 (0.1879 -> 0.1810 s); training was unchanged, so NCCL
    // chooses there (bench/results/pipeline-gpt-1.3b-h200x2-2026-11-30.md).
    if (a.job().pipeline().inference()) o.max_ctas = 8;
    return ConnectNcclTransport(o, client);
  }
  CpuTransportOptions o;
  o.rank = a.rank();
  o.world_size = a.world_size();
  o.key_prefix = prefix;
  o.connect_timeout = timeout;
  o.secret = secret;  // every connection proves it: a stranger on the port is dropped
  o.listen_host = absl::GetFlag(FLAGS_listen_host);
  return ConnectCpuTransport(o, client);
}

struct Run {
  CoordinatorClient* client;
  Assignment assignment;
  int64_t incarnation;                        // on every report: the coordinator refuses a replaced worker's
  std::unique_ptr<Agent> agent;               // heartbeats and watches for the stop while the job runs
  std::string gpu_uuid;                       // GPU jobs: this worker's GPU, for NVML
  std::unique_ptr<TelemetrySampler> sampler;  // GPU jobs with telemetry: samples on its own thread
  // The GPU's clock under load over the steps after the first, kept in the profile cache under this
  // key for the next run's clock-aware partition ("" : not kept).
  std::string clock_dir, clock_key;
  LoadClock run_clock;
  std::function<void()> before_first_step;  // RunPipeline's PipelineContext::before_first_step
  std::string local_dir;                    // --run_dir: this host's, for its files (PipelineContext)
};

void ReportMilestone(const Run& run, Milestone milestone, absl::Time when) {
  ReportMilestoneRequest r;
  r.set_rank(run.assignment.rank());
  r.set_incarnation(run.incarnation);
  r.set_milestone(milestone);
  r.set_unix_micros(absl::ToUnixMicros(when));
  (void)run.client->ReportMilestone(r);  // the ledger is for the record: the job goes on without it
}

ReportStepRequest StepRequest(const Run& run, int64_t step) {
  ReportStepRequest r;
  r.set_rank(run.assignment.rank());
  r.set_incarnation(run.incarnation);
  r.set_step(step);
  if (run.sampler) *r.mutable_telemetry() = run.sampler->TakeStep();
  return r;
}

absl::Status RunModel(Run& run, Transport* transport) {
  const Assignment& a = run.assignment;
  LOG(INFO) << "stage " << a.stage() << " of " << a.num_stages() << ": pipeline layers [" << a.first_layer() << ", "
            << a.last_layer() << ") (" << a.plan() << ")";
  bool first = true;  // a resumed run's first step is not step 0
  return RunPipeline(
      a, a.world_size() > 1 ? transport : nullptr,
      [&](const StepResult& r) {
        if (first) ReportMilestone(run, MILESTONE_FIRST_STEP, absl::Now());
        first = false;
        run.agent->SetSteps(r.step + 1);
        ReportStepRequest req = StepRequest(run, r.step);
        // Step 0 captures CUDA graphs and warms up: not the clock the run sustains.
        if (r.step > 0 && req.has_telemetry()) {
          const auto& raw = req.telemetry().raw();
          run.run_clock = CombineClocks(run.run_clock, BusyClock({raw.begin(), raw.end()}, "last run"));
        }
        req.set_has_loss(r.has_loss);
        req.set_loss(r.loss);
        req.set_step_seconds(r.seconds);
        req.set_tokens(r.tokens);
        req.set_peak_memory_bytes(r.peak_memory_bytes);
        *req.mutable_timing() = r.timing;
        req.set_has_val_loss(r.has_val_loss);
        req.set_val_loss(r.val_loss);
        req.set_parameters(r.parameters);
        absl::StatusOr<ReportStepResponse> answer = run.client->ReportStep(req);
        if (!answer.ok()) return absl::StatusOr<StepAnswer>(answer.status());
        return absl::StatusOr<StepAnswer>(StepAnswer{answer->checkpoint_and_stop_at()});
      },
      PipelineContext{run.client, run.incarnation, run.before_first_step, run.local_dir});
}

// After a model run that went well: its clock under load, for the next run's partition.
void KeepRunClock(const Run& run, const absl::Status& status) {
  if (!status.ok() || run.clock_key.empty() || run.run_clock.samples() <= 0) return;
  if (absl::Status s = WriteGpuClock(run.clock_dir, run.clock_key, run.gpu_uuid, run.run_clock); !s.ok()) {
    LOG(WARNING) << "profile cache: " << s.message();
    return;
  }
  LOG(INFO) << absl::StrFormat("GPU clock under load this run: %.0f MHz (%d samples), kept for the next partition",
                               run.run_clock.sm_mhz(), run.run_clock.samples());
}

absl::Status RunJob(Run& run, absl::Time cuda_ready, const std::string& secret) {
  const Assignment& a = run.assignment;
  CoordinatorClient& client = *run.client;
  ReportMilestone(run, MILESTONE_CUDA_READY, cuda_ready);
  if (IsModelJob(a.job()) && a.world_size() == 1) {
    // A one-rank pipeline sends nothing: no communicator (NCCL's init took 0.3 s of the launch on an H200).
    ReportMilestone(run, MILESTONE_NCCL_READY, absl::Now());
    run.sampler = StartTelemetry(a.job(), run.gpu_uuid);
    absl::Status s = RunModel(run, nullptr);
    run.sampler.reset();
    KeepRunClock(run, s);
    return s;
  }
  absl::StatusOr<std::unique_ptr<Transport>> transport = MakeTransport(a, client, secret);
  if (!transport.ok()) return transport.status();
  run.agent->SetTransport(transport->get());
  ReportMilestone(run, MILESTONE_NCCL_READY, absl::Now());
  // Started after the communicators, so that the first step's samples are of the run, not of setup.
  run.sampler = StartTelemetry(a.job(), run.gpu_uuid);
  absl::Status s = IsModelJob(a.job()) ? RunModel(run, transport->get())
                                       : RunAllReduceJob(a, **transport, [&](int64_t step, double secs) {
                                           if (step == 0) ReportMilestone(run, MILESTONE_FIRST_STEP, absl::Now());
                                           run.agent->SetSteps(step + 1);
                                           ReportStepRequest r = StepRequest(run, step);
                                           r.set_step_seconds(secs);
                                           return client.ReportStep(r).status();
                                         });
  run.agent->SetTransport(nullptr);
  run.sampler.reset();
  if (IsModelJob(a.job())) KeepRunClock(run, s);
  return s;
}

int Main() {
  const int index = absl::GetFlag(FLAGS_worker_index);
  SetLogTag(absl::StrCat("w", index));
  absl::StatusOr<std::string> secret = ReadSecret();
  if (!secret.ok()) {
    LOG(ERROR) << secret.status().message();
    return kWorkerExitFailed;
  }
  ClientTlsFiles tls{absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)};
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> connection =
      ConnectCoordinator(absl::GetFlag(FLAGS_coordinator), *secret, tls);
  if (!connection.ok()) {
    LOG(ERROR) << connection.status().message();
    return kWorkerExitFailed;
  }
  CoordinatorClient& client = **connection;
  absl::StatusOr<GetJobResponse> job = client.GetJob(absl::Seconds(60));
  if (!job.ok()) {
    LOG(ERROR) << job.status().ToString();
    return kWorkerExitFailed;
  }
  const bool cuda = job->job().device() == "cuda";
  absl::StatusOr<DeviceInfo> device = cuda ? InitCudaDevice() : CpuDeviceInfo();
  const absl::Time cuda_ready = absl::Now();
  // The health gate's readings, taken at rest: before the profile below warms the GPU up.
  std::optional<GpuHealth> health;
  if (cuda && device.ok() && job->job().health() != "off") health = ReadGpuHealth(device->uuid());
  // cuDNN's attention kernels, built on threads of their own beside the rest of the startup (on a
  // machine whose driver has not cached them yet, their JIT is seconds of step 0); finished before the
  // profile measures and before step 0.
  std::unique_ptr<AttentionPrebuild> prebuild = cuda && device.ok() ? StartAttentionPrebuild(job->job()) : nullptr;
  const std::function<void()> finish_prebuild = [&prebuild] {
    if (!prebuild) return;
    if (const std::string line = prebuild->Finish(); !line.empty()) LOG(INFO) << line;
  };
  // The planner partitions by what every worker measured on its own device.
  absl::StatusOr<RegisteredProfile> profile = RegisteredProfile();
  if (device.ok() && IsModelJob(job->job())) {
    profile = WorkerProfile(job->job(), *device, finish_prebuild);
    if (!profile.ok()) {
      // Registering without a profile would make the partition fail with a message about memory
      // instead of this one.
      LOG(ERROR) << "profiling the model on this worker's device failed: " << profile.status().ToString();
      return kWorkerExitFailed;
    }
  }
  RegisterRequest req;
  req.set_job_id(absl::GetFlag(FLAGS_job_id));
  req.set_worker_index(index);
  req.set_incarnation(absl::GetFlag(FLAGS_incarnation));
  req.set_host(HostName());
  req.set_pid(getpid());
  if (device.ok()) *req.mutable_device() = *device;
  if (profile.ok()) {
    *req.mutable_profile() = profile->profile;
    if (profile->load_clock.samples() > 0) *req.mutable_load_clock() = profile->load_clock;
  }
  if (health) *req.mutable_health() = *health;
  absl::StatusOr<Assignment> assignment = client.Register(req, absl::InfiniteDuration());
  if (!assignment.ok()) {
    LOG(ERROR) << assignment.status().ToString();
    // FAILED_PRECONDITION and CANCELLED: the job stopped (the health gate, say), not this worker.
    const bool stopped = absl::IsCancelled(assignment.status()) || absl::IsFailedPrecondition(assignment.status());
    return stopped ? kWorkerExitStopped : kWorkerExitFailed;
  }
  Run run{&client, *assignment, req.incarnation(), nullptr, device.ok() ? device->uuid() : "", nullptr};
  run.local_dir = absl::GetFlag(FLAGS_run_dir);  // the job's run directory (node 0's) keeps the checkpoints
  if (cuda && device.ok() && IsModelJob(job->job()) && BoolOption(job->job(), JobSpec::kProfileCacheFieldNumber)) {
    run.clock_dir = DefaultProfileCacheDir();
    if (!run.clock_dir.empty()) run.clock_key = ProfileCacheKey(job->job(), *device);
  }
  run.before_first_step = finish_prebuild;
  run.agent = std::make_unique<Agent>(client, assignment->rank(), req.incarnation(), assignment->job().timeouts());
  absl::Status status = device.ok() ? RunJob(run, cuda_ready, *secret) : device.status();
  if (int code = run.agent->exit_code(); code != 0) {
    LOG(WARNING) << "stopping: " << run.agent->reason();
    return code;
  }
  FinishRequest finish;
  finish.set_rank(assignment->rank());
  finish.set_incarnation(req.incarnation());
  finish.set_ok(status.ok());
  if (auto action = status.GetPayload(kFailedActionPayload)) {
    int index = -1;
    if (absl::SimpleAtoi(std::string(*action), &index)) finish.set_failed_action(index + 1);
    status.ErasePayload(kFailedActionPayload);
  }
  finish.set_error(status.ToString());
  if (!status.ok()) LOG(ERROR) << status.ToString();
  (void)client.Finish(finish);
  return status.ok() ? 0 : kWorkerExitFailed;
}

}  // namespace

// A SIGTERM that is not from this worker's parent (the launcher, or the agent on another host) is
// ignored: Slurm sends one to every process of a step on scancel, preemption or a time limit, and the
// launcher, which gets it too, decides whether the workers first write a checkpoint (it tells them
// through the coordinator). The parent's SIGTERM ends the worker (the default action); SIGKILL always does.
void OnSigterm(int, siginfo_t* info, void*) {
  if (info != nullptr && info->si_pid == getppid()) {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);  // pending until this handler returns, then the default action
    return;
  }
  static const char kLine[] =
      "stagehand worker: ignoring a SIGTERM not sent by the launcher (it decides when the workers stop)\n";
  (void)!write(STDERR_FILENO, kLine, sizeof kLine - 1);
}

void IgnoreForeignSigterm() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = OnSigterm;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

int WorkerMain(int argc, char** argv) {
  IgnoreForeignSigterm();
  absl::SetProgramUsageMessage("stagehand worker: started by the launcher, one per GPU");
  absl::ParseCommandLine(argc, argv);
  return Main();
}

}  // namespace stagehand
