/* Building the layer stack where the configuration is read, as nbdkit's
 * main.c does: the plugin, the cache (--cache), the --filter layers
 * outermost first; the key=value arguments routed through it; its thread
 * model; and tearing it down.  backend.c runs the calls on it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

int
backend_stack_load (const char *plugin, const char *const *filters, int nfilters,
                    int argc, char **argv)
{
  struct backend *b = plugin_layer_load (plugin);
  if (!b)
    return -1;
  backend_top = b;
  if (cfg.cache_size) {
    if (!(b = cache_layer_new (backend_top)))
      return -1;
    backend_top = b;
  }
  /* The first named is outermost, so load from the last. */
  for (int i = nfilters - 1; i >= 0; i--) {
    if (!(b = filter_layer_load (backend_top, filters[i])))
      return -1;
    backend_top = b;
  }

  /* key=value arguments go to the outermost layer, which keeps the keys
   * it knows and passes on the rest; a bare one is the plugin's
   * magic_config_key ("memory 1G" means "memory size=1G"). */
  const char *magic = backend_top->magic_config_key (backend_top);
  for (int i = 0; i < argc; i++) {
    char *eq = strchr (argv[i], '=');
    const char *key, *value;
    /* Split in place, as nbdkit does: layers keep the key and value
     * pointers (the eval plugin does), so they must live for ever. */
    if (eq && eq != argv[i]) {
      *eq = '\0';
      key = argv[i];
      value = eq + 1;
    }
    else {
      if (!magic) {
        fprintf (stderr, "blkd: %s: argument '%s' is not key=value and the plugin "
                 "has no magic config key\n", plugin_name (), argv[i]);
        return -1;
      }
      key = magic;
      value = argv[i];
    }
    if (backend_config (backend_top, key, value) == -1)
      return -1;
  }
  if (backend_config_complete (backend_top) == -1)
    return -1;
  backend_model = backend_top->thread_model (backend_top);
  if (backend_model < 0) {
    fprintf (stderr, "blkd: thread_model failed\n");
    return -1;
  }
  if (backend_top->get_ready (backend_top) == -1)
    return -1;
  public_config_done = true;

  backend_stack_inline = true;
  for (b = backend_top; b; b = b->next)
    backend_stack_inline &= b->inline_safe;

  if (backend_buffers_alloc () == -1) {
    fprintf (stderr, "blkd: out of memory\n");
    return -1;
  }
  return 0;
}

int
backend_stack_dump (const char *plugin, const char *const *filters, int nfilters)
{
  struct backend *b = plugin_layer_load (plugin);
  int err = 0;
  if (!b)
    return -1;
  backend_top = b;
  for (int i = nfilters - 1; i >= 0; i--) {
    if (!(b = filter_layer_load (backend_top, filters[i]))) {
      err = -1;
      break;
    }
    backend_top = b;
  }
  if (err == 0) {
    backend_model = backend_top->thread_model (backend_top);
    for (b = backend_top; b; b = b->next)
      if (!b->next)
        b->dump (b);              /* the plugin's fields, as nbdkit prints them */
    /* Then the filters, outermost first (nbdkit lists only the plugin). */
    for (b = backend_top; b && b->next; b = b->next)
      b->dump (b);
    fflush (stdout);
  }
  backend_stack_unload ();
  return err;
}

int
backend_stack_after_fork (void)
{
  return backend_top ? backend_top->after_fork (backend_top) : 0;
}

void
backend_stack_unload (void)
{
  if (backend_top && public_config_done)
    backend_top->cleanup (backend_top);       /* outer to inner */
  while (backend_top) {
    struct backend *b = backend_top;
    backend_top = b->next;
    b->unload (b);                            /* frees b */
  }
  backend_buffers_free ();
  public_config_done = false;       /* a stack loaded again configures again */
  public_release_global ();
}
