// `launcher --slurm` (see slurm.h): the hostlist parser and the reading of a job step's environment.
#include "launcher/multihost/slurm.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace stagehand {
namespace {

constexpr size_t kMaxHosts = 100000;

absl::Status HostlistError(absl::string_view hostlist, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("hostlist \"", hostlist, "\": ", what));
}

// Splits at the commas outside brackets; false on unbalanced or nested brackets.
bool SplitTopLevel(absl::string_view list, std::vector<absl::string_view>& items) {
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') {
      if (++depth > 1) return false;
    } else if (list[i] == ']') {
      if (--depth < 0) return false;
    } else if (list[i] == ',' && depth == 0) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  items.push_back(list.substr(start));
  return depth == 0;
}

// "1-3,5,08-10" into its numbers as text, each range padded to the width of its first number.
absl::StatusOr<std::vector<std::string>> ExpandRanges(absl::string_view hostlist, absl::string_view ranges) {
  std::vector<std::string> out;
  for (absl::string_view range : absl::StrSplit(ranges, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(range, absl::MaxSplits('-', 1));
    auto digits = [](absl::string_view s) {
      return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
    };
    const absl::string_view low = ends[0];
    const absl::string_view high = ends.size() > 1 ? ends[1] : ends[0];
    int lo = 0, hi = 0;
    if (!digits(low) || !digits(high) || !absl::SimpleAtoi(low, &lo) || !absl::SimpleAtoi(high, &hi)) {
      return HostlistError(
          hostlist, absl::StrCat("\"[", ranges, "]\" holds \"", range, "\"; a range is N or N-M of decimal numbers"));
    }
    if (hi < lo) return HostlistError(hostlist, absl::StrCat("range ", range, " runs backwards"));
    if (static_cast<size_t>(hi - lo) >= kMaxHosts) {
      return HostlistError(hostlist, absl::StrCat("range ", range, " is over ", kMaxHosts, " hosts"));
    }
    for (int n = lo; n <= hi; ++n) {
      std::string text = std::to_string(n);
      if (text.size() < low.size()) text.insert(0, low.size() - text.size(), '0');
      out.push_back(std::move(text));
    }
  }
  return out;
}

// One item ("rack[1-2]-n[01-03]"): every combination of its bracket groups, in order.
absl::Status ExpandItem(absl::string_view hostlist, absl::string_view item, std::vector<std::string>& hosts) {
  if (item.empty()) return HostlistError(hostlist, "an empty host name (two commas, or a comma at an end)");
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < item.size()) {
    const size_t open = item.find('[', i);
    const absl::string_view literal = item.substr(i, open == absl::string_view::npos ? item.npos : open - i);
    for (std::string& p : partial) absl::StrAppend(&p, literal);
    if (open == absl::string_view::npos) break;
    const size_t close = item.find(']', open);  // balanced: SplitTopLevel checked
    absl::StatusOr<std::vector<std::string>> numbers = ExpandRanges(hostlist, item.substr(open + 1, close - open - 1));
    if (!numbers.ok()) return numbers.status();
    if (partial.size() * numbers->size() + hosts.size() > kMaxHosts) {
      return HostlistError(hostlist, absl::StrCat("over ", kMaxHosts, " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * numbers->size());
    for (const std::string& p : partial) {
      for (const std::string& n : *numbers) next.push_back(absl::StrCat(p, n));
    }
    partial = std::move(next);
    i = close + 1;
  }
  for (std::string& p : partial) hosts.push_back(std::move(p));
  return absl::OkStatus();
}

std::optional<std::string> Get(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// The first of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> First(const std::map<std::string, std::string>& env,
                                                         std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = Get(env, n)) return std::make_pair(std::string(n), *v);
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> NonNegative(const std::string& name, const std::string& value) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm: ", name, "=", value,
                                                   " is not a whole number; is this a "
                                                   "Slurm job step (srun)?"));
  }
  return n;
}

