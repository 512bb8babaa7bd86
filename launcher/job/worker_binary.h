// The worker binary the launcher spawns and the environment it gets.
#ifndef STAGEHAND_LAUNCHER_JOB_WORKER_BINARY_H_
#define STAGEHAND_LAUNCHER_JOB_WORKER_BINARY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {

// `given` (resolved against the user's directory), or the worker beside the launcher (the bundle) or
// in ../worker/ (bazel-bin). INVALID_ARGUMENT saying to pass --worker_binary when there is none.
absl::StatusOr<std::string> FindWorker(const std::string& given);

// The folder of the pure-Python `stagehand` module (python/stagehand) that a program job's ranks get on
// their PYTHONPATH: beside the launcher in the bundle (python/), in its runfiles in bazel-bin, else in
// the runfiles of the test or binary that runs it ($RUNFILES_DIR, $TEST_SRCDIR); "" when none has it.
std::string FindProgramModuleDir();

// What a program job's ranks get beside torchrun's variables: MASTER_ADDR and MASTER_PORT (the c10d
// store at `host`:`port`), PYTHONPATH with the `stagehand` module ahead of the launcher's own, and
// for a store on a network address (several hosts) GLOO_SOCKET_IFNAME (GlooSocketIfnameEntry).
std::vector<std::string> ProgramStoreEnv(const std::string& host, int port);

// The non-loopback network interface that holds the address this host sends from to reach `host` (an
// IPv4 or IPv6 address literal; no name is looked up), as GLOO_SOCKET_IFNAME names it; "" when `host`
// is no literal, no route leads there, or the address is on a loopback interface.
std::string InterfaceToward(const std::string& host);

// "GLOO_SOCKET_IFNAME=<interface_toward(store_host)>" for the ranks of a job whose c10d store is at
// `store_host`. Gloo binds where the host's name resolves, else to loopback: on a host whose name
// maps to 127.0.1.1 (Debian's /etc/hosts) or to nothing, the ranks of the other hosts cannot reach
// it. The interface toward the store is the one the job's hosts reach each other on. "" (nothing to
// add) when `launcher_env` ("NAME=value" entries) sets GLOO_SOCKET_IFNAME, which then passes through
// unchanged, or when interface_toward gives "" (a store on loopback: one host, Gloo's default holds).
std::string GlooSocketIfnameEntry(const std::string& store_host, const std::vector<std::string>& launcher_env,
                                  const std::function<std::string(const std::string&)>& interface_toward);

// The workers' environment: the launcher's, less what the supervisor sets per worker, with OMP threads
// shared out among `workers` and NVLink multicast off. Everything else passes unchanged, NCCL's
// socket and InfiniBand settings among it (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_IB_HCA,
// NCCL_IB_DISABLE, NCCL_DEBUG, ...): on several hosts each launcher builds its own workers'
// environment, so an agent's workers get the agent host's settings. `workers` counts every worker on
// this machine, other launchers' of the job too (several nodes on one machine); `cores` is the
// machine's (0: std::thread::hardware_concurrency()).
std::vector<std::string> WorkerEnvironment(int workers, int cores = 0);

// The same from `launcher_env` ("NAME=value" entries) on a machine of `cores` cores.
std::vector<std::string> WorkerEnvironmentFrom(const std::vector<std::string>& launcher_env, int workers, int cores);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_WORKER_BINARY_H_
