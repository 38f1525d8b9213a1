/* A direct append to the session store from a compiled client: the commands recserve's backend sends for one
 * event (docs/sessions.md's contract: MULTI, ZADD NX of "EVENT_ID ITEM" scored by time, ZREMRANGEBYRANK to the
 * window, EXPIRE, EXEC), pipelined in one round trip with hiredis, as a Java or Go service writing to its own
 * store would. benchmarks/events_latency.py compiles and runs it beside the events models.
 *
 *   RECSERVE_STORE_PASSWORD=... direct_append HOST PORT USERNAME PREFIX CALLS WINDOW TTL_S
 *   (USERNAME "": the default user; the password from the environment, never the command line, which any user
 *   of the machine can read)
 *
 * Prints each append's microseconds, a line each; exits 1 with the store's words where an append fails. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "hiredis.h"

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char** argv)
{
  if (argc != 8) {
    fprintf(stderr, "usage: RECSERVE_STORE_PASSWORD=... %s HOST PORT USERNAME PREFIX CALLS WINDOW TTL_S\n", argv[0]);
    return 2;
  }
  const char *host = argv[1], *username = argv[3], *prefix = argv[4];
  const char* password = getenv("RECSERVE_STORE_PASSWORD") ? getenv("RECSERVE_STORE_PASSWORD") : "";
  const int port = atoi(argv[2]), calls = atoi(argv[5]), window = atoi(argv[6]), ttl = atoi(argv[7]);
  redisContext* c = redisConnect(host, port);
  if (c == NULL || c->err) {
    fprintf(stderr, "cannot reach the store: %s\n", c ? c->errstr : "out of memory");
    return 1;
  }
  if (password[0] != '\0') {
    redisReply* reply = username[0] != '\0' ? redisCommand(c, "AUTH %s %s", username, password)
                                             : redisCommand(c, "AUTH %s", password);
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
      fprintf(stderr, "AUTH refused: %s\n", reply ? reply->str : c->errstr);
      return 1;
    }
    freeReplyObject(reply);
  }
  char key[256], member[64], score[32], first[32], seconds[32];
  snprintf(first, sizeof(first), "%d", -window - 1);
  snprintf(seconds, sizeof(seconds), "%d", ttl);
  for (int n = 0; n < calls; ++n) {
    const double start = now_s();
    snprintf(key, sizeof(key), "%sh:c-%d", prefix, n % 50);
    snprintf(member, sizeof(member), "direct-%d %d", n, 1 + n % 2000);
    snprintf(score, sizeof(score), "%.6f", start);
    redisAppendCommand(c, "MULTI");
    redisAppendCommand(c, "ZADD %s NX %s %s", key, score, member);
    redisAppendCommand(c, "ZREMRANGEBYRANK %s 0 %s", key, first);
    redisAppendCommand(c, "EXPIRE %s %s", key, seconds);
    redisAppendCommand(c, "EXEC");
    for (int r = 0; r < 5; ++r) {
      void* raw = NULL;
      if (redisGetReply(c, &raw) != REDIS_OK) {
        fprintf(stderr, "the store did not answer: %s\n", c->errstr);
        return 1;
      }
      redisReply* reply = raw;
      if (reply->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "the store refused an append: %s\n", reply->str);
        return 1;
      }
      freeReplyObject(reply);
    }
    printf("%.1f\n", (now_s() - start) * 1e6);
  }
  redisFree(c);
  return 0;
}
