// FanOut waits for completions that arrive on other threads, in any order, including ones that
// complete before `start` returns.
#include "server/cluster/fan_out.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::cluster {
namespace {

TEST(FanOut, ReturnsOnlyAfterEveryCompletionWhateverThreadAndOrder) {
  constexpr size_t kCalls = 16;
  std::vector<int> results(kCalls, 0);
  std::vector<std::thread> completions;
  FanOut(kCalls, [&](size_t i, std::function<void()> done) {
    if (i % 4 == 0) {  // completes inline, before start returns
      results[i] = static_cast<int>(i) + 1;
      done();
      return;
    }
    completions.emplace_back([&results, i, done = std::move(done)] {
      // Later calls finish first: the wait cannot be satisfied by a count of early finishers.
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * (kCalls - i)));
      results[i] = static_cast<int>(i) + 1;
      done();
    });
  });
  for (size_t i = 0; i < kCalls; ++i) EXPECT_EQ(results[i], static_cast<int>(i) + 1) << i;
  for (std::thread& thread : completions) thread.join();
}

TEST(FanOut, OfNothingReturnsAtOnce) {
  int started = 0;
  FanOut(0, [&](size_t, std::function<void()>) { ++started; });
  EXPECT_EQ(started, 0);
}

}  // namespace
}  // namespace tessera::cluster
