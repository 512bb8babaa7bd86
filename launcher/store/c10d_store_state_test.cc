// C10dStoreState without sockets: every query type's answer as torch 2.11's client reads it, waits
// answered when their keys come, malformed requests and the limits.
#include "launcher/store/c10d_store_state.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stagehand {
namespace {

// A request as torch's client writes it (host byte order, uint64 lengths).
class Request {
 public:
  explicit Request(C10dQuery query) { U8(static_cast<uint8_t>(query)); }
  template <typename T>
  Request& Raw(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    bytes_.append(bytes, sizeof(T));
    return *this;
  }
  Request& U8(uint8_t v) { return Raw(v); }
  Request& U32(uint32_t v) { return Raw(v); }
  Request& U64(uint64_t v) { return Raw(v); }
  Request& I64(int64_t v) { return Raw(v); }
  Request& Str(const std::string& s) {
    U64(s.size());
    bytes_ += s;
    return *this;
  }
  Request& Keys(const std::vector<std::string>& keys) {
    U64(keys.size());
    for (const std::string& k : keys) Str(k);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  operator absl::string_view() const { return bytes_; }

 private:
  std::string bytes_;
};

std::string Validate() { return Request(C10dQuery::kValidate).U32(kC10dValidationMagic).bytes(); }
std::string Set(const std::string& k, const std::string& v) { return Request(C10dQuery::kSet).Str(k).Str(v).bytes(); }
std::string Get(const std::string& k) { return Request(C10dQuery::kGet).Str(k).bytes(); }
std::string Wait(const std::vector<std::string>& keys) { return Request(C10dQuery::kWait).Keys(keys).bytes(); }

// Reads answers off a connection's output, as the client would.
class Answers {
 public:
  Answers(C10dStoreState& state, C10dStoreState::ClientId id) : state_(state), id_(id) {}
  template <typename T>
  T Raw() {
    absl::string_view out = state_.Output(id_);
    EXPECT_GE(out.size(), sizeof(T));
    T value{};
    if (out.size() < sizeof(T)) return value;
    std::memcpy(&value, out.data(), sizeof(T));
    state_.ConsumeOutput(id_, sizeof(T));
    return value;
  }
  uint8_t U8() { return Raw<uint8_t>(); }
  int64_t I64() { return Raw<int64_t>(); }
  std::string Bytes() {
    const uint64_t n = Raw<uint64_t>();
    absl::string_view out = state_.Output(id_);
    EXPECT_GE(out.size(), n);
    std::string value(out.substr(0, n));
    state_.ConsumeOutput(id_, value.size());
    return value;
  }
  bool empty() const { return state_.Output(id_).empty(); }

 private:
  C10dStoreState& state_;
  C10dStoreState::ClientId id_;
};

class C10dStoreStateTest : public ::testing::Test {
 protected:
  explicit C10dStoreStateTest(C10dStoreLimits limits = {}) : state_(limits) {}
  void SetUp() override {
    for (C10dStoreState::ClientId id : {1, 2, 3}) {
      state_.Connect(id);
      ASSERT_TRUE(state_.Receive(id, Validate()).ok());
    }
  }
  absl::Status Send(C10dStoreState::ClientId id, absl::string_view bytes) { return state_.Receive(id, bytes); }

