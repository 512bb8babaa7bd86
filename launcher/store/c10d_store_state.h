// The c10d store without sockets: torch's TCPStore wire protocol (torch 2.11) parsed from each
// connection's bytes, the key-value state, the queues and the waiters, and the replies to send back.
// C10dStoreServer (c10d_store.h) moves bytes between sockets and this class; tests drive it directly.
//
// The protocol, as torch 2.11's client speaks it (torch/csrc/distributed/c10d/TCPStore.cpp): every
// request is one byte of query type and its arguments; integers are the host's (little-endian) bytes;
// a string or a byte vector is a uint64 length and that many bytes. A connection's first request is
// VALIDATE with a uint32 magic number (no answer); the client then PINGs a uint32 nonce and expects it
// back. SET, APPEND, MULTI_SET and QUEUE_PUSH get no answer. WAIT is answered (one byte, STOP_WAITING)
// only once every key it names is there, which may be much later; a client that gives up sends
// CANCEL_WAIT and reads WAIT_CANCELED (after a STOP_WAITING already on its way, if the key came in
// time). The client's own timeouts are its business: the server never times a request out.
#ifndef STAGEHAND_LAUNCHER_STORE_C10D_STORE_STATE_H_
#define STAGEHAND_LAUNCHER_STORE_C10D_STORE_STATE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagehand {

// torch 2.11's c10d::detail::QueryType, by value (the wire's first byte).
enum class C10dQuery : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
};

// The answers' bytes (CheckResponseType and WaitResponseType).
inline constexpr uint8_t kC10dCheckReady = 0;
inline constexpr uint8_t kC10dCheckNotReady = 1;
inline constexpr uint8_t kC10dStopWaiting = 0;
inline constexpr uint8_t kC10dWaitCanceled = 1;
inline constexpr uint32_t kC10dValidationMagic = 0x3C85F7CE;

// What one store holds and accepts. A request over a limit closes its connection (the protocol has
// no error answer); the store and every other connection go on.
struct C10dStoreLimits {
  size_t max_key_bytes = 8 * 1024;               // torch's own server allows 8 KiB too
  size_t max_value_bytes = size_t{64} << 20;     // one value, one queue item
  size_t max_total_bytes = size_t{512} << 20;    // keys, values and queued items held, and one answer
  size_t max_keys_per_request = 128 * 1024;      // CHECK, WAIT, MULTI_GET, MULTI_SET
  size_t max_request_bytes = size_t{128} << 20;  // one request as it arrives (a MULTI_SET's all)
  size_t output_pause_bytes = size_t{1} << 20;   // unsent answers above which a connection's
                                                 // further requests wait (it does not read them)
};

class C10dStoreState {
 public:
  using ClientId = uint64_t;
  // Bookkeeping per key held (map entry, hashing), counted against max_total_bytes.
  static constexpr size_t kEntryOverheadBytes = 64;

  explicit C10dStoreState(C10dStoreLimits limits = {});

  // A new connection; ids are the caller's and never reused while connected.
  void Connect(ClientId id);
  // The connection is gone: its waits are dropped, its unsent answers discarded.
  void Disconnect(ClientId id);

  // Bytes that arrived from `id`: appended to what it sent before, and every whole request answered
  // (while its unsent answers stay under output_pause_bytes). Not OK when `id` must be closed:
  // INVALID_ARGUMENT for a malformed or unknown request, RESOURCE_EXHAUSTED for one over a limit;
  // the message names the request and the key, never a value.
  absl::Status Receive(ClientId id, absl::string_view bytes);
  // Answers the requests already received once the unsent answers dropped (same errors as Receive).
  absl::Status Resume(ClientId id) { return Receive(id, {}); }

  // Bytes to send to `id`, in order; ConsumeOutput drops the first n once they are sent. A set key
  // can add bytes to other connections' output (their waits answered).
  absl::string_view Output(ClientId id) const;
  void ConsumeOutput(ClientId id, size_t n);
  // Whether to read more from `id`: false while its answers pile up or a request fills the limit.
  bool WantsInput(ClientId id) const;
  // Whether whole requests wait in `id`'s input (Resume answers them).
  bool HasPendingInput(ClientId id) const;

  size_t num_clients() const { return clients_.size(); }
  size_t num_keys() const { return values_.size(); }
  size_t total_bytes() const { return total_bytes_; }
  // Connections with a WAIT not yet answered.
  size_t num_waiting() const;

 private:
  struct Waiter {
    size_t missing = 0;  // keys of its WAIT not yet there
    std::vector<std::string> keys;
  };
  struct Client {
    bool validated = false;
    std::string input;
    size_t input_needed = 1;  // bytes the next request needs at least (no parse before then)
    std::string output;
    size_t output_sent = 0;  // bytes of `output` already sent
    bool waiting = false;
    Waiter waiter;
  };
  class Reader;
  enum class Parse { kDone, kNeedMore };

  absl::Status ProcessInput(Client& client);
  // One request from the reader: kNeedMore with nothing changed when it is incomplete.
  absl::StatusOr<Parse> ProcessOne(ClientId id, Client& client, Reader& reader);
  absl::StatusOr<Parse> Dispatch(ClientId id, Client& client, C10dQuery query, Reader& reader);
  // The queries, each answering into `out` (the connection's output).
  absl::StatusOr<Parse> SetOrAppend(C10dQuery query, Reader& reader);
  absl::StatusOr<Parse> CompareSet(std::string& out, Reader& reader);
  absl::StatusOr<Parse> Add(std::string& out, Reader& reader);
  absl::StatusOr<Parse> KeysQuery(ClientId id, Client& client, C10dQuery query, Reader& reader);
  absl::StatusOr<Parse> DeleteKey(std::string& out, Reader& reader);
  absl::StatusOr<Parse> MultiSet(Reader& reader);
  absl::StatusOr<Parse> QueuePush(Reader& reader);
  absl::StatusOr<Parse> QueuePopOrLen(std::string& out, C10dQuery query, Reader& reader);
  absl::string_view ValueOrEmpty(absl::string_view key) const;

  // SetValue checks the growth against max_total_bytes; StoreValue does not (checked before).
  absl::Status SetValue(const std::string& key, std::string value, absl::string_view what);
  void StoreValue(const std::string& key, std::string value);
  absl::Status CheckGrowth(size_t old_bytes, size_t new_bytes, absl::string_view what, const std::string& key) const;
  bool KeyReady(const std::string& key) const;
  void StartWait(ClientId id, Client& client, std::vector<std::string> keys);
  void EndWait(ClientId id, Client& client);
  // A key got a value: every waiter on it is one key nearer; queue_item: only the first is.
  void Wake(const std::string& key, bool queue_item);

  C10dStoreLimits limits_;
  absl::flat_hash_map<ClientId, Client> clients_;
  absl::flat_hash_map<std::string, std::string> values_;
  absl::flat_hash_map<std::string, std::deque<std::string>> queues_;
  absl::flat_hash_map<std::string, std::vector<ClientId>> waiters_;  // key -> connections, in order
  size_t total_bytes_ = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_STORE_C10D_STORE_STATE_H_
