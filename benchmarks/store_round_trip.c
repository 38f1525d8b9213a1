/* The session store's round trip alone, as recserve's backend sends a batch of one by session: the ZRANGE of a
 * session's newest 40 members and the hidden items' version's GET pipelined, the replies read blocking, or after
 * spinning on the socket until they are there (at most SPIN_US; 0: blocking), 0.2 ms between calls as a load of
 * one request at a time leaves the store idle. Prints the round trip's p50, p90 and p99 in microseconds.
 *
 *   cc -O2 -I HIREDIS store_round_trip.c HIREDIS/{hiredis,net,read,sds,alloc,sockcompat,async,dict}.c
 *   ./a.out HOST PORT ROUNDS SPIN_US   (a store without a password: a scratch Valkey on loopback; the probe writes
 *   one key of its own, KEY below, and deletes it at the end)
 *
 * Exits 2 on bad arguments, 1 with the store's words where it refuses or fails a command: no figure is printed
 * from replies that were errors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include "hiredis.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

#define KEY "recserve-store-round-trip:h:probe"

// The store's reply of `type`, or its words and the exit: an error reply is never timed as an answer.
static int expect(redisContext* c, redisReply* r, int type, const char* what) {
  if (r == NULL || r->type != type) {
    fprintf(stderr, "%s failed: %s\n", what, r == NULL ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
    freeReplyObject(r);
    return 0;
  }
  freeReplyObject(r);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s HOST PORT ROUNDS SPIN_US\n", argv[0]);
    return 2;
  }
  const char* host = argv[1];
  int port = atoi(argv[2]), rounds = atoi(argv[3]);
  double spin_us = atof(argv[4]);
  if (port < 1 || port > 65535 || rounds < 1 || rounds > 10000000 || spin_us < 0) {
    fprintf(stderr, "PORT 1-65535, ROUNDS 1-10000000, SPIN_US 0 or more\n");
    return 2;
  }
  redisContext* c = redisConnect(host, port);
  if (!c || c->err) { fprintf(stderr, "connect failed: %s\n", c ? c->errstr : "out of memory"); return 1; }
  for (int i = 0; i < 200; ++i) {
    if (!expect(c, redisCommand(c, "ZADD " KEY " %d m%d", i, i), REDIS_REPLY_INTEGER, "ZADD")) return 1;
  }
  double* t = malloc(sizeof(double) * rounds);
  if (t == NULL) { fprintf(stderr, "out of memory\n"); return 1; }
  for (int i = 0; i < rounds; ++i) {
    double start = now_us();
    redisAppendCommand(c, "ZRANGE " KEY " -40 -1");
    redisAppendCommand(c, "GET " KEY ":version");
    int done = 0;
    while (!done) redisBufferWrite(c, &done);
    if (spin_us > 0) {
      char byte;
      while (now_us() - start < spin_us && recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) {
      }
    }
    for (int n = 0; n < 2; ++n) {
      void* r = NULL;
      if (redisGetReply(c, &r) != REDIS_OK) r = NULL;
      if (!expect(c, r, n == 0 ? REDIS_REPLY_ARRAY : REDIS_REPLY_NIL, n == 0 ? "ZRANGE" : "GET")) return 1;
    }
    t[i] = now_us() - start;
    struct timespec pause = {0, 200000};  // 0.2 ms between calls, as a c=1 load leaves the store idle
    nanosleep(&pause, NULL);
  }
  if (!expect(c, redisCommand(c, "DEL " KEY), REDIS_REPLY_INTEGER, "DEL")) return 1;
  redisFree(c);
  qsort(t, rounds, sizeof(double), cmp);
  printf("spin %.0f us: round trip p50 %.1f us, p90 %.1f, p99 %.1f (%d rounds)\n", spin_us, t[rounds / 2],
         t[rounds * 9 / 10], t[rounds * 99 / 100], rounds);
  return 0;
}