  C10dStoreState state_;
  Answers a1_{state_, 1}, a2_{state_, 2}, a3_{state_, 3};
};

TEST_F(C10dStoreStateTest, Validate_AnswersNothing) { EXPECT_TRUE(a1_.empty()); }

TEST(C10dStoreStateValidate, Validate_NotFirst_IsInvalidArgument) {
  C10dStoreState state;
  state.Connect(7);
  absl::Status s = state.Receive(7, Get("/k"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("before VALIDATE"), absl::string_view::npos) << s;
}

TEST(C10dStoreStateValidate, Validate_WrongMagic_IsInvalidArgument) {
  C10dStoreState state;
  state.Connect(7);
  absl::Status s = state.Receive(7, Request(C10dQuery::kValidate).U32(0x12345678));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0x12345678"), absl::string_view::npos) << s;
}

TEST_F(C10dStoreStateTest, Validate_Twice_IsInvalidArgument) {
  EXPECT_EQ(Send(1, Validate()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(C10dStoreStateTest, Ping_EchoesNonce) {
  ASSERT_TRUE(Send(1, Request(C10dQuery::kPing).U32(4242)).ok());
  EXPECT_EQ(a1_.Raw<uint32_t>(), 4242u);
  EXPECT_TRUE(a1_.empty());
}

TEST_F(C10dStoreStateTest, Set_AnswersNothing_GetReturnsValue) {
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(Send(1, Set("/k", binary)).ok());
  EXPECT_TRUE(a1_.empty());
  ASSERT_TRUE(Send(2, Get("/k")).ok());
  EXPECT_EQ(a2_.Bytes(), binary);
  ASSERT_TRUE(Send(1, Set("/k", "new")).ok());
  ASSERT_TRUE(Send(2, Get("/k")).ok());
  EXPECT_EQ(a2_.Bytes(), "new");
  EXPECT_EQ(state_.num_keys(), 1u);
}

TEST_F(C10dStoreStateTest, Get_MissingKey_AnswersEmpty) {
  ASSERT_TRUE(Send(1, Get("/nothing")).ok());
  EXPECT_EQ(a1_.Bytes(), "");
}

TEST_F(C10dStoreStateTest, CompareSet_EachCase) {
  auto cas = [&](const std::string& k, const std::string& expected, const std::string& desired) {
    EXPECT_TRUE(Send(1, Request(C10dQuery::kCompareSet).Str(k).Str(expected).Str(desired)).ok());
    return a1_.Bytes();
  };
  // Missing key, expected non-empty: torch answers `expected` and sets nothing.
  EXPECT_EQ(cas("/k", "x", "y"), "x");
  EXPECT_EQ(state_.num_keys(), 0u);
  // Missing key, expected empty: set.
  EXPECT_EQ(cas("/k", "", "first"), "first");
  // Present, matching: replaced; not matching: the current value, unchanged.
  EXPECT_EQ(cas("/k", "first", "second"), "second");
  EXPECT_EQ(cas("/k", "first", "third"), "second");
  ASSERT_TRUE(Send(1, Get("/k")).ok());
  EXPECT_EQ(a1_.Bytes(), "second");
}

TEST_F(C10dStoreStateTest, Add_CountsFromZero_AndStoresDecimal) {
  auto add = [&](const std::string& k, int64_t d) {
    EXPECT_TRUE(Send(1, Request(C10dQuery::kAdd).Str(k).I64(d)).ok());
    return a1_.I64();
  };
  EXPECT_EQ(add("/n", 5), 5);
  EXPECT_EQ(add("/n", -7), -2);
  ASSERT_TRUE(Send(1, Get("/n")).ok());
  EXPECT_EQ(a1_.Bytes(), "-2");
  ASSERT_TRUE(Send(1, Set("/s", "40")).ok());
  EXPECT_EQ(add("/s", 2), 42);
}

TEST_F(C10dStoreStateTest, Add_ToNonInteger_IsInvalidArgument_WithoutTheValue) {
  ASSERT_TRUE(Send(1, Set("/s", "secret-bytes")).ok());
  absl::Status s = Send(1, Request(C10dQuery::kAdd).Str("/s").I64(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/s"), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find("secret"), absl::string_view::npos) << s;
}

TEST_F(C10dStoreStateTest, Add_Overflow_IsInvalidArgument) {
  ASSERT_TRUE(Send(1, Set("/n", "9223372036854775807")).ok());
  EXPECT_EQ(Send(1, Request(C10dQuery::kAdd).Str("/n").I64(1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(C10dStoreStateTest, Check_ReadyOnlyWhenAllKeysArePresent) {
  ASSERT_TRUE(Send(1, Set("/a", "1")).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kCheck).Keys({"/a"})).ok());
  EXPECT_EQ(a1_.U8(), kC10dCheckReady);
  ASSERT_TRUE(Send(1, Request(C10dQuery::kCheck).Keys({"/a", "/b"})).ok());
  EXPECT_EQ(a1_.U8(), kC10dCheckNotReady);
}

TEST_F(C10dStoreStateTest, Wait_PresentKeys_AnsweredAtOnce) {
  ASSERT_TRUE(Send(1, Set("/a", "1")).ok());
  ASSERT_TRUE(Send(1, Wait({"/a"})).ok());
  EXPECT_EQ(a1_.U8(), kC10dStopWaiting);
  EXPECT_EQ(state_.num_waiting(), 0u);
}

TEST_F(C10dStoreStateTest, Wait_AnsweredWhenEveryKeyIsSetByOthers) {
  ASSERT_TRUE(Send(1, Wait({"/a", "/b", "/a"})).ok());
  EXPECT_TRUE(a1_.empty());
  EXPECT_EQ(state_.num_waiting(), 1u);
  ASSERT_TRUE(Send(2, Set("/a", "1")).ok());
  EXPECT_TRUE(a1_.empty());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kAdd).Str("/b").I64(1)).ok());
  EXPECT_EQ(a3_.I64(), 1);
  EXPECT_EQ(a1_.U8(), kC10dStopWaiting);
  EXPECT_TRUE(a1_.empty());
  EXPECT_EQ(state_.num_waiting(), 0u);
  // A later SET of the same key answers nothing more.
  ASSERT_TRUE(Send(2, Set("/a", "2")).ok());
  EXPECT_TRUE(a1_.empty());
}

TEST_F(C10dStoreStateTest, Wait_SeveralWaitersOnOneKey_AllAnswered) {
  ASSERT_TRUE(Send(1, Wait({"/k"})).ok());
  ASSERT_TRUE(Send(2, Wait({"/k"})).ok());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kAppend).Str("/k").Str("x")).ok());
  EXPECT_EQ(a1_.U8(), kC10dStopWaiting);
  EXPECT_EQ(a2_.U8(), kC10dStopWaiting);
}

TEST_F(C10dStoreStateTest, Wait_SatisfiedByMultiSetAndCompareSet) {
  ASSERT_TRUE(Send(1, Wait({"/m"})).ok());
  ASSERT_TRUE(Send(2, Wait({"/c"})).ok());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kMultiSet).U64(2).Str("/x").Str("1").Str("/m").Str("2")).ok());
  EXPECT_EQ(a1_.U8(), kC10dStopWaiting);
  // A COMPARE_SET that sets nothing ends no wait; one that sets the key does.
  ASSERT_TRUE(Send(3, Request(C10dQuery::kCompareSet).Str("/c").Str("old").Str("new")).ok());
  EXPECT_EQ(a3_.Bytes(), "old");
  EXPECT_TRUE(a2_.empty());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kCompareSet).Str("/c").Str("").Str("new")).ok());
  EXPECT_EQ(a3_.Bytes(), "new");
  EXPECT_EQ(a2_.U8(), kC10dStopWaiting);
}

