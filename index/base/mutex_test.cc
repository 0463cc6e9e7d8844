// Tests for Mutex and CondVar: exclusion, writers not starved by readers, signals and timed waits.
#include "tessera/base/mutex.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(Mutex, WriterExcludesReadersAndWriters) {
  Mutex mu;
  int64_t counter = 0;  // guarded by mu
  std::atomic<int> readers_inside{0};
  std::atomic<bool> writer_saw_reader{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if ((i + t) % 4 == 0) {
          MutexLock lock(&mu);
          if (readers_inside.load() != 0) writer_saw_reader = true;
          const int64_t before = counter;
          std::this_thread::yield();
          counter = before + 1;  // lost updates if two writers were inside
        } else {
          ReaderMutexLock lock(&mu);
          readers_inside.fetch_add(1);
          std::this_thread::yield();
          readers_inside.fetch_sub(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  MutexLock lock(&mu);
  EXPECT_EQ(counter, 4 * 2000 / 4);
  EXPECT_FALSE(writer_saw_reader.load());
}

// Readers that always overlap (one of them holds the lock at any time) must not keep a writer out:
// once it waits, new readers queue behind it. A reader-preferring lock lets the readers run to
// their bound first.
TEST(Mutex, OverlappingReadersDoNotStarveAWriter) {
  constexpr int kReaders = 4;
  constexpr int64_t kMaxReadsPerReader = 2'000'000;
  constexpr int kWrites = 50;
  Mutex mu;
  std::atomic<bool> writer_done{false};
  std::atomic<int> readers_gave_up{0};
  std::atomic<int> writes_before_any_gave_up{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&] {
      for (int64_t i = 0; !writer_done.load(); ++i) {
        if (i == kMaxReadsPerReader) {
          readers_gave_up.fetch_add(1);
          return;
        }
        ReaderMutexLock lock(&mu);
        std::this_thread::yield();
      }
    });
  }
  std::thread writer([&] {
    for (int w = 0; w < kWrites; ++w) {
      MutexLock lock(&mu);
      if (readers_gave_up.load() == 0) writes_before_any_gave_up.fetch_add(1);
    }
    writer_done = true;
  });
  writer.join();
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(writes_before_any_gave_up.load(), kWrites);
  EXPECT_EQ(readers_gave_up.load(), 0);
}

TEST(CondVar, SignalWakesAWaiter) {
  Mutex mu;
  CondVar cv;
  bool ready = false;  // guarded by mu
  int woken = 0;       // guarded by mu
  std::vector<std::thread> waiters;
  for (int t = 0; t < 3; ++t) {
    waiters.emplace_back([&] {
      MutexLock lock(&mu);
      while (!ready) cv.Wait(&mu);
      ++woken;
      cv.Signal();  // pass it on
    });
  }
  {
    MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  }
  for (std::thread& waiter : waiters) waiter.join();
  MutexLock lock(&mu);
  EXPECT_EQ(woken, 3);
}

TEST(CondVar, WaitWithTimeoutTimesOutWithoutASignal) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::ZeroDuration()));
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, -absl::Seconds(1)));
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, -absl::InfiniteDuration()));
  const absl::Duration timeout = absl::Milliseconds(20);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  bool timed_out = false;
  // A spurious wake-up returns false early; the loop waits out the rest.
  while (!timed_out) timed_out = cv.WaitWithTimeout(&mu, deadline - absl::Now());
  // (Less a millisecond: the wait runs on the steady clock, absl::Now() on the system clock.)
  EXPECT_GE(absl::Now() - start, timeout - absl::Milliseconds(1));
}

TEST(CondVar, WaitWithTimeoutReturnsOnASignal) {
  Mutex mu;
  CondVar cv;
  bool ready = false;  // guarded by mu
  std::thread signaller([&] {
    MutexLock lock(&mu);
    ready = true;
    cv.SignalAll();
  });
  {
    MutexLock lock(&mu);
    // Long enough never to run out here: the signal ends the wait (infinite: no overflow either).
    while (!ready) EXPECT_FALSE(cv.WaitWithTimeout(&mu, absl::InfiniteDuration()));
    EXPECT_TRUE(ready);
  }
  signaller.join();
}

}  // namespace
}  // namespace tessera
