/* A fake libnvidia-ml.so.1 for tests on hosts without GPUs: it exports the versioned NVML
 * symbols lib/gpu uses and answers from a text file named by $FAKE_NVML_STATE, re-read at every
 * call so that a test can change memory use and processes while the code under test polls.
 *
 * State file, one directive a line ('#' starts a comment; absent file or variable: one call
 * answers NVML_ERROR_UNKNOWN):
 *   init CODE                        nvmlInit_v2's answer (0: success; 9: Driver Not Loaded)
 *   memv2 CODE                       nvmlDeviceGetMemoryInfo_v2's answer when not 0
 *   gpu UUID TOTAL USED FREE RESERVED NAME...   one GPU, in index order; bytes
 *   proc GPU_INDEX PID USED          a compute process on that GPU; USED "na": not available
 *   proc_error GPU_INDEX CODE        the process list of that GPU fails with CODE
 *   procs DIR                        processes that stand-in servers report (at most 4 such lines):
 *                                    each file DIR/PID (the name all digits) has lines
 *                                    `gpu UUID BYTES` (UUID `*`: every GPU) and optionally
 *                                    `linger SECONDS` and `pidns pid:[INODE]` (the writer's
 *                                    readlink of /proc/self/ns/pid).
 * A process of a `procs` folder counts (BYTES added to each of its GPUs' used memory, taken from
 * their free memory, and listed with its PID in their process lists, after the `proc` lines)
 * while /proc/PID exists and is no zombie, so the fake follows the servers, not the test: it
 * reads /proc of the PID namespace it is loaded in, which must be the servers' (with a `pidns`
 * line, a reader in another namespace ignores the file and leaves it alone). With `linger`, it
 * still counts until SECONDS after the fake first saw it gone, as the memory of a worker that
 * outlives its parent does. The fake appends `gone_at EPOCH_SECONDS` to the file when it first
 * sees the process gone (the first such line counts, and a later process with that PID does not
 * revive the file; when the file is not writable, each process that loads the fake remembers it
 * instead). A file whose process is gone and whose linger (if any) is over is ignored, and
 * deleted when this process may delete it. Files whose name is not all digits (a writer's
 * temporary file, to be renamed into place) are ignored.
 * Struct layouts are those of NVIDIA's nvml.h for the versioned functions (gpu-facts.md). */

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;

typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_v3_t;

enum {
  SUCCESS = 0,
  ERROR_UNINITIALIZED = 1,
  ERROR_INVALID_ARGUMENT = 2,
  ERROR_INSUFFICIENT_SIZE = 7,
  ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCS 1024

struct gpu {
  char uuid[96], name[96];
  unsigned long long total, used, free, reserved;
  int proc_error;
};
struct proc {
  unsigned gpu, pid;
  unsigned long long used;
};
#define MAX_PROC_DIRS 4
struct state {
  int init, memv2;
  unsigned ngpus, nprocs, ndirs;
  struct gpu gpus[MAX_GPUS];
  struct proc procs[MAX_PROCS];
  char dirs[MAX_PROC_DIRS][256];
};

static int g_init_count;
/* Stable addresses handed out as device handles: handle i points at g_handles[i]. */
static char g_handles[MAX_GPUS];

/* --- processes reported by stand-in servers (the `procs` directive) --------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Whether process `pid` of this PID namespace runs: /proc/PID/stat exists and its state, after
 * the last ')' of the command name, is no zombie (Z) or dead (X). */
static int process_runs(unsigned pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%u/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* paren = strrchr(buf, ')');
  if (!paren || paren[1] != ' ') return 1;
  return paren[2] != 'Z' && paren[2] != 'X';
}

/* When this process first saw the process of an unwritable file gone, by the file's identity. */
#define MAX_REMEMBERED 256
static struct {
  dev_t dev;
  ino_t ino;
  double gone_at;
} g_gone[MAX_REMEMBERED];
static unsigned g_ngone;

static int remembered_gone(const struct stat* st, double* gone_at) {
  for (unsigned i = 0; i < g_ngone; ++i) {
    if (g_gone[i].dev == st->st_dev && g_gone[i].ino == st->st_ino) {
      *gone_at = g_gone[i].gone_at;
      return 1;
    }
  }
  return 0;
}

/* Records that the process of `path` is gone as of `at`: in the file, else in memory. */
static void record_gone(const char* path, const struct stat* st, double at) {
  FILE* f = fopen(path, "a");
  if (f && fprintf(f, "gone_at %.6f\n", at) > 0 && fclose(f) == 0) return;
  if (f) fclose(f);
  if (g_ngone < MAX_REMEMBERED) {
    g_gone[g_ngone].dev = st->st_dev;
    g_gone[g_ngone].ino = st->st_ino;
    g_gone[g_ngone].gone_at = at;
    ++g_ngone;
  }
}

/* What one DIR/PID file says. */
struct reported {
  unsigned ngpus;
  char uuids[MAX_GPUS][96];
  unsigned long long bytes[MAX_GPUS];
  double linger, gone_at;
  int gone;
  char pidns[64];
};

/* This process's PID namespace as readlink(/proc/self/ns/pid) names it: "pid:[4026531836]". */
static const char* own_pidns(void) {
  static char ns[64];
  if (!ns[0]) {
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = '\0';
  }
  return ns;
}

static int read_reported(const char* path, struct reported* r) {
  memset(r, 0, sizeof *r);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    double v = 0;
    if (r->ngpus < MAX_GPUS && sscanf(line, "gpu %95s %llu", r->uuids[r->ngpus], &r->bytes[r->ngpus]) == 2) {
      ++r->ngpus;
    } else if (sscanf(line, "linger %lf", &v) == 1) {
      r->linger = v;
    } else if (sscanf(line, "pidns %63s", r->pidns) == 1) {
    } else if (!r->gone && sscanf(line, "gone_at %lf", &v) == 1) {
      r->gone = 1;
      r->gone_at = v;
    }
  }
  fclose(f);
  return 1;
}

