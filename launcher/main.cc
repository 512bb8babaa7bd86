// stagehand launcher: `launcher --gpus=N` runs a job with one worker per GPU (or CPU workers), serves
// the coordinator over gRPC and supervises the workers. Flags are defined here only.
#include <signal.h>
#include <unistd.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "launcher/coordinator/coordinator_service.h"
#include "launcher/job/job_flags.h"
#include "launcher/run/launch.h"
#include "launcher/supervise/process.h"
#include "launcher/serve/serve.h"
#include "launcher/multihost/slurm.h"
#include "launcher/supervise/supervisor.h"
#include "launcher/supervise/terminal.h"

ABSL_FLAG(std::string, run_dir, "",
          "where logs and reports go, a new or empty directory (default: the job "
          "file's run_dir, else runs/<time>-<name>-<job id>)");
ABSL_FLAG(bool, overwrite, false,
          "replace the earlier run in a non-empty --run_dir (only files a run writes are removed)");
ABSL_FLAG(std::string, coordinator_address, "127.0.0.1:0",
          "HOST:PORT the coordinator serves on, HOST a loopback address (127.0.0.0/8, [::1]) or a name resolving only "
          "to one; port 0 picks one");
ABSL_FLAG(std::string, worker_binary, "", "the worker executable (default: beside the launcher)");
ABSL_FLAG(std::string, sweep, "",
          "run the job at each worker count, e.g. 1,2,4, and write sweep.csv, sweep.md and "
          "sweep.svg in the run directory");
ABSL_FLAG(double, peak_tflops, 989.0, "peak TFLOP/s of one device, for MFU (dense bf16 of an H100/H200)");
ABSL_FLAG(bool, serve, false,
          "serve the control service on --listen: clients (bazel run //client) submit, watch and cancel "
          "jobs, queued for their devices and kept in --state_dir across restarts");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "with --serve: HOST:PORT of the control service; a non-loopback HOST needs --tls_cert and --tls_key");
ABSL_FLAG(std::string, state_dir, "",
          "with --serve: the job store (jobs.db), admin.token and the jobs' run directories");
ABSL_FLAG(std::string, tls_cert, "",
          "this host's certificate (PEM): the server's with --serve; with --nodes or a non-loopback "
          "--coordinator_address, the job's certificate of this host (mutual TLS with --tls_key and --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "the private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "",
          "the CA that signed every host's certificate of the job (PEM): the coordinator requires client "
          "certificates it signed, and agents and workers check the coordinator's against it");
ABSL_FLAG(int, nodes, 1,
          "hosts the job spans: one launcher per host, ranks node-major; --gpus and --workers "
          "count the host's own workers");
ABSL_FLAG(int, node_rank, 0,
          "this host's node, 0 to --nodes - 1: 0 coordinates (serving at --coordinator_address) "
          "and runs its workers; any other is an agent that joins node 0 at --coordinator_address");