TEST_F(C10dStoreStateTest, CancelWait_AnswersCanceled_AndTheLaterSetAnswersNothing) {
  ASSERT_TRUE(Send(1, Wait({"/late"})).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kCancelWait)).ok());
  EXPECT_EQ(a1_.U8(), kC10dWaitCanceled);
  EXPECT_EQ(state_.num_waiting(), 0u);
  ASSERT_TRUE(Send(2, Set("/late", "v")).ok());
  EXPECT_TRUE(a1_.empty());
  // Without a wait, CANCEL_WAIT is still answered (the client may race the STOP_WAITING).
  ASSERT_TRUE(Send(1, Request(C10dQuery::kCancelWait)).ok());
  EXPECT_EQ(a1_.U8(), kC10dWaitCanceled);
}

TEST_F(C10dStoreStateTest, Wait_WhileWaiting_IsInvalidArgument) {
  ASSERT_TRUE(Send(1, Wait({"/a"})).ok());
  EXPECT_EQ(Send(1, Wait({"/b"})).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(C10dStoreStateTest, Disconnect_DropsItsWait) {
  ASSERT_TRUE(Send(1, Wait({"/a"})).ok());
  state_.Disconnect(1);
  EXPECT_EQ(state_.num_waiting(), 0u);
  ASSERT_TRUE(Send(2, Set("/a", "1")).ok());
  EXPECT_EQ(state_.num_clients(), 2u);
}

TEST_F(C10dStoreStateTest, GetNumKeys_DeleteKey_ListKeys) {
  ASSERT_TRUE(Send(1, Set("/a", "1")).ok());
  ASSERT_TRUE(Send(1, Set("/b", "2")).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kGetNumKeys)).ok());
  EXPECT_EQ(a1_.I64(), 2);
  ASSERT_TRUE(Send(1, Request(C10dQuery::kDeleteKey).Str("/a")).ok());
  EXPECT_EQ(a1_.I64(), 1);
  ASSERT_TRUE(Send(1, Request(C10dQuery::kDeleteKey).Str("/a")).ok());
  EXPECT_EQ(a1_.I64(), 0);
  ASSERT_TRUE(Send(1, Request(C10dQuery::kListKeys)).ok());
  EXPECT_EQ(a1_.I64(), 1);
  EXPECT_EQ(a1_.Bytes(), "/b");
  EXPECT_TRUE(a1_.empty());
}

