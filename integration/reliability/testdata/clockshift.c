/*
 * clockshift: an LD_PRELOAD shim that moves a C program's wall clock.
 *
 * It shifts what clock_gettime(CLOCK_REALTIME[_COARSE]), gettimeofday and
 * time return by an offset in nanoseconds: a little-endian int64 at the
 * start of the file named by FENCEKIT_CLOCK_FILE, mapped shared, so that a
 * test moves the clock of a running process by writing the file in place
 * (never truncating it). The real time comes from raw syscalls, not the
 * vDSO. Monotonic clocks are left alone. Built by the reliability suite's
 * clock test with gcc; used on redis-server, whose key expiry and Lua TIME
 * follow its wall clock (libfaketime hangs Debian's redis-server 7.0).
 * It cannot fake time for Go programs, which do not call libc for it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns;

__attribute__((constructor)) static void clockshift_init(void) {
	const char *path = getenv("FENCEKIT_CLOCK_FILE");
	if (path == NULL)
		return;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	void *m = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m != MAP_FAILED)
		offset_ns = m;
}

static int64_t offset(void) { return offset_ns ? *offset_ns : 0; }

int clock_gettime(clockid_t id, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
		ts->tv_sec = ns / 1000000000;
		ts->tv_nsec = ns % 1000000000;
	}
	return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	(void)tz;
	struct timespec ts;
	int r = clock_gettime(CLOCK_REALTIME, &ts);
	if (r == 0) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return r;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return (time_t)-1;
	if (t != NULL)
		*t = ts.tv_sec;
	return ts.tv_sec;
}
