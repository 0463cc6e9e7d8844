// OpenMP thread control for code that calls into FAISS (which parallelises with OpenMP).
#ifndef TESSERA_INDEX_COMMON_OMP_THREADS_H_
#define TESSERA_INDEX_COMMON_OMP_THREADS_H_

#include <omp.h>

namespace tessera::internal {

// FAISS parallelises its work over OpenMP threads (IndexHNSW::search opens a parallel region even
// for one query). The server runs many searches at once on its own threads, so FAISS calls made
// while serving stay on their calling thread: omp_set_num_threads changes only the calling
// thread's ICV, so other threads keep theirs. ThreadSanitizer cannot see libgomp's
// synchronisation, which is one more reason to keep FAISS single-threaded where TSan runs.
class ScopedSingleOmpThread {
 public:
  ScopedSingleOmpThread() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~ScopedSingleOmpThread() { omp_set_num_threads(previous_); }
  ScopedSingleOmpThread(const ScopedSingleOmpThread&) = delete;
  ScopedSingleOmpThread& operator=(const ScopedSingleOmpThread&) = delete;

 private:
  int previous_;
};

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_OMP_THREADS_H_