/* Whether the process of DIR/PID counts now; deletes the file of one that no longer will. */
static int still_counts(const char* path, unsigned pid, struct reported* r) {
  struct stat st;
  if (stat(path, &st) != 0 || !read_reported(path, r)) return 0;
  /* A reader in another PID namespace cannot tell whether the writer runs: it leaves the file be. */
  if (r->pidns[0] && strcmp(r->pidns, own_pidns()) != 0) return 0;
  if (!r->gone) r->gone = remembered_gone(&st, &r->gone_at);
  if (!r->gone && process_runs(pid)) return 1;
  if (!r->gone) {
    r->gone = 1;
    r->gone_at = now_s();
    record_gone(path, &st, r->gone_at); /* so a later process with this PID does not revive it */
  }
  if (now_s() < r->gone_at + r->linger) return 1;
  unlink(path); /* may fail (another user's folder): the file is ignored all the same */
  return 0;
}

static void add_reported(struct state* s, unsigned pid, const struct reported* r) {
  for (unsigned k = 0; k < r->ngpus; ++k) {
    for (unsigned i = 0; i < s->ngpus && s->nprocs < MAX_PROCS; ++i) {
      struct gpu* g = &s->gpus[i];
      if (strcmp(r->uuids[k], "*") != 0 && strcmp(r->uuids[k], g->uuid) != 0) continue;
      g->used += r->bytes[k];
      g->free = g->free > r->bytes[k] ? g->free - r->bytes[k] : 0;
      s->procs[s->nprocs].gpu = i;
      s->procs[s->nprocs].pid = pid;
      s->procs[s->nprocs].used = r->bytes[k];
      ++s->nprocs;
    }
  }
}

static int by_number(const void* a, const void* b) {
  unsigned x = *(const unsigned*)a, y = *(const unsigned*)b;
  return x < y ? -1 : x > y;
}

/* Adds the processes of `dir` that count now, in PID order. */
static void load_reported(struct state* s, const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return;
  unsigned pids[MAX_PROCS], n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && n < MAX_PROCS) {
    const char* name = e->d_name;
    if (!*name || strspn(name, "0123456789") != strlen(name) || strlen(name) > 9) continue;
    pids[n++] = (unsigned)strtoul(name, NULL, 10);
  }
  closedir(d);
  qsort(pids, n, sizeof pids[0], by_number);
  for (unsigned i = 0; i < n; ++i) {
    char path[512];
    struct reported r;
    snprintf(path, sizeof path, "%s/%u", dir, pids[i]);
    if (still_counts(path, pids[i], &r)) add_reported(s, pids[i], &r);
  }
}