ABSL_FLAG(std::string, job_token_file, "",
          "a file holding the job secret (32 or more characters, mode 0600), the same on every node: how agents "
          "prove themselves to node 0 without TLS (loopback)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "with --serve: mutual TLS, clients must present a certificate signed by this CA (PEM)");
ABSL_FLAG(bool, new_admin_token, false,
          "with --serve: mint another admin token into --state_dir/admin.token (when the first is lost); earlier "
          "admin tokens stay valid until revoked");
ABSL_FLAG(bool, allow_commands, false,
          "with --serve: run commands clients submit (`client submit -- PROGRAM ARGS`) on this host, as this "
          "user, in this directory: every token that may submit (submit, admin) becomes a shell here; off, they "
          "are refused");
ABSL_FLAG(int, max_cpu_workers, 0, "with --serve: CPU workers running at once over all jobs (default: the cores)");
ABSL_FLAG(std::string, job_roots, "",
          "with --serve: comma-separated directories a job's paths (--data, --layout_profiles, --init_from, "
          "--resume, --export_dir) must lie in (default: --state_dir/runs and --state_dir/data)");
ABSL_FLAG(bool, version, false, "print the version and the coordinator protocol version, and exit");
// ---- Slurm (launcher/multihost/slurm.h) ----
ABSL_FLAG(bool, slurm, false,
          "take the node count, node rank, coordinator host and this node's GPUs from the Slurm job step "
          "(srun --ntasks-per-node=1 launcher --slurm ...): node 0 on the step's first host coordinates at "
          "port 29500 + SLURM_JOB_ID % 10000, the others join it; several nodes need --tls_cert, --tls_key and "
          "--tls_ca, in which %N is the node's name and %n its rank (--tls_cert=certs/%N.pem)");
ABSL_FLAG(int, coordinator_port, 0, "with --slurm: the coordinator's port (default 29500 + SLURM_JOB_ID % 10000)");

namespace {

constexpr char kUsage[] =
    "stagehand launcher: runs a job with one worker process per GPU, coordinated over gRPC.\n"
    "\n"
    "  launcher --gpus=2 --steps=100            two GPUs train the default model (gpt-1.3b) for 100 steps\n"
    "  launcher --gpus=2 --model=allreduce      two GPUs, a checked all-reduce per step\n"
    "  launcher --gpus=2 --model=gpt-1.3b --schedule=1f1b --micro_batches=8\n"
    "                                           the reference GPT as a 2-stage pipeline\n"
    "  launcher --device=cpu --workers=4        four CPU workers (the default model there: tiny)\n"
    "  launcher --job=job.textproto             a JobSpec file (the flags you type override it)\n"
    "  launcher --gpus=2 -- python3 train.py    your own PyTorch program on each GPU, with torchrun's environment\n"
    "                                           (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT: env:// works)\n"
    "\n"
    "Flags labelled \"model:\" apply to every model that trains as a pipeline (GPT, Llama, a family of\n"
    "--worker_binary's), not to --model=allreduce.\n"
    "\n"
    "Exit codes: 0 success; 1 a worker failed (or the loss was not finite); 2 bad flags or job (nothing\n"
    "started); 3 a worker hung (missed heartbeats, no progress, or never registered); 4 workers could\n"
    "not be started (or the GPU health gate, --health, refused a GPU); 5 the run's results could not be\n"
    "written; 75 stopped by SIGTERM or SIGHUP after every rank wrote a checkpoint (--resume=RUN_DIR\n"
    "continues); 130 stopped by SIGINT; 143 stopped by SIGTERM or SIGHUP.\n"
    "\n"
    "  launcher --serve --state_dir=DIR         a server: jobs from `client submit`, queued for their devices\n"
    "\n"
    "  launcher --nodes=2 --node_rank=0 --coordinator_address=10.0.0.1:29500 --tls_cert=... --model=tiny\n"
    "  launcher --nodes=2 --node_rank=1 --coordinator_address=10.0.0.1:29500 --tls_cert=...\n"
    "                                           one job on two hosts: node 0 coordinates, node 1 joins";

// Where this launcher stands in a job of several hosts, from the flags (--slurm fills the same
// NodeOptions from the job step's environment: ApplySlurm).
stagehand::NodeOptions NodeOptionsFromFlags() {
  stagehand::NodeOptions n;
  n.nodes = absl::GetFlag(FLAGS_nodes);
  n.node_rank = absl::GetFlag(FLAGS_node_rank);
  n.coordinator_address = absl::GetFlag(FLAGS_coordinator_address);
  return n;
}

// `node`: from --slurm (ApplySlurm), else from the flags.
stagehand::LaunchOptions OptionsFromFlags(const stagehand::ParsedFlags& p, const stagehand::JobFlags& job_flags,
                                          const std::optional<stagehand::NodeOptions>& node,
                                          const stagehand::NodeTls& tls) {
  stagehand::LaunchOptions o;
  o.job = stagehand::JobRequestFromFlags(p, job_flags);
  stagehand::JobRequest& j = o.job;
  j.program = p.rest;
  o.run_dir = absl::GetFlag(FLAGS_run_dir);
  o.overwrite = absl::GetFlag(FLAGS_overwrite);
  o.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  j.custom_worker = !o.worker_binary.empty();
  o.peak_tflops_per_device = absl::GetFlag(FLAGS_peak_tflops);
  o.progress_bar = isatty(STDOUT_FILENO);
  o.node = node ? *node : NodeOptionsFromFlags();
  o.coordinator_address = o.node.coordinator_address;
  o.tls = tls;
  o.job_token_file = absl::GetFlag(FLAGS_job_token_file);
  if (node) {
    // Slurm's GPUs for this host, unless the flags chose (CPU workers, or a count of their own).
    if (node->gpus && *node->gpus > 0 && !j.gpus && j.flags.device() != "cpu") j.gpus = node->gpus;
    // srun gives every node the same --run_dir: on a shared file system the agents' must differ.
    if (node->node_rank > 0 && !o.run_dir.empty()) absl::StrAppend(&o.run_dir, "-node", node->node_rank);
  }
  return o;
}

// An agent's job comes from node 0: of the flags, only those about this host and its link apply.
constexpr const char* kAgentFlags[] = {"nodes",
                                       "node_rank",
                                       "coordinator_address",
                                       "tls_cert",
                                       "tls_key",
                                       "tls_ca",
                                       "job_token_file",
                                       "run_dir",
                                       "overwrite",
                                       "worker_binary",
                                       "device",
                                       "gpus",
                                       "workers",
                                       "register_timeout_ms",
                                       "prefetch_libraries"};

int CheckAgentFlags(const stagehand::ParsedFlags& p) {
  // Under --slurm every node gets the same command line: an agent ignores the job's flags.
  if (absl::GetFlag(FLAGS_node_rank) == 0 || absl::GetFlag(FLAGS_slurm)) return 0;
  for (const std::string& name : p.given) {
    bool ok = false;
    for (const char* f : kAgentFlags) ok = ok || name == f;
    if (!ok) {
      std::fprintf(stderr, "stagehand: --%s with --node_rank=%d: the job comes from node 0; pass it there\n",
                   name.c_str(), absl::GetFlag(FLAGS_node_rank));
      return stagehand::kExitUsage;
    }
  }
  return 0;
}

// The flags a server takes; every other one shapes a job, which with --serve comes from a client.
constexpr const char* kServeFlags[] = {"serve",       "listen",          "state_dir",       "tls_cert",
                                       "tls_key",     "tls_client_ca",   "max_cpu_workers", "worker_binary",
                                       "peak_tflops", "new_admin_token", "job_roots",       "allow_commands"};

bool IsServeFlag(const std::string& name) {
  for (const char* f : kServeFlags) {
    if (name == f) return true;
  }
  return false;
}

int RunServer(const stagehand::ParsedFlags& p) {
  for (const std::string& name : p.given) {
    if (!IsServeFlag(name)) {
      std::fprintf(stderr, "stagehand: --%s with --serve: jobs come from clients; pass it to `client submit` instead\n",
                   name.c_str());
      return stagehand::kExitUsage;
    }
  }
  stagehand::ServeOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.state_dir = absl::GetFlag(FLAGS_state_dir);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  o.max_cpu_workers = absl::GetFlag(FLAGS_max_cpu_workers);
  o.new_admin_token = absl::GetFlag(FLAGS_new_admin_token);
  o.job_roots = absl::GetFlag(FLAGS_job_roots);
  o.allow_commands = absl::GetFlag(FLAGS_allow_commands);
  o.peak_tflops_per_device = absl::GetFlag(FLAGS_peak_tflops);
  if (o.max_cpu_workers < 0 || o.max_cpu_workers > stagehand::kMaxWorkers) {
    std::fprintf(stderr, "stagehand: --max_cpu_workers=%d: pass 1 to %d, or 0 for the cores\n", o.max_cpu_workers,
                 stagehand::kMaxWorkers);
    return stagehand::kExitUsage;
  }
  return stagehand::Serve(o);
}

// The sweep or the single launch that the flags ask for; returns the exit code.
int Run(const stagehand::LaunchOptions& options) {
  if (!absl::GetFlag(FLAGS_sweep).empty()) {
    if (options.node.nodes > 1) {
      std::fprintf(stderr, "stagehand: --sweep with --nodes=%d: a sweep runs on one host; drop one of them\n",
                   options.node.nodes);
      return stagehand::kExitUsage;
    }
    std::vector<int> counts;
    for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_sweep), ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(c, &n) || n < 1) {
        std::fprintf(stderr, "stagehand: --sweep=%s: expected worker counts like 1,2,4\n",
                     absl::GetFlag(FLAGS_sweep).c_str());
        return stagehand::kExitUsage;
      }
      counts.push_back(n);
    }
    return stagehand::Sweep(options, counts);
  }
  return stagehand::Launch(options).exit_code;
}

