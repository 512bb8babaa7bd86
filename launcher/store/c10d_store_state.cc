// The c10d store's protocol and state (see c10d_store_state.h). Values are never put in a message:
// NCCL's unique id passes through this store and is a bearer secret.
#include "launcher/store/c10d_store_state.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

constexpr uint8_t kNumQueries = static_cast<uint8_t>(C10dQuery::kListKeys) + 1;

// A key as it may appear in a message: escaped, and cut if long (keys are not secret, values are).
std::string KeyForLog(absl::string_view key) {
  constexpr size_t kShown = 96;
  if (key.size() <= kShown) return absl::StrCat("'", absl::CHexEscape(key), "'");
  return absl::StrCat("'", absl::CHexEscape(key.substr(0, kShown)), "...' (", key.size(), " bytes)");
}

size_t EntryBytes(size_t key_bytes, size_t value_bytes) {
  return key_bytes + value_bytes + C10dStoreState::kEntryOverheadBytes;
}

// Answers in the host's byte order, as torch's client reads them.
template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void PutBytes(std::string& out, absl::string_view bytes) {
  Put<uint64_t>(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

}  // namespace

// Reads one request's fields from the bytes received; a field not all there yet sets needed() (the
// request's length so far, at least) and returns false; a field over a limit sets error().
class C10dStoreState::Reader {
 public:
  Reader(absl::string_view data, const C10dStoreLimits& limits) : data_(data), limits_(limits) {}

  template <typename T>
  bool Fixed(T* out) {
    if (!Have(sizeof(T))) return false;
    std::memcpy(out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Key(absl::string_view* out) { return Bytes(limits_.max_key_bytes, "key", out); }
  bool Value(absl::string_view* out) { return Bytes(limits_.max_value_bytes, "value", out); }
  // A key count (CHECK, WAIT, MULTI_GET, MULTI_SET).
  bool Count(uint64_t* out) {
    if (!Fixed(out)) return false;
    if (*out > limits_.max_keys_per_request) {
      error_ = absl::ResourceExhaustedError(
          absl::StrCat(*out, " keys in one request; the store takes at most ", limits_.max_keys_per_request));
      return false;
    }
    return true;
  }

  size_t pos() const { return pos_; }
  size_t needed() const { return needed_; }
  const absl::Status& error() const { return error_; }
  void set_error(absl::Status error) { error_ = std::move(error); }

 private:
  bool Have(size_t n) {
    if (data_.size() - pos_ >= n) return true;
    needed_ = pos_ + n;
    return false;
  }
  bool Bytes(size_t max, absl::string_view what, absl::string_view* out) {
    uint64_t n = 0;
    if (!Fixed(&n)) return false;
    if (n > max) {
      error_ =
          absl::ResourceExhaustedError(absl::StrCat("a ", what, " of ", n, " bytes; the store takes at most ", max));
      return false;
    }
    if (!Have(n)) return false;
    *out = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }

  absl::string_view data_;
  const C10dStoreLimits& limits_;
  size_t pos_ = 0;
  size_t needed_ = 0;
  absl::Status error_;
};

C10dStoreState::C10dStoreState(C10dStoreLimits limits) : limits_(limits) {}

void C10dStoreState::Connect(ClientId id) { clients_[id]; }

void C10dStoreState::Disconnect(ClientId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  EndWait(id, it->second);
  clients_.erase(it);
}

absl::Status C10dStoreState::Receive(ClientId id, absl::string_view bytes) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return absl::FailedPreconditionError("no such connection");
  Client& client = it->second;
  client.input.append(bytes.data(), bytes.size());
  size_t consumed = 0;
  absl::Status status;
  while (client.output.size() - client.output_sent < limits_.output_pause_bytes &&
         client.input.size() - consumed >= client.input_needed) {
    Reader reader(absl::string_view(client.input).substr(consumed), limits_);
    absl::StatusOr<Parse> parsed = ProcessOne(id, client, reader);
    if (!parsed.ok()) {
      status = parsed.status();
      break;
    }
    if (*parsed == Parse::kNeedMore) {
      if (reader.needed() > limits_.max_request_bytes) {
        status =
            absl::ResourceExhaustedError(absl::StrCat("a request of more than ", limits_.max_request_bytes, " bytes"));
        break;
      }
      client.input_needed = reader.needed();
      break;
    }
    consumed += reader.pos();
    client.input_needed = 1;
  }
  client.input.erase(0, consumed);
  return status;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::ProcessOne(ClientId id, Client& client, Reader& reader) {
  uint8_t type = 0;
  if (!reader.Fixed(&type)) return Parse::kNeedMore;
  if (type >= kNumQueries) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown query type ", int{type}, " (torch 2.11 has 0 to ", kNumQueries - 1, ")"));
  }
  const auto query = static_cast<C10dQuery>(type);
  if (!client.validated) {
    if (query != C10dQuery::kValidate) {
      return absl::InvalidArgumentError(
          absl::StrCat("query type ", int{type}, " before VALIDATE: not a torch TCPStore client"));
    }
    uint32_t magic = 0;
    if (!reader.Fixed(&magic)) return Parse::kNeedMore;
    if (magic != kC10dValidationMagic) {
      return absl::InvalidArgumentError(absl::StrCat("VALIDATE with magic 0x", absl::Hex(magic), " (torch's is 0x",
                                                     absl::Hex(kC10dValidationMagic),
                                                     "): not a torch TCPStore client"));
    }
    client.validated = true;
    return Parse::kDone;
  }
  absl::StatusOr<Parse> parsed = Dispatch(id, client, query, reader);
  if (parsed.ok() && *parsed == Parse::kNeedMore && !reader.error().ok()) return reader.error();
  return parsed;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::Dispatch(ClientId id, Client& client, C10dQuery query,
                                                               Reader& r) {
  std::string& out = client.output;
  switch (query) {
    case C10dQuery::kValidate:
      return absl::InvalidArgumentError("a second VALIDATE on one connection");
    case C10dQuery::kPing: {
      uint32_t nonce = 0;
      if (!r.Fixed(&nonce)) return Parse::kNeedMore;
      Put<uint32_t>(out, nonce);
      return Parse::kDone;
    }
    case C10dQuery::kSet:
    case C10dQuery::kAppend:
      return SetOrAppend(query, r);
    case C10dQuery::kCompareSet:
      return CompareSet(out, r);
    case C10dQuery::kGet: {
      absl::string_view key;
      if (!r.Key(&key)) return Parse::kNeedMore;
      PutBytes(out, ValueOrEmpty(key));
      return Parse::kDone;
    }
    case C10dQuery::kAdd:
      return Add(out, r);
    case C10dQuery::kCheck:
    case C10dQuery::kWait:
    case C10dQuery::kMultiGet:
      return KeysQuery(id, client, query, r);
    case C10dQuery::kGetNumKeys:
      Put<int64_t>(out, static_cast<int64_t>(values_.size()));
      return Parse::kDone;
    case C10dQuery::kDeleteKey:
      return DeleteKey(out, r);
    case C10dQuery::kMultiSet:
      return MultiSet(r);
    case C10dQuery::kCancelWait:
      EndWait(id, client);
      Put<uint8_t>(out, kC10dWaitCanceled);
      return Parse::kDone;
    case C10dQuery::kQueuePush:
      return QueuePush(r);
    case C10dQuery::kQueuePop:
    case C10dQuery::kQueueLen:
      return QueuePopOrLen(out, query, r);
    case C10dQuery::kListKeys:
      Put<int64_t>(out, static_cast<int64_t>(values_.size()));
      for (const auto& [k, v] : values_) PutBytes(out, k);
      return Parse::kDone;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown query type ", static_cast<int>(query)));
}

absl::string_view C10dStoreState::ValueOrEmpty(absl::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? absl::string_view() : absl::string_view(it->second);
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::SetOrAppend(C10dQuery query, Reader& r) {
  absl::string_view key, value;
  if (!r.Key(&key) || !r.Value(&value)) return Parse::kNeedMore;
  const std::string k(key);
  auto it = values_.find(k);
  if (query == C10dQuery::kSet || it == values_.end()) {
    if (absl::Status s = SetValue(k, std::string(value), query == C10dQuery::kSet ? "SET" : "APPEND"); !s.ok()) {
      return s;
    }
    return Parse::kDone;
  }
  if (it->second.size() + value.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("APPEND to key ", KeyForLog(k), " makes a value of ",
                                                     it->second.size() + value.size(),
                                                     " bytes; the store takes at most ", limits_.max_value_bytes));
  }
  if (absl::Status s = CheckGrowth(0, value.size(), "APPEND", k); !s.ok()) return s;
  it->second.append(value.data(), value.size());
  total_bytes_ += value.size();
  Wake(k, /*queue_item=*/false);
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::CompareSet(std::string& out, Reader& r) {
  absl::string_view key, expected, desired;
  if (!r.Key(&key) || !r.Value(&expected) || !r.Value(&desired)) return Parse::kNeedMore;
  const std::string k(key);
  auto it = values_.find(k);
  if (it == values_.end()) {
    // torch answers a missing key with `expected` unless that is empty (then it sets the key).
    if (!expected.empty()) {
      PutBytes(out, expected);
      return Parse::kDone;
    }
  } else if (it->second != expected) {
    PutBytes(out, it->second);
    return Parse::kDone;
  }
  if (absl::Status s = SetValue(k, std::string(desired), "COMPARE_SET"); !s.ok()) return s;
  PutBytes(out, desired);
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::Add(std::string& out, Reader& r) {
  absl::string_view key;
  int64_t delta = 0;
  if (!r.Key(&key) || !r.Fixed(&delta)) return Parse::kNeedMore;
  const std::string k(key);
  int64_t sum = delta;
  if (auto it = values_.find(k); it != values_.end()) {
    int64_t old = 0;
    if (!absl::SimpleAtoi(it->second, &old)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ADD to key ", KeyForLog(k), " whose value is not a decimal integer"));
    }
    if (__builtin_add_overflow(old, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("ADD to key ", KeyForLog(k), " overflows int64"));
    }
  }
  if (absl::Status s = SetValue(k, absl::StrCat(sum), "ADD"); !s.ok()) return s;
  Put<int64_t>(out, sum);
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::KeysQuery(ClientId id, Client& client, C10dQuery query,
                                                                Reader& r) {
  uint64_t n = 0;
  if (!r.Count(&n)) return Parse::kNeedMore;
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    absl::string_view key;
    if (!r.Key(&key)) return Parse::kNeedMore;
    keys.emplace_back(key);
  }
  std::string& out = client.output;
  if (query == C10dQuery::kCheck) {
    const bool ready = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return KeyReady(k); });
    Put<uint8_t>(out, ready ? kC10dCheckReady : kC10dCheckNotReady);
    return Parse::kDone;
  }
  if (query == C10dQuery::kWait) {
    if (client.waiting) return absl::InvalidArgumentError("a WAIT while another is not answered");
    StartWait(id, client, std::move(keys));
    return Parse::kDone;
  }
  size_t answer = 0;
  for (const std::string& k : keys) answer += sizeof(uint64_t) + ValueOrEmpty(k).size();
  if (answer > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("MULTI_GET of ", n, " keys answers ", answer,
                                                     " bytes; the store sends at most ", limits_.max_total_bytes));
  }
  for (const std::string& k : keys) PutBytes(out, ValueOrEmpty(k));
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::DeleteKey(std::string& out, Reader& r) {
  absl::string_view key;
  if (!r.Key(&key)) return Parse::kNeedMore;
  auto it = values_.find(key);
  const bool found = it != values_.end();
  if (found) {
    total_bytes_ -= EntryBytes(it->first.size(), it->second.size());
    values_.erase(it);
  }
  Put<int64_t>(out, found ? 1 : 0);
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::MultiSet(Reader& r) {
  uint64_t n = 0;
  if (!r.Count(&n)) return Parse::kNeedMore;
  std::vector<std::pair<absl::string_view, absl::string_view>> pairs;
  pairs.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    absl::string_view key, value;
    if (!r.Key(&key) || !r.Value(&value)) return Parse::kNeedMore;
    pairs.emplace_back(key, value);
  }
  // All or nothing: the growth of the whole request checked first (the last value of a key wins).
  absl::flat_hash_map<absl::string_view, absl::string_view> last;
  for (const auto& [k, v] : pairs) last[k] = v;
  size_t old_bytes = 0, new_bytes = 0;
  for (const auto& [k, v] : last) {
    if (auto it = values_.find(k); it != values_.end()) old_bytes += EntryBytes(k.size(), it->second.size());
    new_bytes += EntryBytes(k.size(), v.size());
  }
  const std::string first(pairs.empty() ? absl::string_view() : pairs[0].first);
  if (absl::Status s = CheckGrowth(old_bytes, new_bytes, "MULTI_SET", first); !s.ok()) return s;
  for (const auto& [k, v] : pairs) StoreValue(std::string(k), std::string(v));
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::QueuePush(Reader& r) {
  absl::string_view key, value;
  if (!r.Key(&key) || !r.Value(&value)) return Parse::kNeedMore;
  const std::string k(key);
  auto it = queues_.find(k);
  const size_t growth = EntryBytes(0, value.size()) + (it == queues_.end() ? EntryBytes(k.size(), 0) : 0);
  if (absl::Status s = CheckGrowth(0, growth, "QUEUE_PUSH", k); !s.ok()) return s;
  queues_[k].emplace_back(value);
  total_bytes_ += growth;
  Wake(k, /*queue_item=*/true);
  return Parse::kDone;
}

absl::StatusOr<C10dStoreState::Parse> C10dStoreState::QueuePopOrLen(std::string& out, C10dQuery query, Reader& r) {
  absl::string_view key;
  if (!r.Key(&key)) return Parse::kNeedMore;
  auto it = queues_.find(key);
  const size_t length = it == queues_.end() ? 0 : it->second.size();
  Put<int64_t>(out, static_cast<int64_t>(length));  // QUEUE_POP: the length before, then the item
  if (query == C10dQuery::kQueueLen || length == 0) return Parse::kDone;
  PutBytes(out, it->second.front());
  total_bytes_ -= EntryBytes(0, it->second.front().size());
  it->second.pop_front();
  if (it->second.empty()) {
    total_bytes_ -= EntryBytes(it->first.size(), 0);
    queues_.erase(it);
  }
  return Parse::kDone;
}

absl::Status C10dStoreState::CheckGrowth(size_t old_bytes, size_t new_bytes, absl::string_view what,
                                         const std::string& key) const {
  if (new_bytes <= old_bytes || total_bytes_ - old_bytes + new_bytes <= limits_.max_total_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(what, " of key ", KeyForLog(key), " would make the store hold ",
                                                   total_bytes_ - old_bytes + new_bytes, " bytes; it holds at most ",
                                                   limits_.max_total_bytes));
}

absl::Status C10dStoreState::SetValue(const std::string& key, std::string value, absl::string_view what) {
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : EntryBytes(key.size(), it->second.size());
  const size_t new_bytes = EntryBytes(key.size(), value.size());
  if (absl::Status s = CheckGrowth(old_bytes, new_bytes, what, key); !s.ok()) return s;
  StoreValue(key, std::move(value));
  return absl::OkStatus();
}

void C10dStoreState::StoreValue(const std::string& key, std::string value) {
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : EntryBytes(key.size(), it->second.size());
  total_bytes_ = total_bytes_ - old_bytes + EntryBytes(key.size(), value.size());
  if (it == values_.end()) {
    values_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  Wake(key, /*queue_item=*/false);
}

bool C10dStoreState::KeyReady(const std::string& key) const {
  if (values_.contains(key)) return true;
  auto it = queues_.find(key);
  return it != queues_.end() && !it->second.empty();
}

void C10dStoreState::StartWait(ClientId id, Client& client, std::vector<std::string> keys) {
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> missing;
  for (std::string& k : keys) {
    if (!KeyReady(k) && seen.insert(k).second) missing.push_back(std::move(k));
  }
  if (missing.empty()) {
    Put<uint8_t>(client.output, kC10dStopWaiting);
    return;
  }
  for (const std::string& k : missing) waiters_[k].push_back(id);
  client.waiting = true;
  client.waiter.missing = missing.size();
  client.waiter.keys = std::move(missing);
}

void C10dStoreState::EndWait(ClientId id, Client& client) {
  if (!client.waiting) return;
  for (const std::string& k : client.waiter.keys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    std::vector<ClientId>& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  client.waiting = false;
  client.waiter = Waiter();
}

void C10dStoreState::Wake(const std::string& key, bool queue_item) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<ClientId> woken;
  if (queue_item) {
    // One item: one waiter (the first) may pop it; the others wait on.
    woken.push_back(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) waiters_.erase(it);
  } else {
    woken = std::move(it->second);
    waiters_.erase(it);
  }
  for (ClientId id : woken) {
    auto c = clients_.find(id);
    if (c == clients_.end() || !c->second.waiting) continue;
    Client& client = c->second;
    if (--client.waiter.missing > 0) continue;
    Put<uint8_t>(client.output, kC10dStopWaiting);
    EndWait(id, client);
  }
}

absl::string_view C10dStoreState::Output(ClientId id) const {
  auto it = clients_.find(id);
  if (it == clients_.end()) return {};
  return absl::string_view(it->second.output).substr(it->second.output_sent);
}

void C10dStoreState::ConsumeOutput(ClientId id, size_t n) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& client = it->second;
  client.output_sent = std::min(client.output.size(), client.output_sent + n);
  if (client.output_sent == client.output.size()) {
    client.output.clear();
    client.output_sent = 0;
  } else if (client.output_sent >= (size_t{1} << 20) && client.output_sent * 2 >= client.output.size()) {
    client.output.erase(0, client.output_sent);  // amortized: at most half of it moved
    client.output_sent = 0;
  }
}

bool C10dStoreState::WantsInput(ClientId id) const {
  auto it = clients_.find(id);
  if (it == clients_.end()) return false;
  const Client& client = it->second;
  return client.output.size() - client.output_sent < limits_.output_pause_bytes &&
         client.input.size() < client.input_needed;
}

bool C10dStoreState::HasPendingInput(ClientId id) const {
  auto it = clients_.find(id);
  return it != clients_.end() && !it->second.input.empty() && it->second.input.size() >= it->second.input_needed;
}

size_t C10dStoreState::num_waiting() const {
  size_t n = 0;
  for (const auto& [id, client] : clients_) n += client.waiting ? 1 : 0;
  return n;
}

}  // namespace stagehand
