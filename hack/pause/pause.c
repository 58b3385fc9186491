/*
 * The pod sandbox's "pause" process, for the locally built image registry.k8s.io/pause:3.10.2
 * (hack/build-images.sh): it is PID 1 of the pod, holds the pod's namespaces, and
 *   - waits until SIGINT or SIGTERM, then exits 0;
 *   - reaps every child that exits (orphans of the pod's containers are re-parented to it when
 *     the pod shares its PID namespace).
 * Built with: musl-gcc -static -Os -s -o pause pause.c
 *
 * Signals are blocked outside sigsuspend(), so one arriving between the checks and the wait is
 * not lost (it stays pending and ends the very next sigsuspend()).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10.2 (csi-provisioner-rs hack/pause)"

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

/* Only interrupts sigsuspend(); the reaping is done in the main loop. */
static void on_child(int sig) { (void)sig; }

static void install(int sig, void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : SA_RESTART;
  if (sigaction(sig, &sa, NULL) != 0) {
    perror("pause: sigaction");
    _exit(2);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
    printf("pause %s\n", VERSION);
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not PID 1 (pid %d)\n", (int)getpid());
  }

  sigset_t blocked, waiting;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &blocked, &waiting) != 0) {
    perror("pause: sigprocmask");
    return 2;
  }
  sigdelset(&waiting, SIGINT);
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGCHLD);

  install(SIGINT, on_stop);
  install(SIGTERM, on_stop);
  install(SIGCHLD, on_child);

  for (;;) {
    /* Reap every child that has exited (several SIGCHLD may have merged into one). */
    for (;;) {
      pid_t pid = waitpid(-1, NULL, WNOHANG);
      if (pid > 0) continue;
      if (pid < 0 && errno == EINTR) continue;
      break; /* 0: children still running; -1 ECHILD: no children */
    }
    if (stop_signal) {
      fprintf(stderr, "pause: shutting down, got signal %d\n", (int)stop_signal);
      return 0;
    }
    sigsuspend(&waiting); /* returns -1 EINTR after a handler ran */
  }
}
