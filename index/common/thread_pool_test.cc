// Tests for ThreadPool: coverage of [0, n) by chunks, chunk sizes, concurrent and nested callers.
#include "index/common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace internal {
namespace {

// Runs ParallelFor and checks that every index is visited exactly once and every chunk is at least
// `grain` long (or the whole range when n < grain).
void CheckCoverage(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> visits(n > 0 ? n : 0);
  std::atomic<int64_t> short_chunks{0};
  std::atomic<int64_t> bad_bounds{0};
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    if (begin < 0 || end > n || begin >= end) {
      bad_bounds.fetch_add(1);
      return;
    }
    if (end - begin < grain && !(begin == 0 && end == n)) short_chunks.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
  });
  EXPECT_EQ(bad_bounds.load(), 0) << "n=" << n << " grain=" << grain;
  EXPECT_EQ(short_chunks.load(), 0) << "n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(visits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
  }
}

TEST(ThreadPool, CoversRangeExactlyOnceForManySizes) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 16, 100, 1001, 10000}) {
      for (int64_t grain : {-3, 0, 1, 2, 5, 64, 5000, 20000}) {
        CheckCoverage(pool, n, grain);
      }
    }
  }
}

TEST(ThreadPool, ZeroThreadsMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) {
    EXPECT_EQ(pool.num_threads(), static_cast<int>(hw));
  }
  CheckCoverage(pool, 12345, 7);
}

TEST(ThreadPool, SingleThreadRunsInlineOnCaller) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  bool all_on_caller = true;
  pool.ParallelFor(1000, 1, [&](int64_t begin, int64_t end) {
    ++calls;  // no synchronisation needed: everything runs on this thread
    all_on_caller = all_on_caller && std::this_thread::get_id() == caller;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 1000);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(all_on_caller);
}

TEST(ThreadPool, WorkersParticipate) {
  // Chunks that take a while: a woken worker must take some of them.
  ThreadPool pool(2);
  // std::mutex, not absl::Mutex: a prebuilt Abseil is invisible to ThreadSanitizer.
  std::mutex mu;
  std::vector<std::thread::id> ids;
  pool.ParallelFor(64, 1, [&](int64_t begin, int64_t end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu);
    ids.push_back(std::this_thread::get_id());
  });
  ASSERT_EQ(ids.size(), 64u);
  bool saw_other = false;
  for (const auto& id : ids) saw_other = saw_other || id != std::this_thread::get_id();
  EXPECT_TRUE(saw_other);
}

TEST(ThreadPool, ConcurrentCallersGetCorrectSums) {
  ThreadPool pool(4);
  constexpr int kCallers = 6;
  constexpr int kRounds = 50;
  std::vector<std::thread> callers;
  std::vector<int64_t> failures(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&pool, &failures, c] {
      for (int round = 0; round < kRounds; ++round) {
        const int64_t n = 1000 + 37 * c + round;
        std::vector<int64_t> out(n, 0);
        pool.ParallelFor(n, 1 + (round % 13), [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) out[i] = i * (c + 1);
        });
        for (int64_t i = 0; i < n; ++i) {
          if (out[i] != i * (c + 1)) ++failures[c];
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
}

TEST(ThreadPool, NestedParallelForDoesNotDeadlock) {
  ThreadPool pool(3);
  constexpr int64_t kOuter = 40;
  constexpr int64_t kInner = 300;
  std::vector<std::atomic<int64_t>> sums(kOuter);
  pool.ParallelFor(kOuter, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      pool.ParallelFor(kInner, 7, [&](int64_t b, int64_t e) {
        int64_t local = 0;
        for (int64_t i = b; i < e; ++i) local += i;
        sums[o].fetch_add(local);
      });
    }
  });
  for (int64_t o = 0; o < kOuter; ++o) EXPECT_EQ(sums[o].load(), kInner * (kInner - 1) / 2);
}

TEST(ThreadPool, DoublyNestedFromConcurrentCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      pool.ParallelFor(8, 1, [&](int64_t b0, int64_t e0) {
        for (int64_t x = b0; x < e0; ++x) {
          pool.ParallelFor(8, 1, [&](int64_t b1, int64_t e1) {
            for (int64_t y = b1; y < e1; ++y) {
              pool.ParallelFor(8, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
            }
          });
        }
      });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 8 * 8 * 8);
}

TEST(ThreadPool, DestructorJoinsIdleWorkers) {
  for (int i = 0; i < 20; ++i) {
    ThreadPool pool(4);
    CheckCoverage(pool, 100, 1);
  }
  SUCCEED();
}

}  // namespace
}  // namespace internal
}  // namespace tessera
