/* Work queues: a request queue, its lock and the worker threads that run
 * the function they were given.  Split mode gives each shard its own;
 * global mode shares one among all. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct queue {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct request *head, *tail;
  bool stopping;
  int nworkers;
  pthread_t *workers;
  queue_run_fn *run;                /* what a worker does with a request */
  char name[32];
};

static void *
queue_worker (void *arg)
{
  struct queue *q = arg;

  pthread_mutex_lock (&q->lock);
  for (;;) {
    while (!q->head && !q->stopping)
      pthread_cond_wait (&q->cond, &q->lock);
    if (!q->head)
      break;                        /* stopping and drained */
    struct request *r = q->head;
    q->head = r->next;
    if (!q->head)
      q->tail = NULL;
    pthread_mutex_unlock (&q->lock);

    q->run (r);

    pthread_mutex_lock (&q->lock);
  }
  pthread_mutex_unlock (&q->lock);
  return NULL;
}

struct queue *
queue_new (int nworkers, const char *name, queue_run_fn *run)
{
  struct queue *q = calloc (1, sizeof *q);
  if (!q)
    return NULL;
  q->run = run;
  pthread_mutex_init (&q->lock, NULL);
  pthread_cond_init (&q->cond, NULL);
  snprintf (q->name, sizeof q->name, "%s", name);
  q->workers = calloc (nworkers, sizeof *q->workers);
  if (!q->workers)
    goto fail;
  for (int i = 0; i < nworkers; i++) {
    int err = pthread_create (&q->workers[i], NULL, queue_worker, q);
    if (err) {
      errno = err;
      queue_stop (q);
      return NULL;
    }
    char tname[48];
    snprintf (tname, sizeof tname, "%s.w%d", name, i);
    tname[15] = '\0';                /* the kernel's limit for thread names */
    pthread_setname_np (q->workers[i], tname);
    q->nworkers++;
  }
  return q;
fail:
  free (q);
  errno = ENOMEM;
  return NULL;
}

void
queue_push (struct queue *q, struct request *r)
{
  r->next = NULL;
  pthread_mutex_lock (&q->lock);
  if (q->tail)
    q->tail->next = r;
  else
    q->head = r;
  q->tail = r;
  pthread_cond_signal (&q->cond);
  pthread_mutex_unlock (&q->lock);
}

void
queue_stop (struct queue *q)
{
  if (!q)
    return;
  pthread_mutex_lock (&q->lock);
  q->stopping = true;
  pthread_cond_broadcast (&q->cond);
  pthread_mutex_unlock (&q->lock);
  for (int i = 0; i < q->nworkers; i++)
    pthread_join (q->workers[i], NULL);
  free (q->workers);
  pthread_mutex_destroy (&q->lock);
  pthread_cond_destroy (&q->cond);
  free (q);
}
