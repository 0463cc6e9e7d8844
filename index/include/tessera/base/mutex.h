// A reader-writer mutex, its scoped locks and a condition variable, on POSIX threads and the C++
// standard library, annotated for Clang's thread-safety analysis (ABSL_GUARDED_BY & co.). The one
// lock type of the project.
//
// Why not absl::Mutex: Debian's prebuilt Abseil is not compiled with ThreadSanitizer, so TSan
// cannot see its happens-before edges and reports false races on everything it guards; pthread
// rwlocks and the standard library's condition variables are intercepted by TSan.
#ifndef TESSERA_BASE_MUTEX_H_
#define TESSERA_BASE_MUTEX_H_

#include <pthread.h>

#include <condition_variable>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace tessera {

// Writers first, as with absl::Mutex: once a writer waits, new readers queue behind it, so a stream
// of overlapping readers (searches) cannot starve it. std::shared_mutex cannot be asked for this;
// on glibc it is a default-kind pthread rwlock, which admits readers ahead of a waiting writer for
// as long as any reader holds it. Hence reader locks are not reentrant: a thread must not take a
// reader lock it already holds (a writer arriving in between would deadlock it).
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  ~Mutex() { pthread_rwlock_destroy(&mu_); }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Check(pthread_rwlock_wrlock(&mu_)); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { Check(pthread_rwlock_unlock(&mu_)); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { Check(pthread_rwlock_rdlock(&mu_)); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { Check(pthread_rwlock_unlock(&mu_)); }
  // For the analysis only (e.g. inside callbacks run under the lock); checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

  // BasicLockable (exclusive), for CondVar.
  void lock() { Check(pthread_rwlock_wrlock(&mu_)); }
  void unlock() { Check(pthread_rwlock_unlock(&mu_)); }

 private:
  // The calls fail only on misuse (EDEADLK: relocking a lock this thread holds exclusively), a bug
  // that must not go on unguarded.
  static void Check(int error) {
    if (error != 0) std::abort();
  }

#ifdef PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP
  pthread_rwlock_t mu_ = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
#else
#error "Mutex needs a writer-preferring pthread rwlock (glibc's PREFER_WRITER_NONRECURSIVE_NP)"
#endif
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Atomically releases `mu` (held exclusively), waits for a signal, and reacquires it. May wake
  // spuriously: call in a loop.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(*mu); }
  // Wait() for at most `timeout`; true when it timed out. Waits longer than a day end after a day,
  // as a spurious wake-up (steady_clock::now() plus a longer std::chrono duration can overflow).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout <= absl::ZeroDuration()) return true;
    const absl::Duration max_wait = absl::Hours(24);
    if (timeout > max_wait) {
      cv_.wait_for(*mu, absl::ToChronoNanoseconds(max_wait));
      return false;
    }
    return cv_.wait_for(*mu, absl::ToChronoNanoseconds(timeout)) == std::cv_status::timeout;
  }
  // Wakes one waiter (Signal) or all of them (SignalAll).
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace tessera

#endif  // TESSERA_BASE_MUTEX_H_
