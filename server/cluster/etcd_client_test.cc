// EtcdClient against a real etcd (server/cluster/etcd_test_util.h); skipped without /usr/bin/etcd.
#include "server/cluster/etcd_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_test_util.h"
#include "server/credentials.h"

namespace tessera::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// "PUT k=v@rev" / "DELETE k@rev": one comparable string per event.
std::string Describe(const WatchEvent& event) {
  if (event.type == WatchEvent::Type::kDelete) {
    return absl::StrCat("DELETE ", event.kv.key, "@", event.kv.mod_revision);
  }
  return absl::StrCat("PUT ", event.kv.key, "=", event.kv.value, "@", event.kv.mod_revision);
}

// Collects a watch's events from its thread.
class EventLog {
 public:
  void Add(const WatchEvent& event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(Describe(event));
    cv_.notify_all();
  }
  // The events so far, once there are at least `n` or `timeout` has passed.
  std::vector<std::string> WaitFor(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return events_.size() >= n; });
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

// Retries `call` while it returns UNAVAILABLE (the channel reconnects after a restart), for at
// most `timeout`.
template <typename Call>
auto RetryWhileUnavailable(Call call, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  auto result = call();
  while (absl::IsUnavailable(result.status()) && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    result = call();
  }
  return result;
}

class EtcdClientTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = NewClient(absl::Seconds(5));
  }

  std::vector<std::string> Keys(const RangeResult& range) {
    std::vector<std::string> keys;
    for (const KeyValue& kv : range.kvs) keys.push_back(kv.key + "=" + kv.value);
    return keys;
  }

  std::unique_ptr<EtcdClient> client_;
};

TEST(EtcdClientCreate, RejectsMalformedOptions) {
  for (const char* endpoint : {"", "localhost", ":2379", "host:", "host:port", "host:70000"}) {
    EtcdClientOptions options;
    options.endpoint = endpoint;
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << endpoint << ": " << client.status();
  }
  EtcdClientOptions options;
  options.endpoint = "127.0.0.1:2379";
  options.call_timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdClient::Create(options).status()));
  options.call_timeout = absl::Seconds(1);
  EXPECT_TRUE(EtcdClient::Create(options).ok());
}

TEST(EtcdTestServer, MissingBinaryIsNotFound) {
  EtcdTestServerOptions options;
  options.binary = "/nonexistent/etcd";
  absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start(options);
  EXPECT_TRUE(absl::IsNotFound(etcd.status())) << etcd.status();
  EXPECT_THAT(std::string(etcd.status().message()), HasSubstr("/nonexistent/etcd"));
}

