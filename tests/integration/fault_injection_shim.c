/* An LD_PRELOAD shim that makes writes and syncs of files under one directory fail with EIO,
 * switched on and off at run time: the disk fault tests run under it (io_fault_test).
 *
 *   TESSERA_FAULT_DIR      faults apply to file descriptors whose path starts with it
 *   TESSERA_FAULT_TRIGGER  a file: while it exists, its contents name the failing calls, "fsync"
 *                          (fsync, fdatasync) and/or "write" (write, pwrite, pwrite64, writev,
 *                          pwritev)
 *
 * Without both variables every call goes straight through. The trigger is read on every call, so
 * a test switches faults by writing and deleting the file (keep it outside TESSERA_FAULT_DIR).
 * sync_file_range is left alone: RocksDB probes it at open and asserts it succeeds or is ENOSYS. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { kFaultSync = 1, kFaultWrite = 2 };

static const char* fault_dir;
static size_t fault_dir_length;
static const char* fault_trigger;

__attribute__((constructor)) static void Init(void) {
  fault_dir = getenv("TESSERA_FAULT_DIR");
  fault_trigger = getenv("TESSERA_FAULT_TRIGGER");
  fault_dir_length = fault_dir != NULL ? strlen(fault_dir) : 0;
}

/* Lets a test check that it runs under the shim. */
int tessera_fault_shim_loaded(void) { return 1; }

/* The faults the trigger file asks for (0 when it does not exist). Uses read/open/close, which
 * the shim does not wrap. */
static int ActiveFaults(void) {
  if (fault_dir == NULL || fault_trigger == NULL || fault_dir_length == 0) return 0;
  const int fd = open(fault_trigger, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char modes[64];
  const ssize_t n = read(fd, modes, sizeof(modes) - 1);
  close(fd);
  if (n <= 0) return 0;
  modes[n] = '\0';
  int faults = 0;
  if (strstr(modes, "fsync") != NULL) faults |= kFaultSync;
  if (strstr(modes, "write") != NULL) faults |= kFaultWrite;
  return faults;
}

static int UnderFaultDir(int fd) {
  char link[64];
  char path[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strncmp(path, fault_dir, fault_dir_length) == 0;
}

/* Whether a call of kind `fault` on `fd` fails; sets errno to EIO when it does. Standard streams
 * are never failed (a test's own output must get out). */
static int Fails(int fd, int fault) {
  if (fd <= 2 || (ActiveFaults() & fault) == 0 || !UnderFaultDir(fd)) return 0;
  errno = EIO;
  return 1;
}

#define REAL(name)                                            \
  static __typeof__(name)* real_##name = NULL;                \
  if (real_##name == NULL) {                                  \
    real_##name = (__typeof__(name)*)dlsym(RTLD_NEXT, #name); \
  }

int fsync(int fd) {
  REAL(fsync);
  return Fails(fd, kFaultSync) ? -1 : real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync);
  return Fails(fd, kFaultSync) ? -1 : real_fdatasync(fd);
}

ssize_t write(int fd, const void* buffer, size_t count) {
  REAL(write);
  return Fails(fd, kFaultWrite) ? -1 : real_write(fd, buffer, count);
}

ssize_t pwrite(int fd, const void* buffer, size_t count, off_t offset) {
  REAL(pwrite);
  return Fails(fd, kFaultWrite) ? -1 : real_pwrite(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void* buffer, size_t count, off64_t offset) {
  REAL(pwrite64);
  return Fails(fd, kFaultWrite) ? -1 : real_pwrite64(fd, buffer, count, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  REAL(writev);
  return Fails(fd, kFaultWrite) ? -1 : real_writev(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t offset) {
  REAL(pwritev);
  return Fails(fd, kFaultWrite) ? -1 : real_pwritev(fd, iov, count, offset);
}
