/* `flowlua --ranks N`: N rank processes forked from one flowlua and joined by rings in shared
 * memory and a full mesh of Unix-domain sockets (comm_local.c), a job with mpirun's semantics and
 * no mpirun. The launching process stays as the job's parent: it waits for the ranks and ends the
 * job as mpirun does. */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm_local.h"
#include "error.h"

static volatile sig_atomic_t asked_to_end; /* a signal that ends the job (SIGTERM, SIGHUP) */
static volatile sig_atomic_t aborted;      /* SIGUSR1: a rank aborts (its notice is on the pipe) */

static void on_end(int sig) { asked_to_end = sig; }
static void on_abort(int sig) { (void)sig; aborted = 1; }

/* A rank's wait status as the job's exit code: its exit status, or 128 + the signal that ended it. */
static int exit_code(int st) { return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WIFEXITED(st) ? WEXITSTATUS(st) : 0; }

/* Which rank ended the job, once a failure was seen (status[q] >= 0: reaped; those gone by now are
 * reaped first): one killed by a signal (nothing here kills one in turn), else the first that
 * aborted (an uncaught error: it said so on `aborts` before it exited, so before any peer could
 * fail on seeing it leave), else r, the first seen to fail. Sets the job's exit code. */
static int pick(int n, const pid_t *pid, int *status, int *left, int aborts, int r, int *code) {
  int st;
  /* A killed rank's sockets close before the kernel lets its parent reap it, so a peer may fail on
   * seeing it leave and say so first: look for a killed rank for up to 100 ms. */
  for (int tries = 0; tries < 20; tries++) {
    for (int q = 0; q < n; q++)
      if (status[q] < 0 && waitpid(pid[q], &st, WNOHANG) == pid[q]) { status[q] = st; (*left)--; }
    for (int q = 0; q < n; q++)
      if (status[q] >= 0 && WIFSIGNALED(status[q])) { *code = exit_code(status[q]); return q; }
    nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  flow_comm_local_abort_notice a;
  if (read(aborts, &a, sizeof a) == (ssize_t)sizeof a && a.rank >= 0 && a.rank < n && a.code) {
    *code = a.code;
    return a.rank;
  }
  *code = r >= 0 ? exit_code(status[r]) : EXIT_FAILURE;
  return r >= 0 ? r : 0;
}

/* blame, also saying how many other ranks were still running when the failure was seen (the wait
 * for a killed rank may let them fail on their own meanwhile). */
static int blame(int n, const pid_t *pid, int *status, int *left, int aborts, int r, int *code, int *others) {
  bool *running = malloc((size_t)n * sizeof *running);
  for (int q = 0; running && q < n; q++) running[q] = status[q] < 0;
  int who = pick(n, pid, status, left, aborts, r, code);
  *others = 0;
  for (int q = 0; q < n; q++) *others += q != who && (running ? running[q] : status[q] < 0);
  free(running);
  return who;
}

/* Say which rank ended the job and how, and end the others. */
static void end_job(const char *prog, int who, int code, int n, const pid_t *pid, const int *status, int left) {
  if (status[who] >= 0 && WIFSIGNALED(status[who]))
    fprintf(stderr, "%s: rank %d was killed by signal %d (%s)%s\n", prog, who, WTERMSIG(status[who]),
            strsignal(WTERMSIG(status[who])), left ? "; ending the job" : "");
  else
    fprintf(stderr, "%s: rank %d exited with status %d%s\n", prog, who, code, left ? "; ending the job" : "");
  fflush(stderr);
  for (int q = 0; q < n; q++)
    if (status[q] < 0) kill(pid[q], SIGKILL);
}

/* The parent: wait for every rank. The first that fails ends the others at once, as mpirun ends a
 * job when a rank aborts or dies, and its status is the job's: a rank that aborts (an uncaught
 * error) signals the parent before it exits, so the others are ended before they fail on seeing
 * it leave; a rank that exits failing or is killed is seen when it has gone, and the others are
 * given a moment to fail after it, to tell which was first. */
static int wait_ranks(int n, const pid_t *pid, int aborts, const char *prog) {
  int left = n, code = 0, *status = malloc((size_t)n * sizeof *status);
  if (!status) return EXIT_FAILURE;
  for (int q = 0; q < n; q++) status[q] = -1;
  while (left > 0) {
    int st, r = 0;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0) {
      if (errno != EINTR) break;
      if (aborted && !code) {
        int others, who = blame(n, pid, status, &left, aborts, -1, &code, &others);
        end_job(prog, who, code, n, pid, status, others);
      }
      if (asked_to_end)
        for (int q = 0; q < n; q++)
          if (status[q] < 0) kill(pid[q], (int)asked_to_end);
      continue;
    }
    while (r < n && pid[r] != p) r++;
    if (r == n) continue;
    status[r] = st;
    left--;
    if (code || !exit_code(st)) continue;
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    int others, who = blame(n, pid, status, &left, aborts, r, &code, &others);
    end_job(prog, who, code, n, pid, status, others);
  }
  free(status);
  return code;
}

