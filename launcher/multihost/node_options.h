// Where one launcher stands in a job of several hosts: the one struct that the flags (--nodes,
// --node_rank, --coordinator_address) and a scheduler's environment (--slurm, launcher/multihost/slurm.h)
// fill, and that launcher/multihost/nodes.h checks. No dependencies, so that the parsers stay light.
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_NODE_OPTIONS_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_NODE_OPTIONS_H_

#include <optional>
#include <string>

namespace stagehand {

struct NodeOptions {
  int nodes = 1;                    // launchers (one per host) in the job
  int node_rank = 0;                // 0: coordinates the job and runs this host's workers; else an agent
  std::string coordinator_address;  // node 0: where it serves; an agent: where node 0 is (HOST:PORT)

  // What a scheduler said of this host (--slurm); empty from the flags.
  std::string node_name;  // this node's name in the scheduler's node list (Slurm: SLURMD_NODENAME)
  // GPUs the scheduler allocated to this host; nullopt when it says nothing (no gres configured),
  // and the launcher's default (every visible GPU) applies.
  std::optional<int> gpus;
  std::string gpus_source;  // the variable the count came from, for messages
  // Set when the scheduler named this host's GPUs (SLURM_JOB_GPUS) without hiding the others: the
  // launcher sets CUDA_VISIBLE_DEVICES to it before it looks for GPUs.
  std::optional<std::string> cuda_visible_devices;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_NODE_OPTIONS_H_
