// The CPU transport: a full TCP mesh between the ranks of one communicator, for workers without GPUs,
// for CI and (later) for reaching other hosts. Correctness and clear failures matter here, speed does not.
#ifndef STAGEHAND_WORKER_CPU_TRANSPORT_H_
#define STAGEHAND_WORKER_CPU_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/transport.h"

namespace stagehand {

struct CpuTransportOptions {
  int rank = 0;
  int world_size = 1;
  // The address the other ranks use to reach this rank; it listens there on a port the kernel picks.
  std::string listen_host = "127.0.0.1";
  // Namespaces the rendezvous keys (the job id and communicator name), so that two communicators
  // sharing one store never meet; ranks whose prefixes differ refuse each other's connections.
  std::string key_prefix;
  // Bounds the whole rendezvous: publishing, waiting for the others' addresses, connecting, handshakes.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Bounds each Send/Recv (and each step of AllReduceSum) when finite: the whole message must move
  // within it, or the call fails with DEADLINE_EXCEEDED naming the peer.
  absl::Duration io_timeout = absl::InfiniteDuration();
};

// Publishes this rank's address under "<key_prefix>/cpu/addr/<rank>", reads the lower ranks'
// addresses, connects to each of them and accepts a connection from each higher rank.
// Errors:
//   INVALID_ARGUMENT   rank or world_size out of range, listen_host unusable, or a peer's hello
//                      disagrees (world size, key_prefix) or is not from this protocol.
//   ALREADY_EXISTS     the address key already holds another address (key_prefix reused).
//   DEADLINE_EXCEEDED  a peer did not publish, connect or answer within connect_timeout.
//   UNAVAILABLE        a peer closed its connection during the handshake, or a socket call failed.
// The rendezvous cannot be aborted (there is no Transport yet): connect_timeout bounds it.
//
// Errors of the returned transport's operations:
//   INVALID_ARGUMENT   peer out of range or this rank, negative size or count.
//   UNIMPLEMENTED      AllReduceSum of bfloat16.
//   UNAVAILABLE        the peer closed the connection ("rank 2 closed the connection") or a socket failed.
//   INTERNAL           Recv got a message of another length than asked for (the schedules disagree).
//   DEADLINE_EXCEEDED  io_timeout passed (the message names the peer).
//   FAILED_PRECONDITION  an earlier error left the connection to that peer out of step.
//   CANCELLED          Abort() was called ("transport aborted").
// AllReduceSum reduces at rank 0 in rank order and broadcasts the result: deterministic and
// bit-identical on every rank.
absl::StatusOr<std::unique_ptr<Transport>> ConnectCpuTransport(const CpuTransportOptions& options,
                                                               KeyValueStore& kv);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_CPU_TRANSPORT_H_
