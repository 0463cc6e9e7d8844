#include "server/admission.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

TEST(Admission, RunsTasksInOrderOnItsWorkersAndAllQueuedOnesBeforeItEnds) {
  std::vector<int> order;
  absl::Notification release;
  {
    AdmissionOptions options;
    options.workers = 1;
    options.max_queued = 100;
    Admission admission(options);
    ASSERT_TRUE(admission.Submit(0, [&] { release.WaitForNotification(); }).ok());
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(admission.Submit(10, [&order, i] { order.push_back(i); }).ok());
    }
    EXPECT_GE(admission.queued(), 49);
    EXPECT_EQ(admission.inflight_bytes(), 500);
    release.Notify();
  }  // the destructor runs what is queued
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(Admission, BoundsBytesButAdmitsAnOversizedRequestAlone) {
  absl::Notification started, release;  // outlive the admission's worker
  AdmissionOptions options;
  options.workers = 1;
  options.max_inflight_bytes = 100;
  Admission admission(options);
  // Larger than the whole budget, with nothing else in flight: admitted.
  ASSERT_TRUE(admission
                  .Submit(500,
                          [&] {
                            started.Notify();
                            release.WaitForNotification();
                          })
                  .ok());
  started.WaitForNotification();
  const absl::Status refused = admission.Submit(1, [] {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("500 request bytes in flight + 1 would exceed --max_inflight_bytes 100"));
  release.Notify();
  while (admission.inflight_bytes() > 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(admission.Submit(100, [] {}).ok());
}

// A SearchBatch counts as its searches: a batch of 5 does not fit where 4 places are left of
// 6, while 4 single requests do; one larger than the whole queue runs when the queue is empty.
TEST(Admission, CountsEachUnitOfARequestAgainstTheQueue) {
  absl::Notification started, release;  // outlive the admission's worker
  AdmissionOptions options;
  options.workers = 1;
  options.max_queued = 6;
  Admission admission(options);
  ASSERT_TRUE(admission
                  .Submit(
                      0,
                      [&] {
                        started.Notify();
                        release.WaitForNotification();
                      },
                      absl::InfiniteFuture(), 10)
                  .ok());  // more than max_queued, with nothing queued: admitted
  started.WaitForNotification();
  ASSERT_TRUE(admission
                  .Submit(
                      0, [] {}, absl::InfiniteFuture(), 2)
                  .ok());
  EXPECT_EQ(admission.queued(), 2);
  const absl::Status refused = admission.Submit(
      0, [] {}, absl::InfiniteFuture(), 5);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("server busy: 2 requests already wait for a worker and this one counts "
                        "as 5 (one per search) (--max_queued_requests 6)"));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(admission.Submit(0, [] {}).ok()) << i;
  EXPECT_EQ(admission.queued(), 6);
  EXPECT_EQ(admission.Submit(0, [] {}).code(), absl::StatusCode::kResourceExhausted);
  release.Notify();
  while (admission.queued() > 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(admission
                  .Submit(
                      0, [] {}, absl::InfiniteFuture(), 5)
                  .ok());
}

TEST(Admission, RefusesARequestWhoseDeadlineWouldPassWhileItWaits) {
  // Declared before the admission, whose destructor joins the worker that waits on them.
  absl::Notification started, release;
  AdmissionOptions options;
  options.workers = 1;
  Admission admission(options);
  // Teach it that a task takes ~20 ms.
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(admission.Submit(0, [] { absl::SleepFor(absl::Milliseconds(20)); }).ok());
  }
  while (admission.queued() > 0) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(admission
                  .Submit(0,
                          [&] {
                            started.Notify();
                            release.WaitForNotification();
                          })
                  .ok());
  started.WaitForNotification();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(admission.Submit(0, [] {}).ok());
  // 3 queued + half of the running one, at ≥ 15 ms each (the mean after 32 tasks of 20 ms).
  EXPECT_GE(admission.ExpectedWait(), absl::Milliseconds(45));
  const absl::Status refused = admission.Submit(
      0, [] {}, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("server busy: the 3 queued requests need about "));
  EXPECT_THAT(refused.message(), HasSubstr("ms left of the call's deadline; retry with backoff"));
  EXPECT_TRUE(admission
                  .Submit(
                      0, [] {}, absl::Now() + absl::Seconds(60))
                  .ok());
  EXPECT_TRUE(admission.Submit(0, [] {}).ok());  // no deadline
  release.Notify();
}

TEST(Admission, DrainRefusesNewCallsAndReturnsWhenTheLastOneEnds) {
  Admission admission(AdmissionOptions{});
  ASSERT_TRUE(admission.BeginCall().ok());
  ASSERT_TRUE(admission.BeginCall().ok());
  EXPECT_EQ(admission.Drain(absl::Now() + absl::Milliseconds(20)), 2);
  EXPECT_EQ(admission.BeginCall().code(), absl::StatusCode::kUnavailable);
  admission.EndCall();
  std::atomic<int64_t> open{-1};
  absl::Notification draining;
  std::thread drainer([&] {
    draining.Notify();
    open = admission.Drain(absl::Now() + absl::Seconds(60));
  });
  draining.WaitForNotification();
  admission.EndCall();
  drainer.join();
  EXPECT_EQ(open, 0);
}

}  // namespace
}  // namespace tessera::server
