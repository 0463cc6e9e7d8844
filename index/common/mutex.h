// A reader-writer mutex, its scoped locks and a condition variable, on the C++ standard library
// and annotated for Clang's thread-safety analysis (ABSL_GUARDED_BY & co.).
//
// Why not absl::Mutex: Debian's prebuilt Abseil is not compiled with ThreadSanitizer, so TSan
// cannot see its happens-before edges and reports false races on everything it guards; the standard
// library's primitives are intercepted by TSan.
#ifndef TESSERA_INDEX_COMMON_MUTEX_H_
#define TESSERA_INDEX_COMMON_MUTEX_H_

#include <condition_variable>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace tessera::internal {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  // For the analysis only (e.g. inside callbacks run under the lock); checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

  // BasicLockable, for CondVar.
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  std::shared_mutex mu_;
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
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_MUTEX_H_