TEST_F(C10dStoreStateTest, Append_CreatesThenExtends) {
  ASSERT_TRUE(Send(1, Request(C10dQuery::kAppend).Str("/l").Str("ab")).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kAppend).Str("/l").Str("cd")).ok());
  EXPECT_TRUE(a1_.empty());
  ASSERT_TRUE(Send(1, Get("/l")).ok());
  EXPECT_EQ(a1_.Bytes(), "abcd");
}

TEST_F(C10dStoreStateTest, MultiGet_AnswersInOrder_MissingEmpty) {
  ASSERT_TRUE(Send(1, Request(C10dQuery::kMultiSet).U64(2).Str("/a").Str("1").Str("/b").Str("22")).ok());
  EXPECT_TRUE(a1_.empty());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kMultiGet).Keys({"/b", "/none", "/a"})).ok());
  EXPECT_EQ(a1_.Bytes(), "22");
  EXPECT_EQ(a1_.Bytes(), "");
  EXPECT_EQ(a1_.Bytes(), "1");
  EXPECT_TRUE(a1_.empty());
}

TEST_F(C10dStoreStateTest, Queue_PushPopLen) {
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueuePush).Str("/q").Str("one")).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueuePush).Str("/q").Str("two")).ok());
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueueLen).Str("/q")).ok());
  EXPECT_EQ(a1_.I64(), 2);
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueuePop).Str("/q")).ok());
  EXPECT_EQ(a1_.I64(), 2);
  EXPECT_EQ(a1_.Bytes(), "one");
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueuePop).Str("/q")).ok());
  EXPECT_EQ(a1_.I64(), 1);
  EXPECT_EQ(a1_.Bytes(), "two");
  ASSERT_TRUE(Send(1, Request(C10dQuery::kQueuePop).Str("/q")).ok());
  EXPECT_EQ(a1_.I64(), 0);
  EXPECT_TRUE(a1_.empty());
  EXPECT_EQ(state_.total_bytes(), 0u);
}

TEST_F(C10dStoreStateTest, QueuePush_WakesOneWaiter) {
  ASSERT_TRUE(Send(1, Wait({"/q"})).ok());
  ASSERT_TRUE(Send(2, Wait({"/q"})).ok());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kQueuePush).Str("/q").Str("item")).ok());
  EXPECT_EQ(a1_.U8(), kC10dStopWaiting);
  EXPECT_TRUE(a2_.empty());
  ASSERT_TRUE(Send(3, Request(C10dQuery::kQueuePush).Str("/q").Str("item2")).ok());
  EXPECT_EQ(a2_.U8(), kC10dStopWaiting);
  // A non-empty queue counts as present for CHECK and WAIT.
  ASSERT_TRUE(Send(3, Request(C10dQuery::kCheck).Keys({"/q"})).ok());
  EXPECT_EQ(a3_.U8(), kC10dCheckReady);
}