TEST_F(EtcdClientTest, PutGetPrefixAndDelete) {
  absl::StatusOr<std::optional<KeyValue>> missing = client_->Get("cluster/a");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());

  absl::StatusOr<int64_t> r1 = client_->Put("cluster/a", "1");
  absl::StatusOr<int64_t> r2 = client_->Put("cluster/b", "2");
  absl::StatusOr<int64_t> rx = client_->Put("clusterx", "x");  // shares bytes, not the prefix
  absl::StatusOr<int64_t> r3 = client_->Put("cluster/a", "3");
  ASSERT_TRUE(r1.ok() && r2.ok() && rx.ok() && r3.ok()) << r1.status() << r3.status();
  EXPECT_EQ(*r2, *r1 + 1);
  EXPECT_EQ(*rx, *r2 + 1);
  EXPECT_EQ(*r3, *rx + 1);

  absl::StatusOr<std::optional<KeyValue>> a = client_->Get("cluster/a");
  ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
  EXPECT_EQ((*a)->key, "cluster/a");
  EXPECT_EQ((*a)->value, "3");
  EXPECT_EQ((*a)->mod_revision, *r3);
  EXPECT_EQ((*a)->create_revision, *r1);
  EXPECT_EQ((*a)->version, 2);
  EXPECT_EQ((*a)->lease, 0);

  absl::StatusOr<RangeResult> range = client_->GetPrefix("cluster/");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(Keys(*range), ElementsAre("cluster/a=3", "cluster/b=2"));
  EXPECT_EQ(range->kvs[0].mod_revision, *r3);
  EXPECT_EQ(range->kvs[1].mod_revision, *r2);
  EXPECT_EQ(range->revision, *r3);

  // Binary keys, and a prefix ending in 0xff (its range end cannot be the prefix + 1).
  const std::string high("\xff\xff", 2);
  ASSERT_TRUE(client_->Put(high + "a", std::string("v\0w", 3)).ok());
  ASSERT_TRUE(client_->Put(high + std::string("\xff\x01", 2), "z").ok());
  absl::StatusOr<RangeResult> high_range = client_->GetPrefix(high);
  ASSERT_TRUE(high_range.ok()) << high_range.status();
  ASSERT_EQ(high_range->kvs.size(), 2);
  EXPECT_EQ(high_range->kvs[0].key, high + "a");
  EXPECT_EQ(high_range->kvs[0].value, std::string("v\0w", 3));
  EXPECT_EQ(high_range->kvs[1].key, high + std::string("\xff\x01", 2));

  absl::StatusOr<RangeResult> all = client_->GetPrefix("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->kvs.size(), 5);

  EXPECT_EQ(client_->Delete("cluster/a").value_or(-1), 1);
  EXPECT_EQ(client_->Delete("cluster/a").value_or(-1), 0);
  absl::StatusOr<std::optional<KeyValue>> deleted = client_->Get("cluster/a");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(deleted->has_value());
  EXPECT_EQ(client_->DeletePrefix("cluster/").value_or(-1), 1);
  range = client_->GetPrefix("cluster/");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(range->kvs, IsEmpty());
  absl::StatusOr<std::optional<KeyValue>> x = client_->Get("clusterx");
  ASSERT_TRUE(x.ok() && x->has_value()) << x.status();
  EXPECT_EQ((*x)->value, "x");

  absl::Status empty_key = client_->Put("", "v").status();
  EXPECT_TRUE(absl::IsInvalidArgument(empty_key)) << empty_key;
}

TEST_F(EtcdClientTest, CreateIfAbsentAppliesOnlyOnce) {
  const std::vector<std::pair<std::string, std::string>> first = {
      {"collections/papers/schema", "s1"}, {"collections/papers/shards", "m1"}};
  absl::StatusOr<bool> created = client_->CreateIfAbsent(first);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);

  const std::vector<std::pair<std::string, std::string>> again = {
      {"collections/papers/schema", "s2"}, {"collections/papers/shards", "m2"}};
  created = client_->CreateIfAbsent(again);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(*created);

  // One existing key fails the whole transaction: the new key is not written either.
  const std::vector<std::pair<std::string, std::string>> overlap = {
      {"collections/books/schema", "b"}, {"collections/papers/shards", "m3"}};
  created = client_->CreateIfAbsent(overlap);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(*created);

  absl::StatusOr<RangeResult> range = client_->GetPrefix("collections/");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(Keys(*range),
              ElementsAre("collections/papers/schema=s1", "collections/papers/shards=m1"));
  EXPECT_EQ(range->kvs[0].version, 1);

  const std::vector<std::pair<std::string, std::string>> twice = {{"k", "1"}, {"k", "2"}};
  EXPECT_TRUE(absl::IsInvalidArgument(client_->CreateIfAbsent(twice).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(client_->CreateIfAbsent({}).status()));
}

