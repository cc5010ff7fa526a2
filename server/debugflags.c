/* -D NAME.FLAG=N: debug flags, set in a plugin's NAME_debug_FLAG variable
 * through dlsym before the plugin's load callback runs, as nbdkit does. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"

struct debug_flag {
  struct debug_flag *next;
  char *name;                     /* plugin or filter name, or "nbdkit" */
  char *flag;                     /* FLAG as given, dots included */
  int value;
  bool used;
};

static struct debug_flag *debug_flags;

int
debug_flag_add (const char *arg)
{
  const char *dot = strchr (arg, '.'), *eq = strchr (arg, '=');
  if (!dot || !eq || dot == arg || eq < dot + 2) {
    fprintf (stderr, "blkd: -D: expecting NAME.FLAG=N, got '%s'\n", arg);
    errno = EINVAL;
    return -1;
  }
  struct debug_flag *f = calloc (1, sizeof *f);
  if (!f)
    goto nomem;
  f->name = strndup (arg, dot - arg);
  f->flag = strndup (dot + 1, eq - dot - 1);
  if (!f->name || !f->flag)
    goto nomem;
  if (nbdkit_parse_int ("-D", eq + 1, &f->value) == -1) {
    free (f->name);
    free (f->flag);
    free (f);
    errno = EINVAL;
    return -1;
  }
  f->next = debug_flags;
  debug_flags = f;
  return 0;

nomem:
  if (f) {
    free (f->name);
    free (f->flag);
    free (f);
  }
  fprintf (stderr, "blkd: -D: out of memory\n");
  errno = ENOMEM;
  return -1;
}

int
debug_flags_apply (void *dl, const char *name, const char *path)
{
  for (struct debug_flag *f = debug_flags; f; f = f->next) {
    if (strcmp (f->name, name) != 0)
      continue;
    /* nbdkit's rule: the variable is NAME_debug_FLAG, with each '.' in
     * FLAG written as '_' ("-D memory.dir=1" sets memory_debug_dir). */
    char *var;
    if (asprintf (&var, "%s_debug_%s", name, f->flag) == -1) {
      fprintf (stderr, "blkd: -D: out of memory\n");
      errno = ENOMEM;
      return -1;
    }
    for (char *p = var + strlen (name) + 7; *p; p++)
      if (*p == '.')
        *p = '_';
    /* A flag the plugin lacks is a warning, not an error: nbdkit 1.32
     * starts anyway, and so do we. */
    int *sym = dlsym (dl, var);
    if (sym)
      *sym = f->value;
    else
      fprintf (stderr, "blkd: warning: -D %s.%s: %s does not contain a global "
               "variable called %s\n", f->name, f->flag, path, var);
    free (var);
    f->used = true;
  }
  return 0;
}

void
debug_flags_warn_unused (void)
{
  for (struct debug_flag *f = debug_flags; f; f = f->next) {
    /* nbdkit.* are nbdkit's own server flags (backend tracing, TLS
     * logging): blkd has no such variables, so they are accepted and
     * have no effect, which keeps nbdkit command lines working. */
    if (!f->used && strcmp (f->name, "nbdkit") != 0)
      fprintf (stderr, "blkd: warning: -D %s.%s: no plugin or filter is called %s\n",
               f->name, f->flag, f->name);
  }
}

void
debug_flags_free (void)
{
  while (debug_flags) {
    struct debug_flag *f = debug_flags;
    debug_flags = f->next;
    free (f->name);
    free (f->flag);
    free (f);
  }
}
