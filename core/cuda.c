/* The CUDA backend's loader (see cuda.h): finds flow_cuda.so, loads it on first CUDA use and answers
 * for it; without it (a CPU build, a missing or broken plugin, no GPU) a stand-in device says why. */
#define _GNU_SOURCE /* dladdr */
#include "cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

bool flow_cuda_allow_tf32 = false;

static flow_cuda_backend backend = {.reason = "this build has no CUDA support"};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static void (*on_loaded)(bool available);

/* ---- stand-in device: every call explains why there is no CUDA ------------------------------ */

static int absent(void) { return flow_error_set("cuda is not available (%s)", backend.reason); }
static void *absent_alloc(int index, size_t nbytes) {
  (void)index; (void)nbytes;
  absent();
  return NULL;
}
static void absent_free(int index, void *p, size_t nbytes) { (void)index; (void)p; (void)nbytes; }
static int absent_copy(void *dst, flow_device dd, const void *src, flow_device sd, size_t n) {
  (void)dst; (void)dd; (void)src; (void)sd; (void)n;
  return absent();
}
static int absent_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, flow_device dev) {
  (void)dst; (void)dp; (void)src; (void)sp; (void)w; (void)h; (void)dev;
  return absent();
}
static int absent_zero(void *p, flow_device dev, size_t n) { (void)p; (void)dev; (void)n; return absent(); }
static int absent_sync(int index) { (void)index; return absent(); }
static const flow_device_impl absent_impl = {absent_alloc, absent_free, absent_copy, absent_copy2d, absent_zero,
                                             absent_sync};

/* ---- finding and opening the plugin ----------------------------------------------------------
 * FLOW_CUDA_PLUGIN names the file; else it is FLOW_CUDA_PLUGIN_FILE next to the file holding this
 * code (flowlua or flow.so, in the build folder or installed), or FLOW_CUDA_PLUGIN_FROM_BIN from
 * an installed flowlua's folder. */

#ifdef FLOW_HAVE_CUDA

/* The folder of the executable or shared object holding the core, into dir (empty if unknown).
 * A flow.so that the host opened with RTLD_LOCAL (lua5.4's require) is made global, so the plugin
 * can call the core; an executable exports its symbols already (-rdynamic). */
static void core_dir(char *dir, size_t n) {
  char path[PATH_MAX] = "";
  Dl_info info;
  dir[0] = 0;
  if (dladdr((void *)flow_cuda_init, &info) && info.dli_fname &&
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
    if (!realpath(info.dli_fname, path)) return;
  } else {
    ssize_t k = readlink("/proc/self/exe", path, sizeof path - 1);
    if (k <= 0) return;
    path[k] = 0;
  }
  char *slash = strrchr(path, '/');
  if (!slash) return;
  *slash = 0;
  snprintf(dir, n, "%s", path);
}

static void load(void) {
  char dir[PATH_MAX], tried[2][PATH_MAX + 64];
  int ntried = 0;
  const char *env = getenv("FLOW_CUDA_PLUGIN");
  core_dir(dir, sizeof dir);
  if (env && *env) {
    snprintf(tried[ntried++], sizeof tried[0], "%s", env);
  } else if (dir[0]) {
    snprintf(tried[ntried++], sizeof tried[0], "%s/%s", dir, FLOW_CUDA_PLUGIN_FILE);
    snprintf(tried[ntried++], sizeof tried[0], "%s/%s/%s", dir, FLOW_CUDA_PLUGIN_FROM_BIN, FLOW_CUDA_PLUGIN_FILE);
  }
  const char *path = NULL;
  for (int i = 0; i < ntried && !path; i++)
    if (access(tried[i], F_OK) == 0) path = tried[i];
  if (!path) {
    snprintf(backend.reason, sizeof backend.reason, "the CUDA plugin %s was not found (looked for %.200s%s%.200s; "
             "FLOW_CUDA_PLUGIN names the file)", FLOW_CUDA_PLUGIN_FILE, ntried ? tried[0] : "its folder",
             ntried > 1 ? " and " : "", ntried > 1 ? tried[1] : "");
    return;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(backend.reason, sizeof backend.reason, "loading the CUDA plugin: %.400s", dlerror());
    return;
  }
  flow_cuda_plugin_open_fn open = (flow_cuda_plugin_open_fn)dlsym(h, FLOW_CUDA_PLUGIN_ENTRY);
  flow_cuda_backend b = {0};
  if (!open) {
    snprintf(backend.reason, sizeof backend.reason, "%.300s is not a flowlua CUDA plugin (no %s)", path,
             FLOW_CUDA_PLUGIN_ENTRY);
  } else if (open(FLOW_CUDA_PLUGIN_ABI, &b) != 0) {
    snprintf(backend.reason, sizeof backend.reason, "the CUDA plugin %.200s: %.250s", path, flow_error_get());
  } else {
    backend = b;
    if (!backend.device_count && !backend.reason[0]) snprintf(backend.reason, sizeof backend.reason, "no GPU found");
  }
}

#else
static void load(void) {}
#endif

static void load_once(void) {
  load();
  if (backend.device_count <= 0) backend.device_count = 0;
  if (on_loaded) on_loaded(backend.device_count > 0);
  flow_device_register(FLOW_CUDA, backend.device_count ? backend.device : &absent_impl);
  loaded = true;
}

void flow_cuda_init(void) { pthread_once(&once, load_once); }

void flow_cuda_install(void (*fn)(bool available)) {
  on_loaded = fn;
  flow_device_set_loader(FLOW_CUDA, flow_cuda_init);
}

bool flow_cuda_loaded(void) { return loaded; }

const flow_cuda_backend *flow_cuda_backend_get(void) {
  flow_cuda_init();
  return backend.device_count ? &backend : NULL;
}

bool flow_cuda_is_available(void) { return flow_cuda_backend_get() != NULL; }
int flow_cuda_device_count(void) { flow_cuda_init(); return backend.device_count; }

const char *flow_cuda_unavailable_reason(void) {
  flow_cuda_init();
  return backend.reason;
}

bool flow_cuda_driver_present(void) {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;  /* Linux, WSL2 */
}