TEST_F(C10dStoreStateTest, Request_InPieces_AppliedOnlyWhenWhole) {
  const std::string set = Set("/k", std::string(1000, 'v'));
  for (size_t i = 0; i + 1 < set.size(); ++i) {
    ASSERT_TRUE(Send(1, absl::string_view(set).substr(i, 1)).ok());
    ASSERT_EQ(state_.num_keys(), 0u) << "after " << i + 1 << " bytes";
  }
  ASSERT_TRUE(Send(1, absl::string_view(set).substr(set.size() - 1)).ok());
  EXPECT_EQ(state_.num_keys(), 1u);
}

TEST_F(C10dStoreStateTest, Requests_Pipelined_AllAnswered) {
  ASSERT_TRUE(Send(1, Set("/a", "1") + Get("/a") + Request(C10dQuery::kPing).U32(9).bytes()).ok());
  EXPECT_EQ(a1_.Bytes(), "1");
  EXPECT_EQ(a1_.Raw<uint32_t>(), 9u);
}

TEST_F(C10dStoreStateTest, UnknownQueryType_IsInvalidArgument_OthersGoOn) {
  absl::Status s = Send(1, std::string(1, '\xc8'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown query type 200"), absl::string_view::npos) << s;
  state_.Disconnect(1);
  ASSERT_TRUE(Send(2, Set("/a", "1")).ok());
  ASSERT_TRUE(Send(2, Get("/a")).ok());
  EXPECT_EQ(a2_.Bytes(), "1");
}

// Random bytes after VALIDATE, and random requests of every type with random fields: every call
// answers or refuses (a refused connection is replaced), the state stays consistent.
TEST(C10dStoreStateFuzz, RandomInput_NeverCrashes) {
  C10dStoreLimits limits;
  limits.max_value_bytes = 256;
  limits.max_total_bytes = 64 * 1024;
  limits.max_keys_per_request = 8;
  limits.max_request_bytes = 4096;
  C10dStoreState state(limits);
  uint64_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(seed >> 33);
  };
  auto small_key = [&] { return "/k" + std::to_string(next() % 8); };
  C10dStoreState::ClientId id = 1;
  state.Connect(id);
  ASSERT_TRUE(state.Receive(id, Validate()).ok());
  size_t refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes;
    if (next() % 4 == 0) {
      const size_t n = next() % 40;
      for (size_t j = 0; j < n; ++j) bytes.push_back(static_cast<char>(next()));
    } else {
      Request r(static_cast<C10dQuery>(1 + next() % 17));
      const int fields = next() % 4;
      for (int f = 0; f < fields; ++f) {
        switch (next() % 4) {
          case 0:
            r.Str(small_key());
            break;
          case 1:
            r.Str(std::string(next() % 300, 'v'));
            break;
          case 2:
            r.U64(next() % 10);
            break;
          default:
            r.I64(static_cast<int64_t>(next()) - (1 << 30));
            break;
        }
      }
      bytes = r.bytes();
    }
    if (!state.Receive(id, bytes).ok()) {
      ++refused;
      state.Disconnect(id);
      state.Connect(++id);
      ASSERT_TRUE(state.Receive(id, Validate()).ok());
    }
    state.ConsumeOutput(id, state.Output(id).size());
    ASSERT_LE(state.total_bytes(), limits.max_total_bytes);
    ASSERT_LE(state.num_clients(), 1u);
  }
  EXPECT_GT(refused, 0u);
  EXPECT_LT(refused, 20000u);
}