static int load(struct state* s) {
  memset(s, 0, sizeof *s);
  const char* path = getenv("FAKE_NVML_STATE");
  FILE* f = path ? fopen(path, "r") : NULL;
  if (!f) return 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char* hash = strchr(line, '#');
    if (hash) *hash = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    char word[32] = {0};
    int off = 0;
    if (sscanf(line, "%31s%n", word, &off) != 1) continue;
    const char* rest = line + off;
    if (strcmp(word, "init") == 0) {
      sscanf(rest, "%d", &s->init);
    } else if (strcmp(word, "memv2") == 0) {
      sscanf(rest, "%d", &s->memv2);
    } else if (strcmp(word, "gpu") == 0 && s->ngpus < MAX_GPUS) {
      struct gpu* g = &s->gpus[s->ngpus];
      int n = 0;
      if (sscanf(rest, " %95s %llu %llu %llu %llu %n", g->uuid, &g->total, &g->used, &g->free, &g->reserved, &n) >= 5) {
        snprintf(g->name, sizeof g->name, "%s", rest + n);
        ++s->ngpus;
      }
    } else if (strcmp(word, "proc") == 0 && s->nprocs < MAX_PROCS) {
      struct proc* p = &s->procs[s->nprocs];
      char used[32] = {0};
      if (sscanf(rest, "%u %u %31s", &p->gpu, &p->pid, used) == 3) {
        p->used = strcmp(used, "na") == 0 ? ~0ULL : strtoull(used, NULL, 10);
        ++s->nprocs;
      }
    } else if (strcmp(word, "proc_error") == 0) {
      unsigned idx = 0;
      int code = 0;
      if (sscanf(rest, "%u %d", &idx, &code) == 2 && idx < MAX_GPUS) s->gpus[idx].proc_error = code;
    } else if (strcmp(word, "procs") == 0 && s->ndirs < MAX_PROC_DIRS) {
      if (sscanf(rest, " %255s", s->dirs[s->ndirs]) == 1) ++s->ndirs;
    }
  }
  fclose(f);
  /* After the whole file: the GPUs a reported UUID names are known only then. */
  for (unsigned i = 0; i < s->ndirs; ++i) load_reported(s, s->dirs[i]);
  return 1;
}

/* The GPU a handle names, or NULL when it names none in the current state. */
static struct gpu* lookup(struct state* s, nvmlDevice_t dev) {
  long i = (char*)dev - g_handles;
  if (i < 0 || i >= (long)s->ngpus) return NULL;
  return &s->gpus[i];
}

EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 12: return "No permission";
    case 15: return "GPU is lost";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
  }
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
  struct state s;
  if (!load(&s)) return ERROR_UNKNOWN;
  if (s.init != 0) return s.init;
  ++g_init_count;
  return SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
  if (g_init_count == 0) return ERROR_UNINITIALIZED;
  --g_init_count;
  return SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!count) return ERROR_INVALID_ARGUMENT;
  if (!load(&s)) return ERROR_UNKNOWN;
  *count = s.ngpus;
  return SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* dev) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  if (!dev || index >= s.ngpus) return ERROR_INVALID_ARGUMENT;
  *dev = (nvmlDevice_t)&g_handles[index];
  return SUCCESS;
}

static nvmlReturn_t copy_string(const char* value, char* out, unsigned length) {
  if (!out) return ERROR_INVALID_ARGUMENT;
  if (strlen(value) + 1 > length) return ERROR_INSUFFICIENT_SIZE;
  strcpy(out, value);
  return SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char* uuid, unsigned length) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  struct gpu* g = lookup(&s, dev);
  return g ? copy_string(g->uuid, uuid, length) : ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char* name, unsigned length) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  struct gpu* g = lookup(&s, dev);
  return g ? copy_string(g->name, name, length) : ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* mem) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  struct gpu* g = lookup(&s, dev);
  if (!g || !mem) return ERROR_INVALID_ARGUMENT;
  mem->total = g->total;
  mem->used = g->used;
  mem->free = g->free;
  return SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* mem) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  struct gpu* g = lookup(&s, dev);
  if (!g || !mem) return ERROR_INVALID_ARGUMENT;
  if (mem->version != (unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24))) return ERROR_ARGUMENT_VERSION_MISMATCH;
  if (s.memv2 != 0) return s.memv2;
  mem->total = g->total;
  mem->reserved = g->reserved;
  mem->used = g->used > g->reserved ? g->used - g->reserved : 0;
  mem->free = g->free;
  return SUCCESS;
}

/* As NVML does: when the buffer is too small, *count becomes the number needed and
 * NVML_ERROR_INSUFFICIENT_SIZE is returned with nothing written. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned* count,
                                                            nvmlProcessInfo_v3_t* infos) {
  struct state s;
  if (!g_init_count) return ERROR_UNINITIALIZED;
  if (!load(&s)) return ERROR_UNKNOWN;
  struct gpu* g = lookup(&s, dev);
  if (!g || !count) return ERROR_INVALID_ARGUMENT;
  if (g->proc_error) return g->proc_error;
  unsigned index = (unsigned)(g - s.gpus), n = 0;
  for (unsigned i = 0; i < s.nprocs; ++i) n += s.procs[i].gpu == index;
  if (n > *count) {
    *count = n;
    return ERROR_INSUFFICIENT_SIZE;
  }
  if (n > 0 && !infos) return ERROR_INVALID_ARGUMENT;
  unsigned k = 0;
  for (unsigned i = 0; i < s.nprocs; ++i) {
    if (s.procs[i].gpu != index) continue;
    infos[k].pid = s.procs[i].pid;
    infos[k].usedGpuMemory = s.procs[i].used;
    /* Distinct values in the fields a v1 reader would take for the next pid. */
    infos[k].gpuInstanceId = 0xFFFFFFFFu;
    infos[k].computeInstanceId = 0xFFFFFFFEu;
    ++k;
  }
  *count = n;
  return SUCCESS;
}
