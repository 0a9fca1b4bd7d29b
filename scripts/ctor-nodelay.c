// A diagnostic shim: TCP_NODELAY on every TCP socket a process connects
// or accepts. C tor leaves Nagle's algorithm on; this measures what that
// costs it in the lab (docs/results/seed000.md, "C tor beside onionlab").
// Build and use (the lab's children inherit LD_PRELOAD; onionlab's own
// sockets have TCP_NODELAY already):
//
//   gcc -shared -fPIC -O2 -o /tmp/ctor-nodelay.so scripts/ctor-nodelay.c -ldl
//   LD_PRELOAD=/tmp/ctor-nodelay.so ./target/release/onionlab --log warn \
//       lab run ctor-nagle --out results/ctor-nagle-nodelay
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void nodelay(int fd) {
    int type = 0, one = 1;
    socklen_t len = sizeof type;
    if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = dlsym(RTLD_NEXT, "connect");
    if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) nodelay(fd);
    return real(fd, addr, len);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = dlsym(RTLD_NEXT, "accept");
    int c = real(fd, addr, len);
    nodelay(c);
    return c;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = dlsym(RTLD_NEXT, "accept4");
    int c = real(fd, addr, len, flags);
    nodelay(c);
    return c;
}