class C10dStoreStateLimitsTest : public C10dStoreStateTest {
 protected:
  static C10dStoreLimits Small() {
    C10dStoreLimits limits;
    limits.max_key_bytes = 16;
    limits.max_value_bytes = 100;
    limits.max_total_bytes = 1000;
    limits.max_keys_per_request = 4;
    limits.max_request_bytes = 300;
    limits.output_pause_bytes = 64;
    return limits;
  }
  C10dStoreStateLimitsTest() : C10dStoreStateTest(Small()) {}
};

TEST_F(C10dStoreStateLimitsTest, KeyTooLong_RefusedBeforeItsBytesArrive) {
  absl::Status s = Send(1, Request(C10dQuery::kSet).U64(1u << 30));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("key of 1073741824 bytes"), absl::string_view::npos) << s;
}

TEST_F(C10dStoreStateLimitsTest, ValueTooLong_RefusedBeforeItsBytesArrive) {
  absl::Status s = Send(1, Request(C10dQuery::kSet).Str("/k").U64(101));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("at most 100"), absl::string_view::npos) << s;
}

TEST_F(C10dStoreStateLimitsTest, TooManyKeys_Refused) {
  EXPECT_EQ(Send(1, Request(C10dQuery::kWait).U64(5)).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(C10dStoreStateLimitsTest, AppendPastValueLimit_Refused) {
  ASSERT_TRUE(Send(1, Request(C10dQuery::kAppend).Str("/k").Str(std::string(60, 'x'))).ok());
  EXPECT_EQ(Send(1, Request(C10dQuery::kAppend).Str("/k").Str(std::string(60, 'x'))).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(C10dStoreStateLimitsTest, TotalBytes_Refused_AndNothingChanged) {
  size_t i = 0;
  absl::Status s;
  for (; i < 20 && s.ok(); ++i) s = Send(2, Set("/k" + std::to_string(i), std::string(100, 'v')));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("holds at most 1000"), absl::string_view::npos) << s;
  EXPECT_LE(state_.total_bytes(), 1000u);
  EXPECT_EQ(state_.num_keys(), i - 1);
  // A MULTI_SET over the limit sets none of its keys.
  const size_t keys = state_.num_keys();
  EXPECT_EQ(
      Send(3, Request(C10dQuery::kMultiSet).U64(2).Str("/m1").Str("1").Str("/m2").Str(std::string(100, 'v'))).code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(state_.num_keys(), keys);
  // Replacing a value with a smaller one is always taken.
  ASSERT_TRUE(Send(1, Set("/k0", "")).ok());
}

TEST_F(C10dStoreStateLimitsTest, RequestTooLong_Refused) {
  Request multi(C10dQuery::kMultiSet);
  multi.U64(4);
  for (int i = 0; i < 4; ++i) multi.Str("/k" + std::to_string(i)).Str(std::string(100, 'v'));
  EXPECT_EQ(Send(1, absl::string_view(multi).substr(0, multi.bytes().size() - 1)).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(C10dStoreStateLimitsTest, UnsentAnswers_PauseFurtherRequests) {
  ASSERT_TRUE(Send(1, Set("/k", std::string(50, 'v'))).ok());
  ASSERT_TRUE(Send(2, Get("/k") + Get("/k") + Get("/k")).ok());
  // Two answers (116 bytes) pass the 64-byte pause; the third request waits, and no more is read.
  EXPECT_EQ(state_.Output(2).size(), 116u);
  EXPECT_TRUE(state_.HasPendingInput(2));
  EXPECT_FALSE(state_.WantsInput(2));
  EXPECT_EQ(a2_.Bytes(), std::string(50, 'v'));
  EXPECT_EQ(a2_.Bytes(), std::string(50, 'v'));
  ASSERT_TRUE(state_.Resume(2).ok());
  EXPECT_EQ(a2_.Bytes(), std::string(50, 'v'));
  EXPECT_FALSE(state_.HasPendingInput(2));
  EXPECT_TRUE(state_.WantsInput(2));
}

}  // namespace
}  // namespace stagehand