// Entries of a device list ("0,1", "GPU-uuid,..."): "NoDevFiles" (Slurm's word for GPUs without
// device files) and "" are none.
int CountDevices(const std::string& list) {
  if (list.empty() || list == "NoDevFiles") return 0;
  int n = 0;
  for (absl::string_view d : absl::StrSplit(list, ',')) n += !absl::StripAsciiWhitespace(d).empty();
  return n;
}

absl::Status ReadGpus(const std::map<std::string, std::string>& env, NodeOptions& node) {
  const std::optional<std::string> visible = Get(env, "CUDA_VISIBLE_DEVICES");
  if (auto on_node = Get(env, "SLURM_GPUS_ON_NODE")) {
    absl::StatusOr<int64_t> n = NonNegative("SLURM_GPUS_ON_NODE", *on_node);
    if (!n.ok()) return n.status();
    if (visible && CountDevices(*visible) < *n) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--slurm: SLURM_GPUS_ON_NODE=", *n, " but CUDA_VISIBLE_DEVICES=", *visible, " makes ", CountDevices(*visible),
          " visible; unset CUDA_VISIBLE_DEVICES and let Slurm set it, or ask Slurm for ", CountDevices(*visible),
          " (srun --gpus-per-node)"));
    }
    node.gpus = static_cast<int>(*n);
    node.gpus_source = "SLURM_GPUS_ON_NODE";
    return absl::OkStatus();
  }
  if (visible) {
    node.gpus = CountDevices(*visible);
    node.gpus_source = "CUDA_VISIBLE_DEVICES";
    return absl::OkStatus();
  }
  if (auto named = First(env, {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"})) {
    node.gpus = CountDevices(named->second);
    node.gpus_source = named->first;
    // Slurm named the GPUs but did not hide the others: the launcher must see only these.
    if (*node.gpus > 0) node.cuda_visible_devices = named->second;
  }
  return absl::OkStatus();
}

// This node's place: the node count, its rank, one task per node.
absl::Status ReadPlace(const std::map<std::string, std::string>& env, NodeOptions& node) {
  auto nodes = First(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!nodes) return absl::FailedPreconditionError("--slurm: SLURM_NNODES is not set; run the launcher with srun");
  absl::StatusOr<int64_t> n = NonNegative(nodes->first, nodes->second);
  if (!n.ok()) return n.status();
  if (*n < 1 || *n > 100000) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm: ", nodes->first, "=", *n, " nodes is out of range"));
  }
  node.nodes = static_cast<int>(*n);
  absl::StatusOr<int64_t> rank = NonNegative("SLURM_NODEID", *Get(env, "SLURM_NODEID"));
  if (!rank.ok()) return rank.status();
  if (*rank >= node.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm: SLURM_NODEID=", *rank, " is not below ", nodes->first, "=", node.nodes));
  }
  node.node_rank = static_cast<int>(*rank);
  constexpr char kOnePerNode[] = "; --slurm runs one launcher per node: srun --ntasks-per-node=1 launcher --slurm ...";
  if (auto local = Get(env, "SLURM_LOCALID"); local && *local != "0") {
    return absl::FailedPreconditionError(absl::StrCat("--slurm: this is task ", *local, " on its node", kOnePerNode));
  }
  if (auto tasks = First(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"})) {
    absl::StatusOr<int64_t> t = NonNegative(tasks->first, tasks->second);
    if (!t.ok()) return t.status();
    if (*t > node.nodes) {
      return absl::FailedPreconditionError(
          absl::StrCat("--slurm: the step has ", *t, " tasks on ", node.nodes, " nodes", kOnePerNode));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int SlurmCoordinatorPort(int64_t job_id) { return 29500 + static_cast<int>(job_id % 10000); }

absl::StatusOr<std::vector<std::string>> ParseHostlist(absl::string_view hostlist) {
  const absl::string_view list = absl::StripAsciiWhitespace(hostlist);
  if (list.empty()) return HostlistError(hostlist, "empty");
  for (char c : list) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != ',' && c != '[' && c != ']') {
      return HostlistError(hostlist, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  std::vector<absl::string_view> items;
  if (!SplitTopLevel(list, items)) return HostlistError(hostlist, "unbalanced or nested brackets");
  std::vector<std::string> hosts;
  for (absl::string_view item : items) {
    if (absl::Status s = ExpandItem(hostlist, item, hosts); !s.ok()) return s;
  }
  return hosts;
}

absl::StatusOr<NodeOptions> NodeOptionsFromSlurm(const std::map<std::string, std::string>& env,
                                                 const SlurmOptions& options) {
  const std::optional<std::string> job = Get(env, "SLURM_JOB_ID");
  if (!job) {
    return absl::FailedPreconditionError(
        "--slurm outside a Slurm job: SLURM_JOB_ID is not set; run it under srun "
        "(srun -N2 --ntasks-per-node=1 launcher --slurm ...), or drop --slurm");
  }
  absl::StatusOr<int64_t> job_id = NonNegative("SLURM_JOB_ID", *job);
  if (!job_id.ok()) return job_id.status();
  if (!Get(env, "SLURM_NODEID")) {
    return absl::FailedPreconditionError(
        "--slurm: SLURM_NODEID is not set, so this is not a job step (a batch script runs once, on the first "
        "node); start the launcher with srun --ntasks-per-node=1 launcher --slurm ...");
  }
  NodeOptions node;
  if (absl::Status s = ReadPlace(env, node); !s.ok()) return s;
  auto list = First(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!list) return absl::FailedPreconditionError("--slurm: SLURM_JOB_NODELIST is not set; run the launcher with srun");
  absl::StatusOr<std::vector<std::string>> hosts = ParseHostlist(list->second);
  if (!hosts.ok() && options.fallback) {
    absl::StatusOr<std::vector<std::string>> expanded = options.fallback(list->second);
    if (!expanded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--slurm: ", list->first, ": ", hosts.status().message(),
                                                     "; and scontrol: ", expanded.status().message()));
    }
    hosts = std::move(expanded);
  }
  if (!hosts.ok())
    return absl::InvalidArgumentError(absl::StrCat("--slurm: ", list->first, ": ", hosts.status().message()));
  if (static_cast<int>(hosts->size()) != node.nodes) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm: ", list->first, "=", list->second, " names ",
                                                   hosts->size(), " hosts but the step has ", node.nodes, " nodes"));
  }
  const int port = options.coordinator_port > 0 ? options.coordinator_port : SlurmCoordinatorPort(*job_id);
  if (port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator_port=", port, ": pass 1 to 65535"));
  }
  node.coordinator_address = absl::StrCat((*hosts)[0], ":", port);
  const std::optional<std::string> name = Get(env, "SLURMD_NODENAME");
  node.node_name = name && !name->empty() ? *name : (*hosts)[node.node_rank];
  if (absl::Status s = ReadGpus(env, node); !s.ok()) return s;
  return node;
}

absl::StatusOr<std::string> ExpandNodePattern(const std::string& flag, const std::string& path,
                                              const NodeOptions& node) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      out.push_back(path[i]);
      continue;
    }
    const char c = i + 1 < path.size() ? path[++i] : '\0';
    if (c == 'N') {
      absl::StrAppend(&out, node.node_name);
    } else if (c == 'n') {
      absl::StrAppend(&out, node.node_rank);
    } else if (c == '%') {
      out.push_back('%');
    } else {
      return absl::InvalidArgumentError(absl::StrCat(flag, "=", path,
                                                     ": with --slurm, %N is the node's name, %n its rank "
                                                     "and %% a percent sign; nothing else may follow a %"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ScontrolShowHostnames(const std::string& hostlist) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("scontrol: pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const char* argv[] = {"scontrol", "show", "hostnames", hostlist.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "scontrol", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return absl::UnavailableError("cannot run scontrol (is slurm-client installed?)");
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("scontrol show hostnames ", hostlist, " failed"));
  }
  std::vector<std::string> hosts = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  if (hosts.empty())
    return absl::InvalidArgumentError(absl::StrCat("scontrol show hostnames ", hostlist, ": no hosts"));
  return hosts;
}

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace stagehand
