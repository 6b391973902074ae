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
 * Struct layouts are those of NVIDIA's nvml.h for the versioned functions (gpu-facts.md). */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
struct state {
  int init, memv2;
  unsigned ngpus, nprocs;
  struct gpu gpus[MAX_GPUS];
  struct proc procs[MAX_PROCS];
};

static int g_init_count;
/* Stable addresses handed out as device handles: handle i points at g_handles[i]. */
static char g_handles[MAX_GPUS];

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
    }
  }
  fclose(f);
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
