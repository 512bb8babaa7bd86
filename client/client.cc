// stagehand client: talks to `launcher --serve` over the Control service (submit, watch, list,
// status, cancel, logs, fetch, tokens). Flags are defined here and in job_flags.cc only.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/crypto.h"
#include "common/fd.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "control/bearer_token.h"
#include "client/control_client.h"
#include "launcher/job/job_flags.h"
#include "control/roles.h"
#include "launcher/job/run_dir.h"

ABSL_FLAG(std::string, server, "", "HOST:PORT of `launcher --serve` (default: $STAGEHAND_SERVER)");
ABSL_FLAG(std::string, token_file, "", "a file holding your token (default: $STAGEHAND_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM: the CA that signed the server's certificate; turns TLS on (default: $STAGEHAND_TLS_CA)");
ABSL_FLAG(std::string, tls_cert, "", "PEM: your client certificate, for mutual TLS (default: $STAGEHAND_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "", "PEM: the key of --tls_cert (default: $STAGEHAND_TLS_KEY)");
ABSL_FLAG(bool, watch, false, "submit: then watch the job and exit with its exit code");
ABSL_FLAG(bool, no_lines, false, "watch: print state changes and step reports instead of the job's output lines");
ABSL_FLAG(int, rank, 0, "logs: whose log (rank<N>.log)");
ABSL_FLAG(bool, follow, false, "logs: keep reading until the job ends (reconnecting when the server restarts)");
ABSL_FLAG(int64_t, offset, 0, "logs: start at this byte of the log");
ABSL_FLAG(std::string, output, "",
          "fetch: where to write the file (default: its base name in the current directory; - for stdout); "
          "token mint: a file to write the token to (mode 0600) instead of stdout");
ABSL_FLAG(bool, launcher, false, "logs: the launcher's own lines (launcher.log) instead of a rank's log");
ABSL_FLAG(std::string, role, "", "token mint: view, submit or admin");
ABSL_FLAG(int, limit, 0, "list: at most this many jobs, newest first (default: all of them)");

namespace stagehand {
namespace {

constexpr char kUsage[] =
    "stagehand client: submits and follows jobs on a `launcher --serve` server.\n"
    "\n"
    "  client submit [--job=FILE] [job flags] [--watch]   queue a job; prints its id last\n"
    "  client submit [job flags] [--watch] -- PROGRAM ARGS\n"
    "                                                     a command on the server's host, once per worker\n"
    "                                                     (a server started with --allow_commands)\n"
    "  client list                                        the jobs, newest first\n"
    "  client status ID                                   one job\n"
    "  client watch ID [--no_lines]                       its output as a foreground run prints it\n"
    "  client cancel ID                                   stop it, and wait for it to end\n"
    "  client delete ID                                   remove an ended job from the server's list (admin;\n"
    "                                                     its run directory stays on the server)\n"
    "  client logs ID [--rank=N] [--offset=B] [--follow]  a rank's log (--launcher: the launcher's own lines)\n"
    "  client fetch ID FILE [--output=PATH]               a file of its run directory (--output=-: to stdout)\n"
    "  client token mint NAME --role=view|submit|admin    a new token (admin); printed once\n"
    "        [--output=FILE]                              or written to a new FILE, mode 0600\n"
    "  client token revoke NAME                           it is refused from then on; its name is never reused\n"
    "  client token list                                  every token's name, role and times (admin)\n"
    "  client info                                        what the server is\n"
    "\n"
    "The server and token come from --server and --token_file, else $STAGEHAND_SERVER and\n"
    "$STAGEHAND_TOKEN_FILE. TLS: --tls_ca (and --tls_cert/--tls_key for mutual TLS).\n"
    "\n"
    "Exit codes: watch and submit --watch exit with the job's exit code (the launcher's: 0 success,\n"
    "1 a worker failed, 2 bad job, 3 hung, 4 could not start, 5 results not written, 130/143\n"
    "stopped; a job that ended otherwise without one exits 1); every other verb exits 0 on success,\n"
    "2 for bad flags or arguments (or a job the server refused), 1 for any other failure (the\n"
    "server unreachable, a refused token, no such job).";

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

// Prints the one line of `status` and returns the exit code it means.
int Fail(const absl::Status& status) {
  // One line of reasonable length, whatever a message echoes (a server's is cut at 2 KiB too).
  std::string message(status.message());
  if (message.size() > 2048) message = absl::StrCat(message.substr(0, 2000), "... (cut: ", message.size(), " bytes)");
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::fprintf(stderr, "client: %s\n", message.c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}
int Usage(const std::string& message) { return Fail(absl::InvalidArgumentError(message + "; see --help")); }

// The flag's value, else the environment variable's.
std::string FlagOrEnv(const absl::Flag<std::string>& flag, const char* env) {
  std::string value = absl::GetFlag(flag);
  if (value.empty() && std::getenv(env) != nullptr) value = std::getenv(env);
  return value.empty() ? value : UserPath(value);
}

// The token in `path`, whitespace trimmed.
absl::StatusOr<std::unique_ptr<ControlClient>> Connect() {
  ControlClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  if (options.server.empty() && std::getenv("STAGEHAND_SERVER") != nullptr)
    options.server = std::getenv("STAGEHAND_SERVER");
  const std::string token_file = FlagOrEnv(FLAGS_token_file, "STAGEHAND_TOKEN_FILE");
  if (!token_file.empty()) {
    absl::StatusOr<TokenFile> token = ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    if (!token->warning.empty()) std::fprintf(stderr, "%s\n", token->warning.c_str());
    options.token = std::move(token->token);
  }
  options.tls = {FlagOrEnv(FLAGS_tls_ca, "STAGEHAND_TLS_CA"), FlagOrEnv(FLAGS_tls_cert, "STAGEHAND_TLS_CERT"),
                 FlagOrEnv(FLAGS_tls_key, "STAGEHAND_TLS_KEY")};
  return ControlClient::Create(options);
}

bool IsFinal(control::JobState s) {
  return s == control::JOB_STATE_SUCCEEDED || s == control::JOB_STATE_FAILED || s == control::JOB_STATE_CANCELLED ||
         s == control::JOB_STATE_LOST;
}

// A lost job has none: its launcher died with the server.
bool HasExitCode(const control::JobInfo& j) { return IsFinal(j.state()) && j.state() != control::JOB_STATE_LOST; }

std::string StateName(control::JobState s) {
  return absl::AsciiStrToLower(absl::StripPrefix(control::JobState_Name(s), "JOB_STATE_"));
}

// A job's exit code as the client's: one that ended badly without a code still fails.
int JobExitCode(const control::JobInfo& job) {
  if (job.state() != control::JOB_STATE_SUCCEEDED && job.exit_code() == 0) return kExitFailure;
  return job.exit_code();
}

std::string Devices(const control::JobInfo& job) {
  const control::Devices& d = job.devices();
  if (d.gpus() > 0) {
    return d.gpu_ordinals().empty() ? absl::StrCat(d.gpus(), " gpu")
                                    : absl::StrCat(d.gpus(), " gpu [", absl::StrJoin(d.gpu_ordinals(), ","), "]");
  }
  return d.cpu_workers() > 0 ? absl::StrCat(d.cpu_workers(), " cpu") : "-";
}

std::string Age(int64_t since_ms) {
  if (since_ms <= 0) return "-";
  const int64_t s = std::max<int64_t>(0, (absl::ToUnixMillis(absl::Now()) - since_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  if (s < 172800) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

void PrintEvent(const control::JobEvent& e, bool no_lines) {
  if (e.has_line()) {
    const std::string& line = e.line();
    std::fputs(line.c_str(), stdout);
    if (line.empty() || line.back() != '\n') std::fputc('\n', stdout);
  } else if (no_lines && e.has_step()) {
    const ReportStepRequest& s = e.step();
    std::printf("step %lld rank %d%s, %.3f s\n", static_cast<long long>(s.step()), s.rank(),
                s.has_loss() ? absl::StrFormat(": loss %.4f", s.loss()).c_str() : "", s.step_seconds());
  } else if (e.has_state()) {  // with the lines too: the watch's last line is the final state
    const control::JobInfo& j = e.state();
    std::printf("job %s: %s%s%s\n", j.id().c_str(), StateName(j.state()).c_str(),
                HasExitCode(j) ? absl::StrCat(" (exit code ", j.exit_code(), ")").c_str() : "",
                j.root_cause().empty() ? "" : absl::StrCat(": ", j.root_cause()).c_str());
  }
  std::fflush(stdout);
}

int Watch(ControlClient& client, const std::string& id, bool no_lines) {
  absl::StatusOr<control::JobInfo> job =
      client.Watch(id, no_lines, 0, [no_lines](const control::JobEvent& e) { PrintEvent(e, no_lines); });
  if (!job.ok()) return Fail(job.status());
  return JobExitCode(*job);
}

absl::StatusOr<std::string> SubmissionId() {
  uint8_t bytes[12];
  if (absl::Status s = RandomBytes(bytes, sizeof(bytes)); !s.ok()) return s;
  std::string id = "sub-";
  for (uint8_t b : bytes) absl::StrAppend(&id, absl::Hex(b, absl::kZeroPad2));
  return id;
}

// `program`: a command job's PROGRAM ARGS (empty: a job of stagehand's worker).
int Submit(ControlClient& client, const ParsedFlags& parsed, const JobFlags& job_flags,
           const std::vector<std::string>& program) {
  const JobRequest request = JobRequestFromFlags(parsed, job_flags);
  absl::StatusOr<JobSpec> spec = MergeJobRequest(request);
  if (!spec.ok()) return Fail(spec.status());
  control::SubmitJobRequest submit;
  absl::StatusOr<std::string> submission_id = SubmissionId();
  if (!submission_id.ok()) return Fail(submission_id.status());
  submit.set_submission_id(*submission_id);  // the client's retries reuse it: queued once
  *submit.mutable_job() = *std::move(spec);
  if (request.gpus) submit.set_gpus(*request.gpus);
  for (const std::string& word : program) submit.add_program(word);
  if (const size_t bytes = submit.ByteSizeLong(); bytes > 256 * 1024) {  // the server's kMaxSubmissionBytes
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("the job is ", bytes / 1024,
                     " KiB serialized; a server takes at most 256 KiB (a --schedule_file or --job "
                     "file that large is too): make it smaller")));
  }
  if (!program.empty()) {
    // A server of control protocol 1 knows no commands: it would drop the field and run the job without it.
    absl::StatusOr<control::GetServerInfoResponse> info = client.Info();
    if (!info.ok()) return Fail(info.status());
    if (info->protocol() < 2) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("the server runs stagehand ", info->version(),
                                                          " (control protocol ", info->protocol(),
                                                          "), which takes no commands (-- PROGRAM); update it")));
    }
  }
  absl::StatusOr<control::JobInfo> job = client.Submit(submit);
  if (!job.ok()) return Fail(job.status());
  if (job->queue_position() > 0) std::fprintf(stderr, "queued, position %d\n", job->queue_position());
  std::printf("%s\n", job->id().c_str());  // the last line: scripts take it
  std::fflush(stdout);
  return absl::GetFlag(FLAGS_watch) ? Watch(client, job->id(), absl::GetFlag(FLAGS_no_lines)) : 0;
}

// A job's name, else a command job's command (as the server escaped and clipped it).
std::string NameOrCommand(const control::JobInfo& job) {
  return job.name().empty() && !job.command().empty() ? job.command() : job.name();
}

int List(ControlClient& client) {
  absl::StatusOr<std::vector<control::JobInfo>> jobs = client.ListAll({}, std::max(0, absl::GetFlag(FLAGS_limit)));
  if (!jobs.ok()) return Fail(jobs.status());
  const char* format = "%-18s %-20s %-10s %-14s %-14s %-5s %s\n";
  std::printf(format, "ID", "NAME", "STATE", "DEVICES", "SUBMITTED BY", "AGE", "EXIT");
  for (const control::JobInfo& j : *jobs) {
    std::printf(format, j.id().c_str(), NameOrCommand(j).c_str(), StateName(j.state()).c_str(), Devices(j).c_str(),
                j.submitted_by().c_str(), Age(j.submit_time_ms()).c_str(),
                HasExitCode(j) ? absl::StrCat(j.exit_code()).c_str() : "-");
  }
  return 0;
}

int Delete(ControlClient& client, const std::string& id) {
  absl::StatusOr<std::string> run_dir = client.Delete(id);
  if (!run_dir.ok()) return Fail(run_dir.status());
  if (run_dir->empty()) {
    std::printf("deleted job %s (it never started: no run directory)\n", id.c_str());
  } else {
    std::printf("deleted job %s; its run directory stays on the server: %s\n", id.c_str(), run_dir->c_str());
  }
  return 0;
}

int Status(ControlClient& client, const std::string& id) {
  absl::StatusOr<control::JobInfo> job = client.Get(id);
  if (!job.ok()) return Fail(job.status());
  const control::JobInfo& j = *job;
  std::printf("job %s (%s): %s\n", j.id().c_str(), NameOrCommand(j).c_str(), StateName(j.state()).c_str());
  if (!j.command().empty()) std::printf("  command: %s\n", j.command().c_str());
  if (j.queue_position() > 0) std::printf("  queue position: %d\n", j.queue_position());
  std::printf("  submitted by %s, %s ago\n", j.submitted_by().c_str(), Age(j.submit_time_ms()).c_str());
  std::printf("  devices: %s\n", Devices(j).c_str());
  if (j.start_time_ms() > 0) std::printf("  started %s ago\n", Age(j.start_time_ms()).c_str());
  if (j.command().empty()) {
    std::printf("  steps done: %lld of %lld\n", static_cast<long long>(j.steps_done()),
                static_cast<long long>(j.spec().steps()));
  } else {  // a command's steps are those its script reported (stagehand.step), of no set number
    std::printf("  steps done: %lld\n", static_cast<long long>(j.steps_done()));
  }
  if (HasExitCode(j)) std::printf("  exit code: %d, ended %s ago\n", j.exit_code(), Age(j.end_time_ms()).c_str());
  if (j.state() == control::JOB_STATE_LOST)
    std::printf("  no exit code (lost), ended %s ago\n", Age(j.end_time_ms()).c_str());
  if (!j.cancelled_by().empty()) std::printf("  cancelled by: %s\n", j.cancelled_by().c_str());
  if (!j.root_cause().empty()) std::printf("  root cause: %s\n", j.root_cause().c_str());
  if (!j.run_dir().empty()) std::printf("  run dir (on the server): %s\n", j.run_dir().c_str());
  return 0;
}

// Cancels, then waits (grace period + 5 s at most) for the final state.
int Cancel(ControlClient& client, const std::string& id) {
  absl::StatusOr<control::JobInfo> job = client.Cancel(id);
  if (!job.ok()) return Fail(job.status());
  const int64_t grace_ms = job->spec().timeouts().grace_ms() > 0 ? job->spec().timeouts().grace_ms() : 3000;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(grace_ms) + absl::Seconds(5);
  while (!IsFinal(job->state()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    job = client.Get(id);
    if (!job.ok()) return Fail(job.status());
  }
  if (job->state() == control::JOB_STATE_CANCELLED) {
    std::printf("cancelled\n");
    return 0;
  }
  if (IsFinal(job->state())) {
    std::printf("job %s had already ended: %s%s\n", id.c_str(), StateName(job->state()).c_str(),
                HasExitCode(*job) ? absl::StrCat(" (exit code ", job->exit_code(), ")").c_str() : "");
    return 0;
  }
  return Fail(absl::DeadlineExceededError(absl::StrCat("job ", id, " is still ", StateName(job->state()), " ",
                                                       grace_ms / 1000 + 5,
                                                       " s after the cancel; check `client status ", id, "`")));
}

int Logs(ControlClient& client, const std::string& id) {
  const int rank = absl::GetFlag(FLAGS_launcher) ? -1 : absl::GetFlag(FLAGS_rank);  // -1: launcher.log
  absl::Status s =
      client.Logs(id, rank, absl::GetFlag(FLAGS_offset), absl::GetFlag(FLAGS_follow), [](absl::string_view data) {
        std::fwrite(data.data(), 1, data.size(), stdout);
        std::fflush(stdout);
      });
  return s.ok() ? 0 : Fail(s);
}

int Fetch(ControlClient& client, const std::string& id, const std::string& path) {
  std::string local = absl::GetFlag(FLAGS_output);
  if (local == "-") {
    absl::StatusOr<int64_t> bytes = client.FetchTo(id, path, [](absl::string_view data) {
      if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size()) {
        return absl::FailedPreconditionError("cannot write to stdout");
      }
      return absl::OkStatus();
    });
    std::fflush(stdout);
    return bytes.ok() ? 0 : Fail(bytes.status());
  }
  if (local.empty()) local = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  local = UserPath(local);  // `bazel run` runs in the runfiles: the user's directory is elsewhere
  absl::StatusOr<int64_t> bytes = client.Fetch(id, path, local);
  if (!bytes.ok()) return Fail(bytes.status());
  std::fprintf(stderr, "wrote %s (%lld bytes)\n", local.c_str(), static_cast<long long>(*bytes));
  return 0;
}

// --role's value, with the flag named in the refusal.
absl::StatusOr<control::Role> RoleFlag(const std::string& role) {
  absl::StatusOr<control::Role> r = ParseRole(role);
  if (!r.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--role=", role, ": pass --role=view, --role=submit or --role=admin"));
  return r;
}

std::string FormatMillis(int64_t ms) {
  return ms == 0 ? std::string("-")
                 : absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(ms), absl::LocalTimeZone());
}

int Token(ControlClient& client, const std::vector<std::string>& args) {
  if (args.size() == 2 && args[1] == "list") {
    absl::StatusOr<std::vector<control::TokenInfo>> tokens = client.ListTokens();
    if (!tokens.ok()) return Fail(tokens.status());
    std::printf("%-24s %-7s %-19s  %s\n", "NAME", "ROLE", "CREATED", "REVOKED");
    for (const control::TokenInfo& t : *tokens) {
      std::printf("%-24s %-7s %-19s  %s\n", t.name().c_str(), RoleName(t.role()).c_str(),
                  FormatMillis(t.created_time_ms()).c_str(), FormatMillis(t.revoked_time_ms()).c_str());
    }
    return 0;
  }
  if (args.size() != 3 || (args[1] != "mint" && args[1] != "revoke")) {
    return Usage("expected `token mint NAME --role=ROLE`, `token revoke NAME` or `token list`");
  }
  if (args[1] == "revoke") {
    absl::Status s = client.Revoke(args[2]);
    if (!s.ok()) return Fail(s);
    std::printf("revoked %s\n", args[2].c_str());
    return 0;
  }
  absl::StatusOr<control::Role> role = RoleFlag(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return Fail(role.status());
  // --output: the file is made (0600, new, not through a link) before the token is minted, so that a
  // token is never minted with nowhere to go.
  const std::string output = absl::GetFlag(FLAGS_output).empty() ? "" : UserPath(absl::GetFlag(FLAGS_output));
  UniqueFd file;
  if (!output.empty()) {
    file.reset(::open(output.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!file.valid()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--output=", output, ": cannot create it: ", ErrnoText(errno),
                       errno == EEXIST ? " (it exists; remove it or pass another file)" : "")));
    }
    (void)::fchmod(file.get(), 0600);  // whatever the umask
  }
  absl::StatusOr<std::string> token = client.Mint(args[2], *role);
  if (!token.ok()) {
    if (file.valid()) ::unlink(output.c_str());
    return Fail(token.status());
  }
  if (!file.valid()) {
    std::printf("%s\n", token->c_str());
    return 0;
  }
  const std::string line = *token + "\n";
  if (::write(file.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()) || ::fsync(file.get()) != 0) {
    // The token exists on the server: show it rather than lose it.
    std::printf("%s\n", token->c_str());
    return Fail(absl::InternalError(absl::StrCat("--output=", output, ": cannot write it: ", ErrnoText(errno),
                                                 "; the token is printed above instead")));
  }
  std::fprintf(stderr, "wrote token '%s' to %s (mode 0600)\n", args[2].c_str(), output.c_str());
  return 0;
}

int Info(ControlClient& client) {
  absl::StatusOr<control::GetServerInfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  std::printf("server %s: stagehand %s, protocol %d\n", client.tls_info().server.c_str(), info->version().c_str(),
              info->protocol());
  std::printf("  gpus: %d, cpu workers: %d\n", info->gpus(), info->cpu_workers());
  std::printf("  tls: %s\n", info->mutual_tls() ? "mutual" : info->tls() ? "yes" : "no (plaintext loopback)");
  std::printf("  commands: %s\n", info->allow_commands() ? "allowed (--allow_commands)" : "refused");
  return 0;
}

// The words of the command line apart from its flags (and a flag's separate value), so that
// ParseFlags sees only flags.
struct SplitArgs {
  std::vector<std::string> words;
  std::vector<char*> flags;
  bool dashdash = false;       // `--` was given: the words after it are `submit`'s command
  size_t before_dashdash = 0;  // the words before it
};
SplitArgs Split(int argc, char** argv) {
  SplitArgs out;
  out.flags.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      out.dashdash = true;
      out.before_dashdash = out.words.size();
      for (++i; i < argc; ++i) out.words.push_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      out.words.emplace_back(arg);
      continue;
    }
    out.flags.push_back(argv[i]);
    std::string name(arg.substr(arg.find_first_not_of('-')));
    if (name.find('=') != std::string::npos || i + 1 >= argc) continue;
    std::replace(name.begin(), name.end(), '-', '_');
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>()) out.flags.push_back(argv[++i]);  // --name VALUE
  }
  return out;
}