TEST_F(EtcdClientTest, CreateIfAbsentRaceHasExactlyOneWinner) {
  constexpr int kThreads = 8;
  std::atomic<int> ready{0};
  std::vector<absl::StatusOr<bool>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const std::string id = absl::StrCat("node-", i);
      const std::vector<std::pair<std::string, std::string>> kvs = {{"race/schema", id},
                                                                    {"race/owner", id}};
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      results[i] = client_->CreateIfAbsent(kvs);
    });
  }
  for (std::thread& thread : threads) thread.join();
  int winner = -1;
  int wins = 0;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    if (*results[i]) {
      ++wins;
      winner = i;
    }
  }
  ASSERT_EQ(wins, 1);
  absl::StatusOr<RangeResult> range = client_->GetPrefix("race/");
  ASSERT_TRUE(range.ok()) << range.status();
  const std::string id = absl::StrCat("node-", winner);
  EXPECT_THAT(Keys(*range), ElementsAre("race/owner=" + id, "race/schema=" + id));
  EXPECT_EQ(range->kvs[0].version, 1);
  EXPECT_EQ(range->kvs[0].mod_revision, range->kvs[1].mod_revision);  // one transaction
}

TEST_F(EtcdClientTest, CompareAndSwapOnModRevision) {
  absl::StatusOr<int64_t> r1 = client_->Put("shardmap", "v1");
  ASSERT_TRUE(r1.ok()) << r1.status();

  absl::StatusOr<bool> swapped = client_->CompareAndSwap("shardmap", *r1, "v2");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(*swapped);
  absl::StatusOr<std::optional<KeyValue>> now = client_->Get("shardmap");
  ASSERT_TRUE(now.ok() && now->has_value()) << now.status();
  EXPECT_EQ((*now)->value, "v2");
  EXPECT_EQ((*now)->mod_revision, *r1 + 1);

  // A stale revision loses and changes nothing.
  swapped = client_->CompareAndSwap("shardmap", *r1, "v3");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_FALSE(*swapped);
  now = client_->Get("shardmap");
  ASSERT_TRUE(now.ok() && now->has_value()) << now.status();
  EXPECT_EQ((*now)->value, "v2");
  EXPECT_EQ((*now)->mod_revision, *r1 + 1);

  // 0: only while the key does not exist.
  swapped = client_->CompareAndSwap("fresh", 0, "first");
  ASSERT_TRUE(swapped.ok() && *swapped) << swapped.status();
  swapped = client_->CompareAndSwap("fresh", 0, "second");
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_FALSE(*swapped);
  now = client_->Get("fresh");
  ASSERT_TRUE(now.ok() && now->has_value()) << now.status();
  EXPECT_EQ((*now)->value, "first");
}

