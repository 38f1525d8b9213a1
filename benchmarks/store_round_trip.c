/* The session store's round trip alone, as recserve's backend sends a batch of one by session: the ZRANGE of a
 * session's newest 40 members and the hidden items' version's GET pipelined, the replies read blocking, or after
 * spinning on the socket until they are there (at most SPIN_US; 0: blocking), 0.2 ms between calls as a load of
 * one request at a time leaves the store idle. Prints the round trip's p50, p90 and p99 in microseconds.
 *
 *   cc -O2 -I HIREDIS store_round_trip.c HIREDIS/{hiredis,net,read,sds,alloc,sockcompat,async,dict}.c
 *   ./a.out HOST PORT ROUNDS SPIN_US   (a store without a password: a scratch Valkey on loopback) */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char** argv) {
  const char* host = argc > 1 ? argv[1] : "127.0.0.1";
  int port = argc > 2 ? atoi(argv[2]) : 6379;
  int rounds = argc > 3 ? atoi(argv[3]) : 3000;
  double spin_us = argc > 4 ? atof(argv[4]) : 0;
  redisContext* c = redisConnect(host, port);
  if (!c || c->err) { fprintf(stderr, "connect failed\n"); return 1; }
  for (int i = 0; i < 200; ++i) {
    redisReply* r = redisCommand(c, "ZADD rt:h:s %d m%d", i, i);
    freeReplyObject(r);
  }
  double* t = malloc(sizeof(double) * rounds);
  for (int i = 0; i < rounds; ++i) {
    double start = now_us();
    redisAppendCommand(c, "ZRANGE rt:h:s -40 -1");
    redisAppendCommand(c, "GET rt:version");
    int done = 0;
    while (!done) redisBufferWrite(c, &done);
    if (spin_us > 0) {
      char byte;
      while (now_us() - start < spin_us && recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) {
      }
    }
    for (int n = 0; n < 2; ++n) {
      void* r;
      if (redisGetReply(c, &r) != REDIS_OK) { fprintf(stderr, "reply failed\n"); return 1; }
      freeReplyObject(r);
    }
    t[i] = now_us() - start;
    struct timespec pause = {0, 200000};  // 0.2 ms between calls, as a c=1 load leaves the store idle
    nanosleep(&pause, NULL);
  }
  qsort(t, rounds, sizeof(double), cmp);
  printf("spin %.0f us: round trip p50 %.1f us, p90 %.1f, p99 %.1f (%d rounds)\n", spin_us, t[rounds / 2],
         t[rounds * 9 / 10], t[rounds * 99 / 100], rounds);
  return 0;
}
