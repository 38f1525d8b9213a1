/* Keeps a secret out of a process's command line, which /proc/PID/cmdline shows every local user.
 *
 * Loaded into tritonserver with LD_PRELOAD, this runs before its main: each argument holding MARK is
 * replaced, for main, by a copy on the heap with the secret (RECSERVE_ARGV_SECRET) in MARK's place. The
 * argument area the kernel shows keeps MARK; the variable's value is overwritten where the kernel shows the
 * environment and the variable removed before main runs, so neither the server's children nor /proc see it.
 */
#include <stdlib.h>
#include <string.h>

#define MARK "@RECSERVE_SECRET@"

__attribute__((constructor)) static void
put_secret(int argc, char** argv, char** envp)
{
  const char* found = getenv("RECSERVE_ARGV_SECRET");
  if (found == NULL) {
    return;
  }
  char* secret = strdup(found);
  if (secret == NULL) {
    abort(); /* never start with the mark where the secret belongs */
  }
  /* the variable's value overwritten where the kernel shows it (/proc/PID/environ), then removed */
  for (char** e = envp; *e != NULL; ++e) {
    if (strncmp(*e, "RECSERVE_ARGV_SECRET=", 21) == 0) {
      memset(*e + 21, '*', strlen(*e + 21));
    }
  }
  unsetenv("RECSERVE_ARGV_SECRET");
  const size_t mark = strlen(MARK), length = strlen(secret);
  for (int i = 0; i < argc; ++i) {
    char* at = strstr(argv[i], MARK);
    if (at == NULL) {
      continue;
    }
    const size_t head = (size_t)(at - argv[i]), tail = strlen(at + mark);
    char* copy = malloc(head + length + tail + 1);
    if (copy == NULL) {
      abort();
    }
    memcpy(copy, argv[i], head);
    memcpy(copy + head, secret, length);
    memcpy(copy + head + length, at + mark, tail + 1);
    argv[i] = copy;
  }
}