TEST_F(EtcdClientTest, KeyVanishesWhenKeepAliveStopsAndStaysWhileKeptAlive) {
  constexpr int kTtlSeconds = 2;
  absl::StatusOr<int64_t> dropped = client_->GrantLease(kTtlSeconds);
  absl::StatusOr<int64_t> kept = client_->GrantLease(kTtlSeconds);
  ASSERT_TRUE(dropped.ok() && kept.ok()) << dropped.status() << kept.status();
  EXPECT_NE(*dropped, *kept);
  ASSERT_TRUE(client_->Put("nodes/dropped", "a", *dropped).ok());
  ASSERT_TRUE(client_->Put("nodes/kept", "b", *kept).ok());
  absl::StatusOr<std::optional<KeyValue>> kv = client_->Get("nodes/kept");
  ASSERT_TRUE(kv.ok() && kv->has_value()) << kv.status();
  EXPECT_EQ((*kv)->lease, *kept);

  std::atomic<int> lost{0};
  auto on_lost = [&](const absl::Status&) { lost.fetch_add(1); };
  auto dropped_keepalive = client_->KeepAlive(*dropped, on_lost);
  auto kept_keepalive = client_->KeepAlive(*kept, on_lost);
  EXPECT_EQ(kept_keepalive->lease_id(), *kept);
  const absl::Time granted = absl::Now();
  // Both renewing before one stops.
  while ((dropped_keepalive->last_renewed() == absl::InfinitePast() ||
          kept_keepalive->last_renewed() == absl::InfinitePast()) &&
         absl::Now() < granted + absl::Seconds(kTtlSeconds)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(dropped_keepalive->last_renewed(), absl::InfinitePast());
  ASSERT_NE(kept_keepalive->last_renewed(), absl::InfinitePast());

  const absl::Time stopped = absl::Now();
  dropped_keepalive.reset();
  std::optional<absl::Duration> vanished_after;
  // Until 2 × TTL + 0.5 s after the grant, with no writes meanwhile: only renewals keep the key.
  while (absl::Now() < granted + absl::Seconds(2 * kTtlSeconds) + absl::Milliseconds(500) ||
         (!vanished_after && absl::Now() < stopped + absl::Seconds(2 * kTtlSeconds))) {
    absl::StatusOr<std::optional<KeyValue>> dropped_kv = client_->Get("nodes/dropped");
    ASSERT_TRUE(dropped_kv.ok()) << dropped_kv.status();
    if (!dropped_kv->has_value() && !vanished_after) vanished_after = absl::Now() - stopped;
    kv = client_->Get("nodes/kept");
    ASSERT_TRUE(kv.ok()) << kv.status();
    ASSERT_TRUE(kv->has_value()) << "nodes/kept vanished while kept alive, "
                                 << (absl::Now() - granted) << " after the grant";
    EXPECT_EQ((*kv)->value, "b");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(vanished_after.has_value()) << "nodes/dropped outlived its lease";
  EXPECT_LE(*vanished_after, absl::Seconds(kTtlSeconds + 1));
  EXPECT_GE(kept_keepalive->last_renewed(), stopped);
  EXPECT_EQ(lost.load(), 0);
}

TEST_F(EtcdClientTest, RevokedLeaseIsReportedLost) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("nodes/n1", "up", *lease).ok());

  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::Status> lost;
  auto keepalive = client_->KeepAlive(*lease, [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    lost.push_back(status);
    cv.notify_all();
  });
  const absl::Time started = absl::Now();
  while (keepalive->last_renewed() == absl::InfinitePast() &&
         absl::Now() < started + absl::Seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(keepalive->last_renewed(), absl::InfinitePast());
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  absl::StatusOr<std::optional<KeyValue>> kv = client_->Get("nodes/n1");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_FALSE(kv->has_value());

  // Noticed at the next renewal, a third of the TTL later at most.
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, std::chrono::seconds(4), [&] { return !lost.empty(); });
  ASSERT_EQ(lost.size(), 1);
  EXPECT_TRUE(absl::IsNotFound(lost[0])) << lost[0];
  EXPECT_THAT(lost[0].message(), HasSubstr(etcd_->endpoint()));
  lock.unlock();

  absl::Status again = client_->RevokeLease(*lease);
  EXPECT_TRUE(absl::IsNotFound(again)) << again;
  EXPECT_TRUE(absl::IsNotFound(client_->Put("nodes/n2", "up", *lease).status()));
}

