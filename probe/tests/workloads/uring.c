/* One io_uring operation, submitted by hand (no liburing): what tokio-uring,
 * glommio or libuv do underneath. The kernel tests run it under
 * `probe trace`; none of these operations makes an openat/connect syscall.
 *
 *   uring open PATH         IORING_OP_OPENAT, read-only
 *   uring open-async PATH   the same, forced onto an io-wq worker (IOSQE_ASYNC)
 *   uring create PATH       IORING_OP_OPENAT, O_WRONLY|O_CREAT|O_TRUNC
 *   uring read PATH         open, then IORING_OP_READ
 *   uring sneak PATH        open(2) first; when refused, open and read
 *                           through io_uring instead
 *   uring connect IP PORT   IORING_OP_CONNECT of a TCP socket
 *
 * Exits 1 when the operation fails, 2 when io_uring itself is unusable. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int ring_fd;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;

static void *map(size_t len, off_t what) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, what);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

static void setup(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    ring_fd = syscall(__NR_io_uring_setup, 4, &p);
    if (ring_fd < 0) {
        perror("io_uring_setup");
        exit(2);
    }
    char *sq = map(p.sq_off.array + p.sq_entries * sizeof(unsigned), IORING_OFF_SQ_RING);
    char *cq = map(p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), IORING_OFF_CQ_RING);
    sqes = map(p.sq_entries * sizeof(struct io_uring_sqe), IORING_OFF_SQES);
    sq_tail = (unsigned *)(sq + p.sq_off.tail);
    sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head);
    cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

/* Submits one request and waits for its completion: the cqe's res. */
static int run(const struct io_uring_sqe *req) {
    unsigned tail = *sq_tail, i = tail & *sq_mask;
    sqes[i] = *req;
    sq_array[i] = i;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, ring_fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
        perror("io_uring_enter");
        exit(2);
    }
    unsigned head = *cq_head;
    while (head == __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE))
        ;
    int res = cqes[head & *cq_mask].res;
    __atomic_store_n(cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

static int uring_open(const char *path, int flags, int async) {
    struct io_uring_sqe s;
    memset(&s, 0, sizeof s);
    s.opcode = IORING_OP_OPENAT;
    s.fd = AT_FDCWD;
    s.addr = (unsigned long)path;
    s.open_flags = flags;
    s.len = 0644;
    if (async)
        s.flags = IOSQE_ASYNC;
    int fd = run(&s);
    if (fd < 0) {
        fprintf(stderr, "io_uring openat %s: %s\n", path, strerror(-fd));
        exit(1);
    }
    return fd;
}

static void uring_read(int fd) {
    char buf[4096];
    struct io_uring_sqe s;
    memset(&s, 0, sizeof s);
    s.opcode = IORING_OP_READ;
    s.fd = fd;
    s.addr = (unsigned long)buf;
    s.len = sizeof buf;
    int n = run(&s);
    if (n < 0) {
        fprintf(stderr, "io_uring read: %s\n", strerror(-n));
        exit(1);
    }
    printf("read %d bytes\n", n);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: uring open|open-async|create|read|sneak PATH | connect IP PORT\n");
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "sneak")) {
        int fd = open(argv[2], O_RDONLY);
        if (fd >= 0) {
            fprintf(stderr, "open(2) was allowed: nothing to sneak past\n");
            return 3;
        }
        fprintf(stderr, "open(2) %s: %s; trying io_uring\n", argv[2], strerror(errno));
    }
    setup();
    if (!strcmp(mode, "open") || !strcmp(mode, "open-async")) {
        uring_open(argv[2], O_RDONLY, !strcmp(mode, "open-async"));
    } else if (!strcmp(mode, "create")) {
        uring_open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0);
    } else if (!strcmp(mode, "read") || !strcmp(mode, "sneak")) {
        uring_read(uring_open(argv[2], O_RDONLY, 0));
    } else if (!strcmp(mode, "connect") && argc > 3) {
        int sock = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
        if (sock < 0 || inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
            perror("socket");
            return 2;
        }
        struct io_uring_sqe s;
        memset(&s, 0, sizeof s);
        s.opcode = IORING_OP_CONNECT;
        s.fd = sock;
        s.addr = (unsigned long)&a;
        s.off = sizeof a;
        int r = run(&s);
        if (r < 0) {
            fprintf(stderr, "io_uring connect %s:%s: %s\n", argv[2], argv[3], strerror(-r));
            return 1;
        }
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
