// `launcher --slurm`: a node's place in a multi-node job, read from the environment Slurm gives a job
// step (srun): the node count, this node's rank, the coordinator's address (the step's first host, on
// a port derived from the job id) and the GPUs Slurm allocated. Pure functions of the environment,
// except the scontrol fallback, which is injected.
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_SLURM_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_SLURM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/multihost/node_options.h"

namespace stagehand {

// Expands a hostlist ("n[1-3,5],gpu07") into its host names, in order; an error names the list and
// what is wrong with it.
using HostlistExpander = std::function<absl::StatusOr<std::vector<std::string>>(const std::string& hostlist)>;

struct SlurmOptions {
  int coordinator_port = 0;  // > 0 overrides the port derived from the job id
  // Used when ParseHostlist cannot read a list (syntax of a newer Slurm): `scontrol show hostnames`.
  // Null: no fallback.
  HostlistExpander fallback;
};

// The coordinator's port for a job: 29500 + job_id % 10000 (29500 to 39499), so that the launchers
// of one job agree on it without talking, and two jobs sharing a node differ unless their ids are
// 10,000 apart.
int SlurmCoordinatorPort(int64_t job_id);

// Slurm's hostlist syntax: comma-separated items, each a name with zero or more bracketed range
// lists ("n[1-3,5]", "rack[1-2]-gpu[01-04]": every combination, the last bracket fastest); a range
// keeps the zero-padding of its first number ("[08-10]" is 08 09 10). At most 100,000 hosts.
// INVALID_ARGUMENT for anything else (unbalanced brackets, a reversed range, an empty item).
absl::StatusOr<std::vector<std::string>> ParseHostlist(absl::string_view hostlist);

// The node's options (launcher/multihost/node_options.h) from a job step's environment: the node count, this
// node's rank (SLURM_NODEID), the coordinator (the list's first host, on the derived port or
// options.coordinator_port), the node's name (SLURMD_NODENAME, else its entry in the list) and its
// GPUs (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS). The step's variables win over the
// job's (SLURM_STEP_NUM_NODES, SLURM_STEP_NODELIST over SLURM_NNODES, SLURM_JOB_NODELIST), since an srun inside an
// allocation may use fewer nodes than it holds. Errors (INVALID_ARGUMENT or FAILED_PRECONDITION) say what to run
// instead: outside a job, in the batch script rather than a step, more than one task per node, a node rank out of
// range, GPU variables that disagree.
absl::StatusOr<NodeOptions> NodeOptionsFromSlurm(const std::map<std::string, std::string>& env,
                                                 const SlurmOptions& options = {});

// A path given once for every node of a step (--tls_cert=certs/%N.pem) made this node's, as Slurm's
// own filename patterns are: %N the node's name, %n its rank, %% a percent sign. INVALID_ARGUMENT
// naming `flag` for any other %-sequence.
absl::StatusOr<std::string> ExpandNodePattern(const std::string& flag, const std::string& path,
                                              const NodeOptions& node);

// `scontrol show hostnames LIST`, the fallback expander for the launcher.
absl::StatusOr<std::vector<std::string>> ScontrolShowHostnames(const std::string& hostlist);

// The process's environment, as NodeOptionsFromSlurm takes it.
std::map<std::string, std::string> ProcessEnvironment();

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_SLURM_H_
