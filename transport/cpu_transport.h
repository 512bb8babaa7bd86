// The CPU transport: a full TCP mesh between the ranks of one communicator, for workers without GPUs,
// for CI and (later) for reaching other hosts. Correctness and clear failures matter here, speed does not.
#ifndef STAGEHAND_TRANSPORT_CPU_TRANSPORT_H_
#define STAGEHAND_TRANSPORT_CPU_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/transport.h"

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
  // The job secret (the launcher hands it to each worker on a pipe); required when world_size > 1.
  // Both sides of every connection prove they hold it (HMAC-SHA256 over fresh nonces from both); it
  // never goes on the wire and is never logged.
  std::string secret;
  // Bounds the handshake of each incoming connection: one that stalls is dropped after it, while the
  // others (a real peer among them) go on meanwhile.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Called with why each dropped connection was dropped (from the transport's threads: during the
  // rendezvous, then a thread of its own), beside the warning in the log; for tests and counters.
  std::function<void(const absl::Status&)> on_dropped_connection;
};

// Publishes this rank's address under "<key_prefix>/cpu/addr/<rank>", reads the lower ranks'
// addresses, connects to each of them and accepts a connection from each higher rank; every connection
// passes a mutual challenge on the job secret (the layout is in cpu_transport.cc). A connection that
// fails any check on the accepting side (junk, a short read, a wrong MAC, a rank already connected,
// handshake_timeout passed) is dropped with a warning and the rank goes on accepting: a stranger cannot
// fail the rendezvous, only the deadline can. The listener stays open, dropping every newcomer, for
// the transport's life.
// Errors:
//   INVALID_ARGUMENT   rank or world_size out of range, no secret, listen_host unusable, or the lower
//                      rank's answer disagrees (world size, key_prefix, rank) or is not this protocol.
//   PERMISSION_DENIED  the lower rank did not prove the job secret (the two were given different ones).
//   ALREADY_EXISTS     the address key already holds another address (key_prefix reused).
//   DEADLINE_EXCEEDED  a peer did not publish, connect or answer within connect_timeout (the message
//                      says how many connections were dropped meanwhile and why the last one was).
//   UNAVAILABLE        a peer closed its connection during the handshake (it refused this rank: its
//                      log says why), or a socket call failed.
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
absl::StatusOr<std::unique_ptr<Transport>> ConnectCpuTransport(const CpuTransportOptions& options, KeyValueStore& kv);

}  // namespace stagehand

#endif  // STAGEHAND_TRANSPORT_CPU_TRANSPORT_H_
