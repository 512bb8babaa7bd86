// One job across several hosts (launcher --nodes=N): where this launcher stands (node 0 coordinates,
// the others are agents), the checks every launcher of the job makes before it starts anything (TLS
// on every non-loopback hop, the job token file), and the plan's report of the links between hosts.
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_NODES_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_NODES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tls.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/multihost/node_options.h"

namespace stagehand {

// The job's certificates: one set per host, signed by one CA. A coordinator serves them and requires
// a client certificate signed by `ca` (mutual TLS); agents and workers present theirs.
struct NodeTls {
  std::string cert, key, ca;  // paths; all empty: plaintext (loopback only)
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
  ServerTlsFiles server() const { return {cert, key, ca}; }
  ClientTlsFiles client() const { return {ca, cert, key}; }
};

// Refusals before anything starts (INVALID_ARGUMENT, one line, exit 2): --nodes and --node_rank out
// of range; an agent without --coordinator_address; a non-loopback --coordinator_address without all
// three TLS files; TLS files that are not PEM; several nodes on loopback without TLS and without a
// job token file (an agent could not prove itself).
absl::Status CheckNodeOptions(const NodeOptions& nodes, const NodeTls& tls, const std::string& job_token_file);

// The job secret shared through --job_token_file (the same file on every node; how agents prove
// themselves on loopback, where there is no TLS): at least 32 characters, surrounding whitespace
// dropped; the file must not be readable by group or others. INVALID_ARGUMENT naming the flag.
absl::StatusOr<std::string> ReadJobToken(const std::string& path);

// The flags a worker of this host gets to reach the coordinator and its peers: the TLS files (as
// absolute paths) and the address its CPU transport listens on and advertises.
std::vector<std::string> WorkerNodeArgs(const NodeTls& tls, const std::string& listen_host);

// HOST of HOST:PORT or [V6]:PORT, without brackets ("" when it is neither).
std::string HostOf(const std::string& address);

// "ranks 0-1 on node 0 (198.18.0.11), 2 on node 1 (198.18.0.12), ..." for the start line.
std::string DescribeNodes(const std::vector<NodeState>& nodes);

// The plan's note on the pipeline's links between hosts: ranks are node-major and a stage's
// neighbours are the next ranks, so neighbouring stages share a host wherever the counts allow (the
// fewest crossings: one per boundary between nodes). "links across hosts: stage 1 -> 2 (node 0 ->
// 1), ..." or "no link crosses hosts". `stage_rank` is the schedule's virtual stage -> rank.
std::string CrossHostLinks(const std::vector<int>& stage_rank, const std::vector<NodeState>& nodes);

// Wraps a partitioner so that its description ends with CrossHostLinks.
PartitionFn WithCrossHostLinks(PartitionFn inner, std::vector<NodeState> nodes);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_NODES_H_
