// One job across several hosts: the checks and notes (see nodes.h).
#include "launcher/multihost/nodes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/input_file.h"
#include "launcher/coordinator/coordinator_service.h"
#include "launcher/job/run_dir.h"

namespace stagehand {
namespace {

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

constexpr int kMaxNodes = 1024;

int NodeOf(int rank, const std::vector<NodeState>& nodes) {
  for (int k = static_cast<int>(nodes.size()) - 1; k >= 0; --k) {
    if (nodes[k].workers > 0 && rank >= nodes[k].first_rank) return k;
  }
  return 0;
}

}  // namespace

absl::Status CheckNodeOptions(const NodeOptions& n, const NodeTls& tls, const std::string& job_token_file) {
  if (n.nodes < 1 || n.nodes > kMaxNodes) return Invalid(absl::StrCat("--nodes=", n.nodes, ": pass 1 to ", kMaxNodes));
  if (n.node_rank < 0 || n.node_rank >= n.nodes) {
    return Invalid(absl::StrCat("--node_rank=", n.node_rank, " with --nodes=", n.nodes, ": pass 0 to ", n.nodes - 1,
                                " (0 coordinates the job)"));
  }
  if (n.node_rank > 0 && (n.coordinator_address.empty() || absl::EndsWith(n.coordinator_address, ":0"))) {
    return Invalid(absl::StrCat("--node_rank=", n.node_rank,
                                " is an agent: pass --coordinator_address=HOST:PORT, where node 0 serves"));
  }
  if (tls.enabled() && (tls.cert.empty() || tls.key.empty() || tls.ca.empty())) {
    return Invalid(
        "mutual TLS needs all three: --tls_cert and --tls_key (this host's certificate) and --tls_ca "
        "(the CA that signed every host's)");
  }
  if (!tls.enabled() && !IsLoopbackAddress(n.coordinator_address)) {
    return Invalid(absl::StrCat("--coordinator_address=", n.coordinator_address,
                                " is not loopback: every hop off this host needs mutual TLS; pass --tls_cert, "
                                "--tls_key and --tls_ca (the job's certificates), or use 127.0.0.1:PORT"));
  }
  if (tls.enabled()) {
    for (const auto& [flag, path, kind] : {std::tuple{"--tls_cert", tls.cert, PemKind::kCertificates},
                                           std::tuple{"--tls_key", tls.key, PemKind::kPrivateKey},
                                           std::tuple{"--tls_ca", tls.ca, PemKind::kCertificates}}) {
      if (absl::StatusOr<std::string> pem = ReadPemFile(flag, UserPath(path), kind); !pem.ok()) return pem.status();
    }
  }
  if (n.nodes > 1 && !tls.enabled() && job_token_file.empty()) {
    return Invalid(absl::StrCat("--nodes=", n.nodes,
                                " without TLS: pass --job_token_file=FILE (the same secret "
                                "file, mode 0600, on every node) so that agents can prove they belong to the job, "
                                "or --tls_cert, --tls_key and --tls_ca"));
  }
  if (!job_token_file.empty()) {
    if (absl::StatusOr<std::string> t = ReadJobToken(job_token_file); !t.ok()) return t.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadJobToken(const std::string& path) {
  const std::string full = UserPath(path);
  // A regular file only (common/input_file.h): a FIFO would block the launcher in open() or read().
  absl::StatusOr<RegularFile> file = OpenRegularFile(full, absl::StrCat("--job_token_file=", path));
  if (!file.ok()) {
    return Invalid(absl::StrCat(file.status().message(),
                                "; write a secret of 32 or more characters into a file "
                                "(e.g. openssl rand -hex 32 > FILE; chmod 600 FILE)"));
  }
  const struct stat st = file->st;
  if ((st.st_mode & 077) != 0) {
    return Invalid(absl::StrCat("--job_token_file=", path, ": readable by others (mode ",
                                absl::StrCat(st.st_mode & 0777), "); chmod 600 it"));
  }
  constexpr int64_t kMaxTokenBytes = 4096;
  if (st.st_size > kMaxTokenBytes) {
    return Invalid(
        absl::StrCat("--job_token_file=", path, ": ", st.st_size, " bytes; it should hold the secret alone"));
  }
  std::string text(kMaxTokenBytes, '\0');
  ssize_t n;
  while ((n = ::pread(file->fd.get(), text.data(), text.size(), 0)) < 0 && errno == EINTR) {
  }
  if (n < 0) return Invalid(absl::StrCat("--job_token_file=", path, ": cannot read it: ", ErrnoText(errno)));
  text.resize(static_cast<size_t>(n));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.size() < 32) {
    return Invalid(absl::StrCat("--job_token_file=", path, ": the secret is ", token.size(),
                                " characters; write 32 or more (openssl rand -hex 32)"));
  }
  return token;
}

std::vector<std::string> WorkerNodeArgs(const NodeTls& tls, const std::string& listen_host) {
  std::vector<std::string> args;
  if (tls.enabled()) {
    args.push_back("--tls_ca=" + UserPath(tls.ca));
    args.push_back("--tls_cert=" + UserPath(tls.cert));
    args.push_back("--tls_key=" + UserPath(tls.key));
  }
  if (!listen_host.empty()) args.push_back("--listen_host=" + listen_host);
  return args;
}

std::string HostOf(const std::string& address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return close == std::string::npos ? "" : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? "" : address.substr(0, colon);
}

std::string DescribeNodes(const std::vector<NodeState>& nodes) {
  std::vector<std::string> parts;
  for (int k = 0; k < static_cast<int>(nodes.size()); ++k) {
    const NodeState& n = nodes[k];
    const std::string ranks = n.workers == 1 ? absl::StrCat("rank ", n.first_rank)
                                             : absl::StrCat("ranks ", n.first_rank, "-", n.first_rank + n.workers - 1);
    parts.push_back(absl::StrCat(ranks, " on node ", k, " (", n.address, ")"));
  }
  return absl::StrJoin(parts, ", ");
}

std::string CrossHostLinks(const std::vector<int>& stage_rank, const std::vector<NodeState>& nodes) {
  std::vector<std::string> links;
  for (size_t s = 0; s + 1 < stage_rank.size(); ++s) {
    const int a = NodeOf(stage_rank[s], nodes), b = NodeOf(stage_rank[s + 1], nodes);
    if (a != b) links.push_back(absl::StrCat("stage ", s, " -> ", s + 1, " (node ", a, " -> ", b, ")"));
  }
  if (links.empty()) return "no link crosses hosts";
  return absl::StrCat("links across hosts: ", absl::StrJoin(links, ", "));
}

PartitionFn WithCrossHostLinks(PartitionFn inner, std::vector<NodeState> nodes) {
  return [inner = std::move(inner),
          nodes = std::move(nodes)](const std::vector<WorkerState>& workers) -> absl::StatusOr<Partition> {
    absl::StatusOr<Partition> p = inner(workers);
    if (!p.ok() || p->schedules.empty()) return p;
    const RankSchedule& s = p->schedules[0];
    std::vector<int> stage_rank(s.stage_rank().begin(), s.stage_rank().end());
    absl::StrAppend(&p->description, "; ", CrossHostLinks(stage_rank, nodes));
    return p;
  };
}

}  // namespace stagehand
