// The job flags (job_flags.h): JobSpec's options by reflection, and the three that are not fields.
#include "launcher/job/job_flags.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "launcher/job/job_options.h"

ABSL_FLAG(int, gpus, -1,
          "GPUs to use, one worker each: the first N visible (default: all visible; "
          "with none visible, 2 CPU workers)");
ABSL_FLAG(std::string, job, "",
          "a JobSpec in protobuf text format (protos/job.proto); every flag you type "
          "overrides its field, bools too (--timing=false over timing: true)");
ABSL_FLAG(std::string, schedule_file, "",
          "a pipeline schedule as data: one line of actions per rank (\"0F0 0SEND_F0 ...\", see schedule/schedule.h)");

namespace stagehand {

std::optional<ExtraFlags::Info> JobFlags::Find(const std::string& name) const {
  const JobOption* o = FindJobFlag(name);
  if (o == nullptr) return std::nullopt;
  Info info;
  info.is_bool = o->is_bool();
  info.help = o->option->help();
  if (const std::string range = JobOptionRange(*o); !range.empty()) absl::StrAppend(&info.help, "; ", range);
  return info;
}

absl::Status JobFlags::Set(const std::string& name, absl::string_view value) {
  const JobOption* o = FindJobFlag(name);
  if (o == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "; see --help"));
  return SetJobOption(*o, value, typed_);
}

std::vector<std::string> JobFlags::Names() const {
  std::vector<std::string> names;
  for (const JobOption& o : JobOptions()) {
    if (!o.flag.empty()) names.push_back(o.flag);
  }
  return names;
}

JobRequest JobRequestFromFlags(const ParsedFlags& p, const JobFlags& job_flags) {
  JobRequest j;
  j.job_file = absl::GetFlag(FLAGS_job);
  if (p.given.count("gpus")) j.gpus = absl::GetFlag(FLAGS_gpus);
  j.schedule_file = absl::GetFlag(FLAGS_schedule_file);
  j.flags = job_flags.typed();
  return j;
}

std::vector<FlagGroup> HelpGroups(bool client) {
  std::vector<FlagGroup> groups;
  if (client) {
    groups.push_back({"The client (the server, your token, what a command shows)",
                      {"server", "token_file", "tls_ca", "tls_cert", "tls_key", "watch", "follow", "launcher",
                       "no_lines", "rank", "limit", "offset", "output", "role"}});
  }
  // The job's options by their group; the flags that are not JobSpec fields beside them.
  const std::vector<std::pair<std::string, std::string>> topics = {
      {"job", "The job"},
      {"model", "The model (model: every model that trains as a pipeline)"},
      {"pipeline", "Pipeline and parallelism"},
      {"training", "Training loop"},
      {"checkpoints", "Checkpoints and weights"},
      {"failure", "Failure detection"},
      {"gpus", "GPUs"},
      {"outputs", "Outputs and startup"},
  };
  std::map<std::string, std::vector<std::string>> members = {
      {"job", {"job", "gpus", "sweep", "worker_binary", "version"}},
      {"pipeline", {"schedule_file"}},
      {"gpus", {"peak_tflops"}},
      {"outputs", {"run_dir", "overwrite"}},
  };
  for (const JobOption& o : JobOptions()) {
    if (!o.flag.empty()) members[o.option->group()].push_back(o.flag);
  }
  for (const auto& [group, title] : topics) groups.push_back({title, members[group]});
  if (!client) {
    groups.push_back({"Several hosts",
                      {"nodes", "node_rank", "coordinator_address", "coordinator_port", "slurm", "job_token_file",
                       "tls_cert", "tls_key", "tls_ca"}});
    groups.push_back({"Serve (a job server for `client`)",
                      {"serve", "state_dir", "listen", "job_roots", "allow_commands", "new_admin_token",
                       "tls_client_ca", "max_cpu_workers"}});
  }
  return groups;
}

}  // namespace stagehand