TEST_F(EtcdClientTest, WatchDeliversInOrderAndResumesAfterRestart) {
  absl::StatusOr<RangeResult> start = client_->GetPrefix("w/");
  ASSERT_TRUE(start.ok()) << start.status();
  // Written before the watch starts, after the revision it starts from: replayed.
  absl::StatusOr<int64_t> r1 = client_->Put("w/early", "0");
  ASSERT_TRUE(r1.ok()) << r1.status();

  EventLog log;
  std::atomic<int> errors{0};
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = client_->Watch(
      "w/", start->revision + 1, [&](const WatchEvent& event) { log.Add(event); },
      [&](const absl::Status&) { errors.fetch_add(1); });
  ASSERT_TRUE(watch.ok()) << watch.status();

  // A lease keeps going across the restart as well (etcd renews every lease when it starts).
  absl::StatusOr<int64_t> lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::atomic<int> lost{0};
  auto keepalive = client_->KeepAlive(*lease, [&](const absl::Status&) { lost.fetch_add(1); });

  const int64_t r2 = client_->Put("w/a", "1").value_or(-1);
  const int64_t r3 = client_->Put("w/b", "2").value_or(-1);
  ASSERT_TRUE(client_->Put("other/x", "not watched").ok());
  const int64_t r5 = client_->Delete("w/a").ok() ? r3 + 2 : -1;
  const int64_t r6 = client_->Put("w/b", "3").value_or(-1);
  EXPECT_EQ(r6, r5 + 1);
  const std::vector<std::string> before = {
      absl::StrCat("PUT w/early=0@", *r1), absl::StrCat("PUT w/a=1@", r2),
      absl::StrCat("PUT w/b=2@", r3), absl::StrCat("DELETE w/a@", r5),
      absl::StrCat("PUT w/b=3@", r6)};
  EXPECT_EQ(log.WaitFor(before.size()), before);
  EXPECT_EQ((*watch)->next_revision(), r6 + 1);

  ASSERT_TRUE(etcd_->Stop().ok());
  ASSERT_TRUE(etcd_->Restart().ok());
  const absl::Time restarted = absl::Now();
  // Written as soon as etcd is back, likely before the watch has reopened its stream.
  absl::StatusOr<int64_t> r7 = RetryWhileUnavailable([&] { return client_->Put("w/c", "4"); });
  ASSERT_TRUE(r7.ok()) << r7.status();
  absl::StatusOr<int64_t> r8 = client_->Delete("w/b");
  ASSERT_TRUE(r8.ok()) << r8.status();
  std::vector<std::string> after = before;
  after.push_back(absl::StrCat("PUT w/c=4@", *r7));
  after.push_back(absl::StrCat("DELETE w/b@", *r7 + 1));
  EXPECT_EQ(log.WaitFor(after.size()), after);

  // Nothing delivered twice: a later event arrives right after those, with no replay between.
  absl::StatusOr<int64_t> r9 = client_->Put("w/d", "5");
  ASSERT_TRUE(r9.ok()) << r9.status();
  after.push_back(absl::StrCat("PUT w/d=5@", *r9));
  EXPECT_EQ(log.WaitFor(after.size()), after);
  EXPECT_EQ(errors.load(), 0);

  // The keepalive renewed over a new stream after the restart.
  const absl::Time renewal_deadline = restarted + absl::Seconds(5);
  while (keepalive->last_renewed() < restarted && absl::Now() < renewal_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(keepalive->last_renewed(), restarted);
  EXPECT_EQ(lost.load(), 0);

  // After destruction no more callbacks.
  watch->reset();
  ASSERT_TRUE(client_->Put("w/e", "6").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(log.WaitFor(0), after);
}

TEST_F(EtcdClientTest, WatchFromNowSeesOnlyLaterWrites) {
  ASSERT_TRUE(client_->Put("n/old", "0").ok());
  EventLog log;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client_->Watch("n/", 0, [&](const WatchEvent& event) { log.Add(event); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  absl::StatusOr<int64_t> revision = client_->Put("n/new", "1");
  ASSERT_TRUE(revision.ok()) << revision.status();
  EXPECT_THAT(log.WaitFor(1), ElementsAre(absl::StrCat("PUT n/new=1@", *revision)));
}

TEST_F(EtcdClientTest, CallsFailUnavailableWhileEtcdIsDownAndRecover) {
  std::unique_ptr<EtcdClient> client = NewClient(absl::Seconds(1));
  ASSERT_TRUE(client->Put("k", "v").ok());
  ASSERT_TRUE(etcd_->Kill().ok());

  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<KeyValue>> get = client->Get("k");
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(get.status())) << get.status();
  EXPECT_THAT(get.status().message(), HasSubstr(etcd_->endpoint()));
  EXPECT_THAT(get.status().message(), HasSubstr("Get 'k'"));
  EXPECT_THAT(get.status().message(), HasSubstr("cannot connect within 1s")) << get.status();
  EXPECT_LE(took, absl::Milliseconds(1500));

  absl::Status put = client->Put("k", "w").status();
  EXPECT_TRUE(absl::IsUnavailable(put)) << put;
  EXPECT_THAT(put.message(), HasSubstr("Put 'k'"));
  EXPECT_TRUE(absl::IsUnavailable(client->GrantLease(5).status()));
  const absl::Time watch_start = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = client->Watch("k", 0, nullptr);
  EXPECT_TRUE(absl::IsUnavailable(watch.status())) << watch.status();
  EXPECT_THAT(watch.status().message(), HasSubstr(etcd_->endpoint()));
  EXPECT_LE(absl::Now() - watch_start, absl::Milliseconds(1500));

  // A client created while etcd is down fails the same way.
  std::unique_ptr<EtcdClient> fresh = NewClient(absl::Seconds(1));
  absl::Status fresh_get = fresh->Get("k").status();
  EXPECT_TRUE(absl::IsUnavailable(fresh_get)) << fresh_get;

  ASSERT_TRUE(etcd_->Restart().ok());
  // Back within the reconnect backoff (500 ms here), under the 1 s deadline of a call that waits
  // for the connection; the killed etcd kept the write it had acknowledged.
  absl::StatusOr<std::optional<KeyValue>> back =
      RetryWhileUnavailable([&] { return client->Get("k"); }, absl::Seconds(5));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ((*back)->value, "v");
  absl::StatusOr<std::optional<KeyValue>> fresh_back =
      RetryWhileUnavailable([&] { return fresh->Get("k"); }, absl::Seconds(5));
  ASSERT_TRUE(fresh_back.ok()) << fresh_back.status();
  EXPECT_TRUE(fresh_back->has_value());
}

// etcd serving its client URL over TLS only, refusing clients without a certificate signed by
// its CA (--client-cert-auth); certificates from EtcdTestServer, credentials as the server
// binary makes them from --etcd_ca/--etcd_cert/--etcd_key (server/credentials.h).
class EtcdClientTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EtcdTestServerOptions options;
    options.tls = true;
    absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start(options);
    if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status().message();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    // A client etcd accepts, to look at the store from the outside.
    trusted_ =
        NewClient(Tls(files().ca, files().client_cert, files().client_key), absl::Seconds(5));
    ASSERT_NE(trusted_, nullptr);
  }

  const EtcdTestTlsFiles& files() const { return etcd_->tls_files(); }

  // TLS verifying etcd with `ca`, presenting `cert`/`key` when given.
  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca,
                                                       const std::string& cert = "",
                                                       const std::string& key = "") {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        server::NewClusterChannelCredentials(ca, server::TlsFiles{cert, key, ""});
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return credentials.ok() ? *std::move(credentials) : nullptr;
  }

  // `credentials` null: plaintext.
  std::unique_ptr<EtcdClient> NewClient(std::shared_ptr<grpc::ChannelCredentials> credentials,
                                        absl::Duration call_timeout) {
    EtcdClientOptions options;
    options.endpoint = etcd_->endpoint();
    options.credentials = std::move(credentials);
    options.call_timeout = call_timeout;
    options.max_reconnect_backoff = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A read, a write and a watch by `client` (call_timeout kTimeout) each fail with UNAVAILABLE
  // naming the endpoint, within the deadline (plus slack for a loaded machine), and the write
  // is not applied.
  void ExpectRefused(EtcdClient* client) {
    ASSERT_NE(client, nullptr);
    const absl::Duration bound = kTimeout + absl::Milliseconds(1500);
    absl::Time start = absl::Now();
    absl::Status get = client->Get("refused").status();
    EXPECT_LE(absl::Now() - start, bound);
    EXPECT_TRUE(absl::IsUnavailable(get)) << get;
    EXPECT_THAT(get.message(), HasSubstr(absl::StrCat("Get 'refused': etcd at ", etcd_->endpoint(),
                                                      " unavailable")));
    start = absl::Now();
    absl::Status put = client->Put("refused", "v").status();
    EXPECT_LE(absl::Now() - start, bound);
    EXPECT_TRUE(absl::IsUnavailable(put)) << put;
    start = absl::Now();
    absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = client->Watch("refused", 0, nullptr);
    EXPECT_LE(absl::Now() - start, bound);
    EXPECT_TRUE(absl::IsUnavailable(watch.status())) << watch.status();
    absl::StatusOr<std::optional<KeyValue>> stored = trusted_->Get("refused");
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_FALSE(stored->has_value()) << "a refused client's write was applied";
  }

  static constexpr absl::Duration kTimeout = absl::Seconds(1);
  std::unique_ptr<EtcdTestServer> etcd_;
  std::unique_ptr<EtcdClient> trusted_;
};

TEST(EtcdTestServer, TlsServerHasCertificatesUnderItsDirectory) {
  EtcdTestServerOptions options;
  options.tls = true;
  absl::StatusOr<std::unique_ptr<EtcdTestServer>> etcd = EtcdTestServer::Start(options);
  if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status().message();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EXPECT_TRUE((*etcd)->tls());
  const std::string data_dir = (*etcd)->data_dir();
  const std::string dir = data_dir.substr(0, data_dir.rfind('/'));  // the temporary directory
  const EtcdTestTlsFiles& files = (*etcd)->tls_files();
  for (const std::string* path :
       {&files.ca, &files.server_cert, &files.server_key, &files.client_cert, &files.client_key,
        &files.other_ca, &files.other_client_cert, &files.other_client_key}) {
    EXPECT_THAT(*path, ::testing::StartsWith(dir + "/tls/"));
    EXPECT_EQ(access(path->c_str(), R_OK), 0) << *path;
  }
  // A restart keeps the certificates, and its readiness probe connects over TLS again.
  absl::Status restarted = (*etcd)->Restart();
  EXPECT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE((*etcd)->running());
}

TEST_F(EtcdClientTlsTest, PutGetAndWatchWithCaAndClientCertificate) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      trusted_->Watch("tls/", 0, [&](const WatchEvent& event) { log.Add(event); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  absl::StatusOr<int64_t> first = trusted_->Put("tls/a", "1");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<int64_t> second = trusted_->Put("tls/b", "2");
  ASSERT_TRUE(second.ok()) << second.status();

  absl::StatusOr<std::optional<KeyValue>> a = trusted_->Get("tls/a");
  ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->mod_revision, *first);
  absl::StatusOr<RangeResult> range = trusted_->GetPrefix("tls/");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[1].value, "2");
  EXPECT_EQ(range->revision, *second);
  EXPECT_THAT(log.WaitFor(2), ElementsAre(absl::StrCat("PUT tls/a=1@", *first),
                                          absl::StrCat("PUT tls/b=2@", *second)));

  // Leases (their own gRPC service) over the same channel.
  absl::StatusOr<int64_t> lease = trusted_->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(trusted_->RevokeLease(*lease).ok());
}