// ---- Slurm ----
// The coordinator of a --slurm step and its TLS: one node keeps loopback (and needs no TLS files);
// several need TLS unless the first host is loopback. Prints where this node stands.
std::optional<int> PlaceSlurmNode(stagehand::NodeOptions& node, stagehand::NodeTls& tls) {
  const std::string gpus =
      node.gpus ? absl::StrCat(*node.gpus, " GPUs (", node.gpus_source, ")") : "GPUs not managed by Slurm";
  const char* job = std::getenv("SLURM_JOB_ID");
  if (node.nodes == 1) {
    // Loopback, as without --slurm: no hop leaves the host, so the TLS files (an sbatch script's,
    // for several nodes) are not used.
    node.coordinator_address = absl::GetFlag(FLAGS_coordinator_address);
    const bool had_tls = tls.enabled();
    tls = {};
    std::fprintf(stderr, "stagehand: --slurm: job %s, one node: a single-node launch%s; %s\n", job,
                 had_tls ? " (loopback: the TLS files are not needed)" : "", gpus.c_str());
    return std::nullopt;
  }
  const bool loopback = stagehand::IsLoopbackAddress(node.coordinator_address);
  if (!tls.enabled() && !loopback) {
    std::fprintf(stderr,
                 "stagehand: --slurm: this step spans %d nodes and the coordinator, %s, is not loopback: every hop "
                 "between nodes is mutual TLS; pass --tls_cert=DIR/%%N.pem --tls_key=DIR/%%N.key --tls_ca=DIR/ca.pem "
                 "(%%N: each node's name; tools/make_certs makes them)\n",
                 node.nodes, node.coordinator_address.c_str());
    return stagehand::kExitUsage;
  }
  std::fprintf(stderr, "stagehand: --slurm: job %s, node %d of %d (%s)%s, coordinator %s; %s\n", job, node.node_rank,
               node.nodes, node.node_name.c_str(), node.node_rank == 0 ? ", coordinates" : "",
               node.coordinator_address.c_str(), gpus.c_str());
  if (loopback && node.node_rank == 0) {
    // Debian's /etc/hosts maps a host's own name to 127.0.1.1: node 0 would serve where no other host reaches.
    std::fprintf(stderr,
                 "stagehand: --slurm: warning: %s resolves to a loopback address here; nodes on other "
                 "machines cannot reach it (map the name to this node's network address in /etc/hosts or DNS)\n",
                 node.coordinator_address.c_str());
  }
  return std::nullopt;
}