// The verb's positional arguments, counted.
bool Arity(const std::vector<std::string>& words, size_t n) { return words.size() == n; }

int Run(const SplitArgs& split, const ParsedFlags& parsed, const JobFlags& job_flags) {
  const std::vector<std::string>& words = split.words;
  const std::string& verb = words[0];
  static const char* kVerbs[] = {"submit", "list", "status", "watch", "cancel",
                                 "delete", "logs", "fetch",  "token", "info"};
  if (std::find(std::begin(kVerbs), std::end(kVerbs), verb) == std::end(kVerbs)) {
    return Usage(absl::StrCat("unknown verb '", absl::CHexEscape(verb.substr(0, 200)), verb.size() > 200 ? "..." : "",
                              "': use submit, list, status, watch, cancel, delete, logs, fetch, token or info"));
  }
  const bool one_id = verb == "status" || verb == "watch" || verb == "cancel" || verb == "delete" || verb == "logs";
  if (one_id && !Arity(words, 2)) return Usage(absl::StrCat("`", verb, "` takes one job id: client ", verb, " ID"));
  if (verb == "fetch" && !Arity(words, 3)) return Usage("`fetch` takes a job id and a file: client fetch ID FILE");
  // submit: a command after `--` (client submit [flags] -- PROGRAM ARGS), nothing before it.
  std::vector<std::string> program;
  if (verb == "submit") {
    const size_t positional = split.dashdash ? std::max<size_t>(split.before_dashdash, 1) : words.size();
    if (positional > 1) {
      return Usage(absl::StrCat("`submit` takes no arguments, got '", absl::CHexEscape(words[1].substr(0, 200)),
                                "': a command goes after -- (client submit [flags] -- PROGRAM ARGS)"));
    }
    if (split.dashdash && positional == words.size()) {
      return Usage("-- with no program after it: client submit [flags] -- PROGRAM [ARGS...] (-- python3 train.py)");
    }
    program.assign(words.begin() + static_cast<std::ptrdiff_t>(positional), words.end());
  }
  if ((verb == "list" || verb == "info") && !Arity(words, 1)) {
    return Usage(
        absl::StrCat("`", verb, "` takes no arguments, got '", absl::CHexEscape(words[1].substr(0, 200)), "'"));
  }
  absl::StatusOr<std::unique_ptr<ControlClient>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  ControlClient& c = **client;
  if (verb == "submit") return Submit(c, parsed, job_flags, program);
  if (verb == "list") return List(c);
  if (verb == "status") return Status(c, words[1]);
  if (verb == "watch") return Watch(c, words[1], absl::GetFlag(FLAGS_no_lines));
  if (verb == "cancel") return Cancel(c, words[1]);
  if (verb == "delete") return Delete(c, words[1]);
  if (verb == "logs") return Logs(c, words[1]);
  if (verb == "fetch") return Fetch(c, words[1], words[2]);
  if (verb == "token") return Token(c, words);
  return Info(c);
}

}  // namespace
}  // namespace stagehand

int main(int argc, char** argv) {
  stagehand::QuietGrpcLogs();  // a wrong CA is our one line, not gRPC's too
  stagehand::SplitArgs split = stagehand::Split(argc, argv);
  stagehand::JobFlags job_flags;  // `client submit` takes the launcher's job flags
  absl::StatusOr<stagehand::ParsedFlags> parsed =
      stagehand::ParseFlags(static_cast<int>(split.flags.size()), split.flags.data(), /*allow_rest=*/false, &job_flags);
  if (!parsed.ok()) return stagehand::Fail(parsed.status());
  if (parsed->help || split.words.empty()) {
    const std::string help = stagehand::FlagsHelp(stagehand::kUsage, {"client/client.cc", stagehand::kJobFlagsFile},
                                                  stagehand::HelpGroups(/*client=*/true), &job_flags);
    std::fputs(help.c_str(), parsed->help ? stdout : stderr);
    return parsed->help ? 0 : stagehand::kExitUsage;
  }
  return stagehand::Run(split, *parsed, job_flags);
}