TEST_F(EtcdClientTlsTest, PlaintextClientFailsUnavailableWithinItsDeadline) {
  std::unique_ptr<EtcdClient> plaintext = NewClient(nullptr, kTimeout);
  ExpectRefused(plaintext.get());
}

TEST_F(EtcdClientTlsTest, ClientTrustingAnotherCaFails) {
  // etcd's certificate does not chain to other_ca: the client ends the handshake.
  std::unique_ptr<EtcdClient> client =
      NewClient(Tls(files().other_ca, files().client_cert, files().client_key), kTimeout);
  ExpectRefused(client.get());
  absl::Status get = client->Get("k").status();
  EXPECT_THAT(get.message(), HasSubstr("cannot connect over TLS within 1s")) << get;
}

TEST_F(EtcdClientTlsTest, ClientWithoutAcceptedCertificateIsRefused) {
  // No client certificate, against --client-cert-auth.
  std::unique_ptr<EtcdClient> anonymous = NewClient(Tls(files().ca), kTimeout);
  ExpectRefused(anonymous.get());
  // A client certificate that etcd's CA did not sign.
  std::unique_ptr<EtcdClient> stranger =
      NewClient(Tls(files().ca, files().other_client_cert, files().other_client_key), kTimeout);
  ExpectRefused(stranger.get());
}

}  // namespace
}  // namespace tessera::cluster
