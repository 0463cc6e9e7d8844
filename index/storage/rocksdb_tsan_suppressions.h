// For test binaries that use RocksDB: include from exactly one source file of the binary.
//
// RocksDB comes from the distribution, built without ThreadSanitizer: the atomics with which it
// publishes memtable entries to readers are invisible to TSan, so accesses on either side of them
// look like races. Under TSan this suppresses reports with a RocksDB frame (our own code's locks
// are pthread ones, which TSan sees), whether or not the run uses tsan.supp.
#ifndef TESSERA_INDEX_STORAGE_ROCKSDB_TSAN_SUPPRESSIONS_H_
#define TESSERA_INDEX_STORAGE_ROCKSDB_TSAN_SUPPRESSIONS_H_

#if defined(__SANITIZE_THREAD__)
#define TESSERA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TESSERA_TSAN 1
#endif
#endif
#ifdef TESSERA_TSAN
extern "C" const char* __tsan_default_suppressions() { return "race:rocksdb::\n"; }
// A long history, so that the RocksDB side of such a report still has its stack to match.
extern "C" const char* __tsan_default_options() { return "history_size=7"; }
#endif

#endif  // TESSERA_INDEX_STORAGE_ROCKSDB_TSAN_SUPPRESSIONS_H_