// --slurm: this node's place from the job step's environment. A step of one node runs as a
// single-node launch (its coordinator on loopback, as without --slurm); a step of N nodes is
// --nodes=N --node_rank=SLURM_NODEID --coordinator_address=<first host>:<port>, with the TLS files'
// %N and %n made this node's. Returns the exit code when the launch must not go on.
std::optional<int> ApplySlurm(const stagehand::ParsedFlags& p, std::optional<stagehand::NodeOptions>& out,
                              stagehand::NodeTls& tls) {
  tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
  if (absl::GetFlag(FLAGS_serve)) return std::nullopt;  // RunServer refuses job flags, --slurm among them
  if (!absl::GetFlag(FLAGS_slurm)) {
    if (absl::GetFlag(FLAGS_coordinator_port) != 0) {
      std::fprintf(stderr,
                   "stagehand: --coordinator_port is for --slurm; without it pass --coordinator_address=HOST:PORT\n");
      return stagehand::kExitUsage;
    }
    return std::nullopt;
  }
  for (const char* flag : {"nodes", "node_rank", "coordinator_address"}) {
    if (p.given.count(flag)) {
      std::fprintf(stderr,
                   "stagehand: --%s with --slurm: Slurm's job step says it; drop --%s (the port: "
                   "--coordinator_port)\n",
                   flag, flag);
      return stagehand::kExitUsage;
    }
  }
  stagehand::SlurmOptions slurm;
  slurm.coordinator_port = absl::GetFlag(FLAGS_coordinator_port);
  slurm.fallback = stagehand::ScontrolShowHostnames;
  absl::StatusOr<stagehand::NodeOptions> node = stagehand::NodeOptionsFromSlurm(stagehand::ProcessEnvironment(), slurm);
  if (!node.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(node.status().message()).c_str());
    return stagehand::kExitUsage;
  }
  for (auto [flag, path] :
       {std::pair{"--tls_cert", &tls.cert}, std::pair{"--tls_key", &tls.key}, std::pair{"--tls_ca", &tls.ca}}) {
    absl::StatusOr<std::string> expanded = stagehand::ExpandNodePattern(flag, *path, *node);
    if (!expanded.ok()) {
      std::fprintf(stderr, "stagehand: %s\n", std::string(expanded.status().message()).c_str());
      return stagehand::kExitUsage;
    }
    *path = *expanded;
  }
  // Slurm named the node's GPUs without hiding the others: the launcher takes every visible GPU.
  if (node->cuda_visible_devices) setenv("CUDA_VISIBLE_DEVICES", node->cuda_visible_devices->c_str(), 1);
  if (std::optional<int> code = PlaceSlurmNode(*node, tls)) return code;
  out = *std::move(node);
  return std::nullopt;
}
// ---- end of Slurm ----

}  // namespace