/* The child that is rank r: its row of the mesh, its terminal and signals as under mpirun. */
static void become_rank(int r, int n, int *fd, flow_ring_region *shm, int aborts, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* the job ends with its parent */
  if (getppid() != parent) _exit(EXIT_FAILURE);
  int *row = malloc((size_t)n * sizeof *row);
  if (!row) _exit(EXIT_FAILURE);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (i == j) continue;
      if (i == r) row[j] = fd[i * n + j];
      else close(fd[i * n + j]);
    }
  row[r] = -1;
  int sigs[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
  if (r > 0) {
    /* only rank 0 reads stdin, and a Ctrl-C at the terminal reaches rank 0 alone (the REPL passes
     * it on), as under mpirun */
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) { dup2(null, 0); close(null); }
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* the ranks share the output: whole lines, as mpirun passes them on */
  /* the ranks share the cores: oneDNN's OpenMP team gets this rank's share (mpirun binds a rank to
   * one core), unless the user chose */
  if (!getenv("FLOW_NUM_THREADS") && !getenv("OMP_NUM_THREADS")) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char k[24];
    snprintf(k, sizeof k, "%ld", cores / n > 1 ? cores / n : 1);
    setenv("FLOW_NUM_THREADS", k, 1);
  }
  flow_comm_local_join(r, n, row, shm, aborts);
  free(row);
}

int flow_comm_launch_local(int n, const char *prog) {
  if (n < 1) return flow_error_set("--ranks: the number of ranks must be at least 1 (got %d)", n);
  int *fd = malloc((size_t)n * (size_t)n * sizeof *fd);
  pid_t *pid = calloc((size_t)n, sizeof *pid);
  if (!fd || !pid) { free(fd); free(pid); return flow_error_set("--ranks: out of memory"); }
  flow_ring_region *shm = flow_ring_map(n);
  if (!shm) return flow_error_set("--ranks: cannot map shared memory for %d ranks: %s", n, strerror(errno));
  /* the sockets carry no data, only doorbells, and close when a rank exits or dies */
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return flow_error_set("--ranks: cannot connect %d ranks: %s", n, strerror(errno));
      fd[i * n + j] = sv[0];
      fd[j * n + i] = sv[1];
    }
  int aborts[2];
  if (pipe2(aborts, O_CLOEXEC | O_NONBLOCK) != 0)
    return flow_error_set("--ranks: cannot make the abort channel: %s", strerror(errno));
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  /* the parent leaves Ctrl-C to rank 0 (which ends, or, in the REPL, interrupts its line); its own
   * handlers are in place before a rank can signal it */
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_end;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sa.sa_handler = on_abort;
  sigaction(SIGUSR1, &sa, NULL);
  for (int r = 0; r < n; r++) {
    pid[r] = fork();
    if (pid[r] == 0) {
      free(pid);
      close(aborts[0]);
      become_rank(r, n, fd, shm, aborts[1], parent);
      free(fd);
      return 0;
    }
    if (pid[r] < 0) {
      fprintf(stderr, "%s: --ranks: cannot start rank %d: %s\n", prog, r, strerror(errno));
      for (int q = 0; q < r; q++) kill(pid[q], SIGKILL);
      exit(EXIT_FAILURE);
    }
  }
  for (int i = 0; i < n * n; i++)
    if (i / n != i % n) close(fd[i]);
  free(fd);
  close(aborts[1]);
  int code = wait_ranks(n, pid, aborts[0], prog);
  free(pid);
  exit(code);
}
