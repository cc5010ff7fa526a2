/* Where the layers' shared objects come from: a plugin's or filter's name
 * checked, resolved to nbdkit-NAME-KIND.so in the tree next to the
 * running binary, blkd's directory or nbdkit's, loaded, and its init
 * function called. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

char *
layer_exe_dir (void)
{
  char buf[PATH_MAX];
  ssize_t n = readlink ("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  char *slash = strrchr (buf, '/');
  if (slash)
    *slash = '\0';
  return strdup (buf);
}

bool
layer_valid_name (const char *name)
{
  if (!name || !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z')
                 || (name[0] >= '0' && name[0] <= '9')))
    return false;
  for (const char *s = name; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')
          || (*s >= '0' && *s <= '9') || *s == '-'))
      return false;
  return true;
}

/* A name with a '/' or ending in .so is a path; otherwise look for
 * nbdkit-NAME-KIND.so in tree_dir/NAME/ (next to the running binary),
 * then blkd's directory, then nbdkit's.  NULL if none is readable. */
char *
layer_find_so (const char *name, const char *kind, const char *tree_dir,
                 const char *blkd_dir, const char *nbdkit_dir)
{
  size_t len = strlen (name);
  if (strchr (name, '/') || (len > 3 && strcmp (name + len - 3, ".so") == 0)) {
    char *resolved = realpath (name, NULL);
    return resolved ? resolved : strdup (name);
  }
  char *exe = layer_exe_dir ();
  char *path = NULL;
  for (int i = 0; i < 3; i++) {
    int r;
    if (i == 0)
      r = exe ? asprintf (&path, "%s/%s/%s/nbdkit-%s-%s.so", exe, tree_dir, name, name, kind)
              : -1;
    else
      r = asprintf (&path, "%s/nbdkit-%s-%s.so", i == 1 ? blkd_dir : nbdkit_dir, name, kind);
    if (r < 0) {
      path = NULL;
      continue;
    }
    if (access (path, R_OK) == 0)
      break;
    free (path);
    path = NULL;
  }
  free (exe);
  return path;
}

void *
layer_load (enum layer_kind kind, const char *name, char **filename, void **dl)
{
  const char *what = kind == LAYER_PLUGIN ? "plugin" : "filter";
  const char *blkd_dir = kind == LAYER_PLUGIN ? BLKD_PLUGINDIR : BLKD_FILTERDIR;
  const char *nbdkit_dir = kind == LAYER_PLUGIN ? NBDKIT_PLUGINDIR : NBDKIT_FILTERDIR;

  *dl = NULL;
  *filename = layer_find_so (name, what, kind == LAYER_PLUGIN ? "plugins" : "filters",
                             blkd_dir, nbdkit_dir);
  if (!*filename) {
    fprintf (stderr, "blkd: %s '%s' not found (looked in the tree, %s and %s)\n",
             what, name, blkd_dir, nbdkit_dir);
    return NULL;
  }
  /* RTLD_NOW: a layer importing a function blkd lacks must fail here,
   * naming it, not crash on its first call (the imports are lazy
   * JUMP_SLOTs). */
  *dl = dlopen (*filename, RTLD_NOW | RTLD_GLOBAL);
  if (!*dl) {
    fprintf (stderr, "blkd: cannot load %s %s: %s\n", what, *filename, dlerror ());
    return NULL;
  }
  const char *sym = kind == LAYER_PLUGIN ? "plugin_init" : "filter_init";
  void *init = dlsym (*dl, sym);
  if (!init)
    fprintf (stderr, "blkd: %s is not an nbdkit %s (no %s)\n", *filename, what, sym);
  return init;
}