int main(int argc, char** argv) {
  const absl::Time launch = absl::Now();  // the startup ledger counts from here
  // Blocked before any thread exists, so every thread inherits the mask and only Launch() receives
  // them (sigtimedwait). Children get a clean mask from the spawner.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);  // handled as SIGTERM: results are written
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  stagehand::JobFlags job_flags;  // the job's options, JobSpec's fields (launcher/job/job_options.h)
  absl::StatusOr<stagehand::ParsedFlags> parsed = stagehand::ParseFlags(argc, argv, /*allow_rest=*/true, &job_flags);
  if (!parsed.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(parsed.status().message()).c_str());
    return stagehand::kExitUsage;
  }
  if (parsed->dashdash && parsed->rest.empty() && !parsed->help) {
    std::fprintf(stderr,
                 "stagehand: -- with no program after it: launcher [flags] -- PROGRAM [ARGS...] (-- python3 "
                 "train.py, as with torchrun)\n");
    return stagehand::kExitUsage;
  }
  if (!parsed->rest.empty() && absl::GetFlag(FLAGS_serve)) {
    std::fprintf(stderr, "stagehand: --serve with a program (-- %s): a server's jobs come from clients; drop --serve\n",
                 parsed->rest[0].c_str());
    return stagehand::kExitUsage;
  }
  if (parsed->help) {
    std::fputs(stagehand::FlagsHelp(kUsage, {"launcher/main.cc", stagehand::kJobFlagsFile},
                                    stagehand::HelpGroups(/*client=*/false), &job_flags)
                   .c_str(),
               stdout);
    return 0;
  }
  if (!(absl::GetFlag(FLAGS_peak_tflops) > 0)) {  // finite already (ParseFlags)
    std::fprintf(stderr, "stagehand: --peak_tflops=%g: pass the peak TFLOP/s of one device, a number above 0\n",
                 absl::GetFlag(FLAGS_peak_tflops));
    return stagehand::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_version)) {
    std::printf("stagehand launcher %s (coordinator protocol %d)\n", stagehand::kVersion, stagehand::kProtocolVersion);
    return 0;
  }
  if (!absl::GetFlag(FLAGS_serve)) {
    for (const std::string& name : parsed->given) {
      if (IsServeFlag(name) && name != "worker_binary" && name != "peak_tflops" && name != "tls_cert" &&
          name != "tls_key") {
        std::fprintf(stderr, "stagehand: --%s is a server flag: pass --serve too, or drop it\n", name.c_str());
        return stagehand::kExitUsage;
      }
    }
  }
  if (int code = CheckAgentFlags(*parsed); code != 0) return code;
  std::optional<stagehand::NodeOptions> slurm_node;  // set under --slurm
  stagehand::NodeTls tls;
  if (std::optional<int> code = ApplySlurm(*parsed, slurm_node, tls)) return *code;
  if (absl::Status s = stagehand::BecomeSubreaper(); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(s.message()).c_str());
    return stagehand::kExitLaunchFailed;
  }
  stagehand::LaunchOptions options =
      OptionsFromFlags(*parsed, job_flags, slurm_node, tls);  // isatty(1) before the capture
  options.launch = launch;
  // From here on the launcher's stdout goes through the bounded terminal writer (terminal.h), so that
  // a terminal that stops reading cannot block supervision. If the capture cannot be set up, stdout
  // is written directly.
  if (absl::Status s = stagehand::CaptureStdout(); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s; writing stdout directly\n", std::string(s.message()).c_str());
  }
  const int code = absl::GetFlag(FLAGS_serve) ? RunServer(*parsed) : Run(options);
  // A terminal that takes nothing for half a second loses the last lines (the run directory has
  // them) rather than keep the launcher from exiting.
  stagehand::FinishStdout(absl::Milliseconds(500));
  return code;
}
