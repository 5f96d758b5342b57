/* clock_shift: an LD_PRELOAD library that moves the wall clock of a process by
 * CLOCK_SHIFT_US microseconds (may be negative), so the tests can run a real
 * redis-server at a month boundary or a daylight-saving change.
 *
 * libfaketime hangs redis-server at start: jemalloc reads the clock while it
 * initializes, and libfaketime's dlsym() allocates. This library calls the
 * kernel directly (syscall), so it never allocates and needs no dlsym().
 * Only wall-clock time moves; monotonic clocks are left alone.
 *
 * CLOCK_SHIFT_FILE names a file of 8 bytes, a native int64 of microseconds added on
 * top, read at every call through a shared mapping: a test moves the clock of a
 * running server forward by writing it (tests/clock_shift.py's MovableClock). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_us(void) {
    static int read = 0;
    static long long value = 0;
    if (!read) {
        const char *text = getenv("CLOCK_SHIFT_US");
        value = text ? atoll(text) : 0;
        read = 1;
    }
    return value;
}

static volatile long long *moved(void) {
    static int mapped = 0;
    static volatile long long *value = 0;
    if (!mapped) {
        mapped = 1;
        const char *path = getenv("CLOCK_SHIFT_FILE");
        if (path) {
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                void *map = mmap(0, sizeof(long long), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (map != MAP_FAILED) value = (volatile long long *)map;
            }
        }
    }
    return value;
}

static int is_wall_clock(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE;
}

static void add_us(struct timespec *ts, long long us) {
    long long ns = (long long)ts->tv_nsec + (us % 1000000LL) * 1000LL;
    ts->tv_sec += (time_t)(us / 1000000LL);
    while (ns < 0) { ns += 1000000000LL; ts->tv_sec -= 1; }
    while (ns >= 1000000000LL) { ns -= 1000000000LL; ts->tv_sec += 1; }
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int result = (int)syscall(SYS_clock_gettime, clock, ts);
    if (result == 0 && is_wall_clock(clock)) {
        volatile long long *more = moved();
        add_us(ts, shift_us() + (more ? *more : 0));
    }
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
